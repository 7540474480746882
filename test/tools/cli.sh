#!/usr/bin/env bash
# The command-line tools: exit codes and messages for good and bad input.
# usage: cli.sh BUILD_DIR
set -u
bin=$1/tools
fails=0
check() { # name, condition...
	local name=$1
	shift
	if "$@"; then echo "ok - $name"; else echo "not ok - $name"; fails=$((fails + 1)); fi
}
lacks() { ! grep -q "$@"; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$bin/tfab-info" --json >"$out/json"
check "tfab-info --json is JSON with settings" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["version"] and d["settings"] and {b["name"] for b in d["backends"]} == {"ofi", "verbs", "shm"}
' "$out/json"
usable=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["fabrics"]))' "$out/json")
if [ "$usable" -gt 0 ]; then
	# What a context would open: a usable fabric, named even when TFAB_PROVIDER is auto.
	check "tfab-info --json: the fabric auto selects" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
s = d["selected"]
assert s["fabric"] and s["domain"], s
assert any((f["backend"], f["fabric"], f["domain"]) == (s["backend"], s["fabric"], s["domain"])
           for f in d["fabrics"]), s
' "$out/json"
fi

"$bin/tfab-info" >"$out/info" 2>"$out/err"
rc=$?
check "tfab-info lists every setting" grep -q 'TFAB_OFI_CQ_SIZE=4096' "$out/info"
if [ "$usable" -gt 0 ]; then
	check "tfab-info exits 0" [ $rc = 0 ]
	check "tfab-info lists a usable fabric" grep -qE '^  (ofi|verbs) +[a-z]' "$out/info"
	choices='usable on this machine: [a-z]'
else
	# A build without backends, or a machine without fabrics, says so and fails.
	check "tfab-info fails with no usable fabric" [ $rc != 0 ]
	check "... and says so" grep -q 'no usable fabric' "$out/err"
	choices='usable on this machine: none'
fi

TFAB_PROVIDER=nonsense "$bin/tfab-info" >/dev/null 2>"$out/err"
check "TFAB_PROVIDER=nonsense tfab-info fails" [ $? != 0 ]
check "... naming the choices" grep -q 'Choices: auto, verbs, ofi' "$out/err"
check "... and what is usable here" grep -q "$choices" "$out/err"

# An invalid log level is a warning with a fallback to warn, said once, not an error too.
TFAB_LOG_LEVEL=loud "$bin/tfab-info" >/dev/null 2>"$out/err"
check "TFAB_LOG_LEVEL=loud tfab-info runs" [ $? = 0 ]
check "... and warns once that it uses warn" [ "$(grep -c 'TFAB_LOG_LEVEL=loud is not a level' "$out/err")" = 1 ]
check "... and nothing else about it" [ "$(grep -c 'TFAB_LOG_LEVEL' "$out/err")" = 1 ]

TFAB_OFI_CQ_SIZE=abc "$bin/tfab-info" >"$out/info" 2>"$out/err"
check "a bad setting fails tfab-info" [ $? != 0 ]
check "... naming the variable" grep -q 'TFAB_OFI_CQ_SIZE=abc' "$out/err"
# shown as given and invalid, not as the default that stands in for it
check "... listed as invalid, with the default used" grep -qF \
	"TFAB_OFI_CQ_SIZE='abc' (invalid: not a valid uint value: Invalid argument; using the default 4096)" \
	"$out/info"
check "... and not as if it were the default" lacks -q 'TFAB_OFI_CQ_SIZE=4096' "$out/info"
TFAB_OFI_CQ_SIZE=8 "$bin/tfab-info" --json >"$out/json" 2>/dev/null
check "... and in --json: given, invalid, the value used" python3 -c '
import json, sys
s = {x["name"]: x for x in json.load(open(sys.argv[1]))["settings"]}
c = s["TFAB_OFI_CQ_SIZE"]
assert (c["given"], c["value"], c["invalid"]) == ("8", "4096", "out of range (16..1048576)"), c
assert s["TFAB_RING_SLOTS"]["invalid"] is None and s["TFAB_RING_SLOTS"]["given"] is None
' "$out/json"
secret=$(printf 's%.0s' $(seq 300))
TFAB_AUTH_KEY=$secret "$bin/tfab-info" >"$out/info" 2>"$out/err"
check "a refused secret is named, never shown" grep -q "TFAB_AUTH_KEY='(set)' (invalid: longer than 255 bytes" "$out/info"
check "... in the listing or the error" lacks -q sssssss "$out/info" "$out/err"

