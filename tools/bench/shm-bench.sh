#!/usr/bin/env bash
#
# shm-bench.sh: the native shm backend against libfabric's shm through `tfab-perf raw`, the
# engine on it (`tfab-perf all -p shm`: memcpy, raw and tensor rows of one run), and one
# thread's memcpy (`tfab-perf memcpy`; tools/memcpy-bw adds the backend's own
# streaming copy), on this machine in one run. Runs are interleaved (shm,
# shm --heap-dst, ofi:shm, memcpy, shm, ...) so that drifting load hits all alike; the table
# gives medians and the ratios the same-host targets are set in, for raw writes and for tensors
# (into library-allocated destinations, tfab-perf's default), and beside the tensor latency
# the fabric's own share of it (raw writes with a request-sized message each way per round),
# then for the small sizes each run's latencies and tensor/ofi:shm ratio (a machine's speed
# can change between runs; the rows show at which speed each was taken):
#   8 B one-way latency   shm <= 0.4 x ofi:shm raw
#   1 MiB bandwidth       shm >= 2 x ofi:shm raw
#   64 MiB bandwidth      shm >= 0.9 x memcpy (one thread, 64 MiB, the same `all` run's)
# "shm" writes into mem_alloc memory (one copy, as the engine's pool does); "shm heap" into
# malloc'd memory (process_vm_writev, or the bounce buffers below 32 KiB).
#
# usage: tools/bench/shm-bench.sh [BUILD_DIR] [SIZES] [REPS]
#   BUILD_DIR  meson build folder (default: build, at the repo root)
#   SIZES      comma-separated, K/M suffixes allowed (default 8,1M,64M)
#   REPS       runs of each (default 5)
# Environment: RUN_TIMEOUT seconds per run (default 300).

set -u

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
sizes=${2:-8,1M,64M}
reps=${3:-5}
run_timeout=${RUN_TIMEOUT:-300}
perf=$build/tools/tfab-perf
memcpy_bw=$build/tools/memcpy-bw
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

[[ -x $perf && -x $memcpy_bw ]] || {
	echo "shm-bench: build $build first (tools/tfab-perf, tools/memcpy-bw)" >&2
	exit 2
}
failed=0
small=$(tr ',' '\n' <<<"$sizes" | awk '/^[0-9]+$/ && $1 <= 64' | paste -sd,)
: >"$out/shm-req"
for ((i = 1; i <= reps; i++)); do
	echo "run $i of $reps" >&2
	timeout "$run_timeout" "$perf" all -p shm -s "$sizes" --json >"$out/run" || failed=1
	cat "$out/run" >>"$out/all"
	grep '"test":"raw"' "$out/run" >>"$out/shm" || true
	timeout "$run_timeout" "$perf" raw -p shm -s "$sizes" --heap-dst --json \
		>>"$out/shm-heap" || failed=1
	FI_PROVIDER=shm timeout "$run_timeout" "$perf" raw -p ofi:shm -s "$sizes" --json \
		>>"$out/ofi-shm" || failed=1
	# the fabric's own share of the tensor ping-pong: raw with a request-sized message each
	# way per round (a fetch's request with its TAKEN rider: about 96 bytes)
	if [[ -n $small ]]; then
		timeout "$run_timeout" "$perf" raw -p shm -s "$small" --request-bytes 96 --json \
			>>"$out/shm-req" || failed=1
	fi
	timeout "$run_timeout" "$perf" memcpy -s 64M --json >>"$out/tfab-memcpy" || failed=1
	"$memcpy_bw" $((64 << 20)) 5 >>"$out/memcpy" || failed=1
done

python3 - "$out" <<'PY'
import json, os, statistics, sys
d = sys.argv[1]
def load(name):
    rows = {}
    for line in open(os.path.join(d, name)):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows.setdefault(r.get("test") if name == "memcpy" else r["bytes"], []).append(r)
    return rows
shm, heap, ofi, mc = load("shm"), load("shm-heap"), load("ofi-shm"), load("memcpy")
req = load("shm-req")
tensor, allmc = {}, {}
for line in open(os.path.join(d, "all")):
    if line.startswith("{"):
        r = json.loads(line)
        {"tensor": tensor, "memcpy": allmc}.get(r["test"], {}).setdefault(r["bytes"], []).append(r)
med = lambda rows, k: statistics.median(r[k] for r in rows) if rows else float("nan")
memcpy = med(load("tfab-memcpy").get(64 << 20, []), "GBps")
libc = med(mc.get("memcpy", []), "GBps")
stream = med(mc.get("stream", []), "GBps")
print(f"memcpy, one thread, 64 MiB (tfab-perf memcpy): {memcpy:.2f} GB/s; memcpy-bw: "
      f"memcpy {libc:.2f}, the shm backend's streaming copy {stream:.2f} GB/s")