# A TFAB_* variable no setting knows: a warning, once, naming the setting meant.
TFAB_OP_TIMOUT_MS=5 "$bin/tfab-info" >/dev/null 2>"$out/err"
check "a misspelt setting is warned about once" \
	[ "$(grep -c 'TFAB_OP_TIMOUT_MS is not a tfab setting' "$out/err")" = 1 ]
check "... naming the one meant" grep -q 'ignored (did you mean TFAB_OP_TIMEOUT_MS?)' "$out/err"
TFAB_BOGUS=1 "$bin/tfab-info" >/dev/null 2>"$out/err"
check "an unknown one with none near is warned about too" \
	grep -q 'TFAB_BOGUS is not a tfab setting: ignored (tfab-info lists the settings)' "$out/err"
TFAB_RANK=0 TFAB_WORLD_SIZE=1 TFAB_TEST_STALL_MS=1 TFAB_FAULTS_SLACK_MS=1 TFAB_PY_LOOP=1 \
	"$bin/tfab-info" >/dev/null 2>"$out/err"
check "the project's own variables are not warned about" lacks -q 'not a tfab setting' "$out/err"

# A short TFAB_AUTH_KEY, or a short key in TFAB_AUTH_KEY_FILE, fails tfab-info as it fails a
# context: the setting named with the minimum, the key never shown.
TFAB_AUTH_KEY=tiny-secret "$bin/tfab-info" >"$out/info" 2>"$out/err"
check "a short TFAB_AUTH_KEY fails tfab-info" [ $? != 0 ]
check "... naming the setting and the minimum" \
	grep -q 'TFAB_AUTH_KEY holds 11 bytes: a key needs at least 16' "$out/err"
check "... and not the key" lacks -r 'tiny-secret' "$out/info" "$out/err"
printf 'tiny-secret\n' >"$out/key"
TFAB_AUTH_KEY_FILE=$out/key "$bin/tfab-info" >/dev/null 2>"$out/err"
check "a short key in TFAB_AUTH_KEY_FILE fails tfab-info" [ $? != 0 ]
check "... naming the file and the minimum" \
	grep -q "TFAB_AUTH_KEY_FILE=$out/key holds 11 bytes: a key needs at least 16" "$out/err"
TFAB_AUTH_KEY=0123456789abcdef "$bin/tfab-info" >"$out/info" 2>/dev/null
check "a key of 16 bytes is taken, shown as (set)" grep -q '^  TFAB_AUTH_KEY=(set) \[set\]' "$out/info"

# The verbs backend: built or not, with a usable device or not, tfab-info and a forced
# TFAB_PROVIDER=verbs say which, and why.
verbs=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
built = [b["built"] for b in d["backends"] if b["name"] == "verbs"][0]
print("device" if any(f["backend"] == "verbs" for f in d["fabrics"]) else
      "nodevice" if built else "notbuilt")
' "$out/json")
case $verbs in
notbuilt)
	check "tfab-info: verbs not built in" grep -q '^  verbs  not built in$' "$out/info"
	verbs_err='that backend is not built into this tfab'
	;;
nodevice)
	check "tfab-info: verbs built in, no usable device, and why" \
		grep -qE '^  verbs  built in, no usable device \(.+\)$' "$out/info"
	check "tfab-info --json: why verbs has no device" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert [b["note"] for b in d["backends"] if b["name"] == "verbs"][0]
' "$out/json"
	verbs_err='that backend finds no usable device or provider here ([^)]'
	;;
device)
	check "tfab-info: verbs built in with a device" grep -q '^  verbs  built in$' "$out/info"
	check "... listed as a usable fabric" grep -qE '^  verbs +[a-z]' "$out/info"
	# auto: the same-host path (shm) first, then verbs as the network path.
	check "... and a path of TFAB_PROVIDER=auto" grep -qE '^  [0-9]+\. verbs ' "$out/info"
	TFAB_PROVIDER=verbs "$bin/tfab-info" >"$out/sel" 2>/dev/null
	check "TFAB_PROVIDER=verbs tfab-info selects verbs" grep -q '^Selected: verbs$' "$out/sel"
	TFAB_PROVIDER=verbs TFAB_VERBS_GID_INDEX=250 "$bin/tfab-info" >/dev/null 2>"$out/err"
	check "TFAB_VERBS_GID_INDEX naming an empty entry fails" [ $? != 0 ]
	check "... saying so" grep -q 'TFAB_VERBS_GID_INDEX=250: [a-z0-9_]* port 1 has no such GID' \
		"$out/err"
	;;
esac
if [ "$verbs" != device ]; then
	TFAB_PROVIDER=verbs timeout 60 "$bin/tfab-perf" raw -s 8 -n 4 >/dev/null 2>"$out/err"
	check "TFAB_PROVIDER=verbs tfab-perf raw fails without a device" [ $? != 0 ]
	check "... saying why" grep -q "TFAB_PROVIDER=verbs: $verbs_err" "$out/err"
	if [ "$verbs" = nodevice ] && [ ! -e /sys/class/infiniband_verbs ]; then
		check "... in verbs' own words" \
			grep -q '(no RDMA device: this kernel has no RDMA support' "$out/err"
	fi
	check "... naming the choices" grep -q "$choices" "$out/err"
	TFAB_PROVIDER=auto "$bin/tfab-info" >"$out/sel" 2>/dev/null
	check "TFAB_PROVIDER=auto does not select verbs" lacks '^Selected: verbs' "$out/sel"
fi
TFAB_PROVIDER=verbs TFAB_VERBS_DEVICE=nosuchdev0 "$bin/tfab-info" >/dev/null 2>"$out/err"
check "TFAB_VERBS_DEVICE naming no device fails" [ $? != 0 ]
if [ "$verbs" = device ]; then
	check "... naming the devices there are" \
		grep -q 'TFAB_VERBS_DEVICE=nosuchdev0 matches no device; there are: ' "$out/err"
fi

"$bin/tfab-perf" --help >"$out/help"
check "tfab-perf --help exits 0" [ $? = 0 ]
check "... naming the tests memcpy, raw, tensor, all and allreduce" \
	grep -q '^usage: tfab-perf \[memcpy|raw|tensor|all|allreduce\] ' "$out/help"
check "... and every option with its default" python3 -c '
import re, sys
opts, cur = {}, None
for line in open(sys.argv[1]):
    m = re.match(r" +(?:-\w, )?(--[a-z-]+)", line)
    if m:
        cur = m.group(1)
        opts[cur] = line
    elif cur and line.startswith(" " * 23):
        opts[cur] += line
    else:
        cur = None
opts = {k: " ".join(v.split()) for k, v in opts.items()}
want = {
    "--sizes": "(default 8,4K,64K,1M,64M)",
    "--iters": "(default about 2 GiB per size, at least 32 and at most 100000)",
    "--window": "(default 16, but at most 256 MiB and at least 2 in flight; tensor: at most 64); "
                "memcpy: destinations copied into in turn (default 1, at most 256 MiB of them)",
    "--provider": "(default: TFAB_PROVIDER from the environment, else auto)",
    "--verify": "(default off)",
    "--heap-dst": "(default off)",
    "--no-request": "(default off)",
    "--device": "cpu (default)",
    "--timeout": "(default 120000)",
    "--json": "(default: a table)",
    "--listen": "(default: a local pair)",
    "--connect": "",
    "--ranks": "(default 4, at most 1024)",
    "--footprint": "connected (means) (default off)",
    "--request-bytes": "(at most 1024; default 0: none)",
    "--breakdown": "tfab_recv, and the tool",
    "--help": "",
}
assert set(opts) == set(want), sorted(opts)
for o, w in want.items():
    assert w in opts[o], (o, opts[o])