print(f"{'bytes':>10} | {'shm GB/s':>9} {'lat us':>7} | {'heap GB/s':>9} {'lat us':>7} | "
      f"{'ofi:shm GB/s':>12} {'lat us':>7} | ratios")
for size in sorted(shm):
    s, h, o = shm[size], heap.get(size, []), ofi.get(size, [])
    sg, sl = med(s, "GBps"), med(s, "lat_us")
    hg, hl = med(h, "GBps"), med(h, "lat_us")
    og, ol = med(o, "GBps"), med(o, "lat_us")
    notes = []
    if size <= 64:
        notes.append(f"lat shm/ofi {sl / ol:.2f} (target <= 0.4)")
    elif size == 1 << 20:
        notes.append(f"bw shm/ofi {sg / og:.2f} (target >= 2), heap/ofi {hg / og:.2f}")
    elif size == 64 << 20:
        notes.append(f"bw shm/memcpy {sg / memcpy:.2f} (target >= 0.9), heap/memcpy "
                     f"{hg / memcpy:.2f}, ofi/memcpy {og / memcpy:.2f}")
    print(f"{size:>10} | {sg:>9.2f} {sl:>7.2f} | {hg:>9.2f} {hl:>7.2f} | {og:>12.2f} {ol:>7.2f} "
          f"| {'; '.join(notes)}")
print()
print("tensors (tfab-perf all -p shm, library-allocated destinations), against ofi:shm raw and "
      "the same runs' memcpy:")
print(f"{'bytes':>10} | {'GB/s':>9} {'lat us':>8} {'copies':>6} | {'memcpy GB/s':>11} | ratios")
for size in sorted(tensor):
    t, o = tensor[size], ofi.get(size, [])
    tg, tl, og, ol = med(t, "GBps"), med(t, "lat_us"), med(o, "GBps"), med(o, "lat_us")
    mg = med(allmc.get(size, []), "GBps")
    copies = max(r.get("copies", 0) for r in t)
    notes = []
    if size <= 64:
        rl = med(req.get(size, []), "lat_us")
        notes.append(f"lat tensor/ofi raw {tl / ol:.2f} (target <= 0.4); the fabric's share "
                     f"(shm raw with a 96-byte request each way per round) {rl:.2f} us, "
                     f"{rl / ol:.2f} of ofi raw")
    elif size == 1 << 20:
        notes.append(f"bw tensor/ofi raw {tg / og:.2f} (target >= 2)")
    elif size == 64 << 20:
        notes.append(f"bw tensor/memcpy {tg / mg:.2f} (target >= 0.9)")
    print(f"{size:>10} | {tg:>9.3f} {tl:>8.2f} {copies:>6} | {mg:>11.2f} | {'; '.join(notes)}")
# Run by run: the medians above pool runs the VM may have made at different speeds (on the
# 2-core VM of doc/design.md its cores' line transfers move between two speeds, several times
# apart, without warning, even from one process to the next). Each row's latencies show the
# speed each was taken at (shm raw comes from the tensor's own `all` run, ofi:shm raw from the
# process after it); a row's ratio is one speed's only where they agree.
for size in sorted(b for b in tensor if b <= 64):
    t, o, r = tensor[size], ofi.get(size, []), shm.get(size, [])
    n = len(t)
    print()
    if not n or len(o) != n or len(r) != n:
        # a run that failed left no row: the rest would pair with other runs' rows
        print(f"{size} B, run by run: not shown, a run failed ({len(r)} shm raw, {len(o)} "
              f"ofi:shm raw and {n} tensor rows)")
        continue
    ratios = [t[i]["lat_us"] / o[i]["lat_us"] for i in range(n)]
    print(f"{size} B, run by run: shm raw one way (the VM's speed), ofi:shm raw, tensor, and "
          f"tensor/ofi raw (target <= 0.4)")
    for i in range(n):
        print(f"{i + 1:>10} | {r[i]['lat_us']:>6.2f} us | {o[i]['lat_us']:>6.2f} us | "
              f"{t[i]['lat_us']:>6.2f} us | {ratios[i]:.2f}")
    print(f"{'median':>10} | {med(r, 'lat_us'):>6.2f} us | {med(o, 'lat_us'):>6.2f} us | "
          f"{med(t, 'lat_us'):>6.2f} us | {statistics.median(ratios):.2f}")
PY
exit $failed