assert re.search(r"^ +all +memcpy, raw, then tensor \(the default\)$", open(sys.argv[1]).read(), re.M)
' "$out/help"
"$bin/tfab-perf" --sizes 1X >/dev/null 2>&1
check "tfab-perf rejects a bad size" [ $? = 2 ]
"$bin/tfab-perf" raw --request-bytes 1025 >/dev/null 2>&1
check "tfab-perf rejects a request size over 1 KiB" [ $? = 2 ]
"$bin/tfab-perf" nosuchtest >/dev/null 2>&1
check "tfab-perf rejects an unknown test" [ $? = 2 ]
"$bin/tfab-perf" -p bogus -s 8 -n 2 >/dev/null 2>"$out/err"
check "tfab-perf -p bogus fails cleanly" [ $? = 1 ]
check "... saying why once" [ "$(grep -c 'TFAB_PROVIDER=bogus: not a known choice' "$out/err")" = 1 ]
TFAB_PROVIDER=bogus "$bin/tfab-perf" -s 8 -n 2 >/dev/null 2>"$out/err"
check "TFAB_PROVIDER=bogus tfab-perf fails, saying why once" \
	[ "$(grep -c 'TFAB_PROVIDER=bogus: not a known choice' "$out/err")" = 1 ]

# memcpy alone needs no fabric: an unknown provider and a bad setting do not matter to it.
TFAB_PROVIDER=bogus TFAB_OFI_CQ_SIZE=abc FI_PROVIDER=none "$bin/tfab-perf" memcpy -s 8,1M \
	--verify --json >"$out/memcpy" 2>"$out/err"
check "tfab-perf memcpy --verify runs without a fabric" [ $? = 0 ]
check "... quietly" [ ! -s "$out/err" ]
check "... a verified row per size, with the default iterations" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["test"], r["backend"], r["bytes"], r["iters"], r["window"], r["verified"])
        for r in rows] == [("memcpy", "memcpy", 8, 100000, 1, True),
                           ("memcpy", "memcpy", 1 << 20, 2048, 1, True)], rows
for r in rows:
    assert r["GBps"] > 0 and abs(r["gbps"] - 8 * r["GBps"]) < 0.01, r
    # lat_us is the time of one copy: bytes over the bandwidth
    assert r["lat_us"] > 0 and abs(r["lat_us"] - r["bytes"] * 8 / r["gbps"] / 1000) \
        <= 0.001 + 0.01 * r["lat_us"], r
    # rate: copies per second, the bandwidth over the size
    assert r["rate"] > 0 and (r["bytes"] == 0 or
                              abs(r["rate"] * r["bytes"] - r["GBps"] * 1e9) <= 0.01 * r["rate"] * r["bytes"]), r
' "$out/memcpy"
"$bin/tfab-perf" memcpy -s 4K -n 10 >"$out/memcpy" 2>&1
check "tfab-perf memcpy prints a table" grep -q '^tfab-perf memcpy: one thread' "$out/memcpy"
check "... with a row of 4096 bytes, 10 copies, 1 at a time" \
	grep -qE '^ +4096 +10 +1 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +-$' "$out/memcpy"
"$bin/tfab-perf-damaged" memcpy -s 8,0 -n 10 --verify --json >"$out/damaged" 2>"$out/err"
check "tfab-perf memcpy --verify fails on a spoiled copy" [ $? = 1 ]
check "... reporting which sizes" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["verified"] for r in rows] == [False, True], rows
' "$out/damaged"
check "... and saying so" grep -q 'the 8-byte copy differs from its source' "$out/err"
# -w: copies into that many destinations in turn, each checked, at most 256 MiB of them.
"$bin/tfab-perf" memcpy -s 4K,64M -w 5 -n 12 --verify --json >"$out/memcpy" 2>"$out/err"
check "tfab-perf memcpy -w 5 --verify copies into 5 destinations in turn" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["bytes"], r["iters"], r["window"], r["verified"]) for r in rows] == \
    [(4096, 12, 5, True), (64 << 20, 12, 4, True)], rows
' "$out/memcpy"
# 1 warm-up and 11 timed copies into 3 destinations: the last copy, the spoiled one, went
# into the second destination, which --verify must check too.
"$bin/tfab-perf-damaged" memcpy -s 4K -w 3 -n 11 --verify --json >"$out/damaged" 2>"$out/err"
check "tfab-perf memcpy -w 3 --verify finds a spoiled copy in a later destination" [ $? = 1 ]
"$bin/tfab-perf" memcpy --connect 127.0.0.1:1 >/dev/null 2>"$out/err"
check "tfab-perf memcpy --connect is refused" [ $? = 2 ]
check "... saying why" grep -q 'memcpy runs in one process' "$out/err"
"$bin/tfab-perf" memcpy,nosuchtest >/dev/null 2>"$out/err"
check "tfab-perf rejects an unknown test in a list" [ $? = 2 ]
check "... naming it" grep -q "unknown test 'nosuchtest'" "$out/err"

# allreduce: local ranks of a world, every result checked; it runs alone.
"$bin/tfab-perf" allreduce --ranks 3 -s 8,300K --verify --json -n 20 >"$out/ar" 2>"$out/err"
check "tfab-perf allreduce --ranks 3 --verify exits 0" [ $? = 0 ]
check "... a verified row per size, with nccl-tests' fields" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["bytes"] for r in rows] == [8, 300 << 10], rows
for r in rows:
    assert r["test"] == "allreduce" and r["ranks"] == 3 and r["verified"] is True, r
    assert r["lat_us"] > 0 and abs(r["busbw_GBps"] - r["algbw_GBps"] * 4 / 3) < 1e-3, r
assert [r["algo"] for r in rows] == ["direct", "ring"], rows
' "$out/ar"
"$bin/tfab-perf" allreduce --ranks 3 -s 8 -n 10 --json --footprint >"$out/fp" 2>"$out/err"
check "tfab-perf allreduce --footprint exits 0" [ $? = 0 ]
check "... a row for the world after the sizes': its join, and per rank memory, fds and peers" \
	python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["test"] for r in rows] == ["allreduce", "world"], rows
w = rows[1]
assert w["ranks"] == 3 and w["peers"] == 2 and w["peers_max"] == 2, w
assert w["join_ms"] > 0 and w["rss_kb"] > 0 and w["fds"] >= 3, w
if w["path"] == "shm":
    assert w["shm_kb"] > 0, w  # the rings to the two peers
' "$out/fp"
"$bin/tfab-perf" allreduce,raw >/dev/null 2>"$out/err"
check "tfab-perf allreduce with another test is refused" [ $? = 2 ]
check "... saying why" grep -q 'allreduce runs alone' "$out/err"
"$bin/tfab-perf" allreduce --ranks 0 >/dev/null 2>"$out/err"
check "tfab-perf allreduce --ranks 0 is refused" [ $? = 2 ]

# Runs of both tests on a fabric named with -p: ofi:sockets where it is usable (auto would
# pick another, so the run shows that -p reaches the tensor test's engine), else the first
# usable fabric.
perf_p=$(python3 -c '
import json, sys
f = json.load(open(sys.argv[1]))["fabrics"]
names = [d["backend"] if d["backend"] != "ofi" else "ofi:" + d["fabric"].split(";")[0] for d in f]
print("ofi:sockets" if "ofi:sockets" in names else names[0] if names else "")
' "$out/json")
if [ -n "$perf_p" ]; then
	timeout 100 env -u FI_PROVIDER "$bin/tfab-perf" all -p "$perf_p" -s 8,4K -n 4 --json \
		--verify >"$out/all" 2>"$out/err"
	check "tfab-perf all -p $perf_p --verify exits 0" [ $? = 0 ]
	check "... every row verified, memcpy then raw then tensor" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [(r["test"], r["bytes"]) for r in rows] == [
    (t, b) for t in ("memcpy", "raw", "tensor") for b in (8, 4096)], rows
assert all(r["verified"] is True and r["iters"] == 4 for r in rows), rows
# every row has its rate, transfers (tensor: fetches) per second, the bandwidth over the size
assert all(r["rate"] > 0 and abs(r["rate"] * r["bytes"] - r["GBps"] * 1e9)
           <= 0.01 * r["rate"] * r["bytes"] + r["bytes"] for r in rows), rows
' "$out/all"
	# A local pair's engine contexts use the raw test's (loopback) domain.
	check "... its tensor rows on the raw rows' backend, fabric and domain" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
raw = [(r["backend"], r["fabric"], r["domain"]) for r in rows if r["test"] == "raw"]
tensor = [(r["backend"], r["fabric"], r["domain"]) for r in rows if r["test"] == "tensor"]
assert len(raw) == 2 and len(tensor) == 2 and len(set(raw + tensor)) == 1, (raw, tensor)
fabrics = json.load(open(sys.argv[2]))["fabrics"]
assert any((f["backend"], f["fabric"], f["domain"]) == raw[0] for f in fabrics), raw[0]
' "$out/all" "$out/json"

	# The raw ping-pong with a message each way per round, as the tensor test's requests: the
	# client waits for every one of the server's (it would time out, were any lost).
	timeout 100 env -u FI_PROVIDER "$bin/tfab-perf" raw -p "$perf_p" -s 8,4K -n 4 --json \
		--verify --request-bytes 1024 --timeout 20000 >"$out/requests" 2>"$out/err"
	check "tfab-perf raw --request-bytes 1024 --verify exits 0" [ $? = 0 ]
	check "... every row verified" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["bytes"] for r in rows] == [8, 4096] and all(r["verified"] for r in rows), rows
' "$out/requests"

	# --breakdown: each side says, per size, where its ping-pong's rounds went: one send a
	# round, at least one progress call that found work (a round receives), shares that add
	# up to the whole; the JSON rows as without it.
	timeout 100 env -u FI_PROVIDER "$bin/tfab-perf" tensor -p "$perf_p" -s 8,4K -n 50 --json \
		--breakdown --timeout 20000 >"$out/bd" 2>"$out/bd_err"
	check "tfab-perf tensor --breakdown exits 0" [ $? = 0 ]
	check "... a line per side and size, each adding up" python3 -c '
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["bytes"] for r in rows] == [8, 4096], rows
lines = [l for l in open(sys.argv[2]) if l.startswith("tfab-perf: breakdown")]
seen = set()
for l in lines:
    m = re.match(r"tfab-perf: breakdown, (client|server), (\d+) bytes: a round ([0-9.]+) us:", l)
    assert m, l
    seen.add((m[1], int(m[2])))
    parts = dict((k, (float(p), float(c))) for k, p, c in
                 re.findall(r" ([a-z_ ]+) (\d+)% \(([0-9.]+) a round\)", l))
    rest = float(re.search(r"the tool.s loop (\d+)%", l)[1])
    assert set(parts) == {"progress that found work", "progress that found none",
                          "tfab_send", "tfab_recv"}, l
    assert parts["tfab_send"][1] == 1.0 and parts["progress that found work"][1] >= 1.0, l
    assert abs(sum(p for p, c in parts.values()) + rest - 100) <= 3, l
assert seen == {(s, b) for s in ("client", "server") for b in (8, 4096)}, seen
' "$out/bd" "$out/bd_err"

	# A build that spoils one tensor a size: a bandwidth tensor at the first size (the client
	# receives it), a ping at the second (the server does), none of an empty one.
	timeout 100 env -u FI_PROVIDER "$bin/tfab-perf-damaged" tensor -p "$perf_p" -s 8,4K,0 \
		-n 4 --json --verify >"$out/damaged" 2>"$out/err"
	check "tfab-perf tensor --verify fails on a damaged tensor" [ $? = 1 ]
	check "... reporting which sizes" python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["verified"] for r in rows] == [False, False, True], rows
' "$out/damaged"
	# the first timed one: the warm-up of -n 4 is two windows of 16
	check "... and which tensors" grep -q '8-byte tensor (bw, step 32) arrived unlike' "$out/err"
	check "... the server's too" grep -q '4096-byte tensor (ping, step [0-9]*) arrived unlike' \
		"$out/err"
fi

[ $fails = 0 ]
