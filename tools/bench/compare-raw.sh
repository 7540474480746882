#!/usr/bin/env bash
#
# compare-raw.sh: `tfab-perf raw` against ofi-ref, a plain libfabric program doing the same
# writes, on the same machine in one run. Runs are interleaved (ref, tfab, memcpy, ref, tfab,
# memcpy, ...) so that drifting load hits all alike; the table gives medians, tfab/ref ratios,
# and `tfab-perf memcpy` with tfab's fraction of it (the bound of a same-host transfer).
#
# usage: tools/bench/compare-raw.sh [BUILD_DIR] [SIZES] [REPS]
#   BUILD_DIR  meson build folder holding tools/tfab-perf (default: build, at the repo root)
#   SIZES      comma-separated, K/M/G suffixes allowed (default 8,1M,64M)
#   REPS       runs of each program per provider and size (default 3)
# Environment: PROVIDERS (default "shm tcp"), RUN_TIMEOUT seconds per run (default 300).
# Exits non-zero if any run failed.

set -u

root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
sizes=${2:-8,1M,64M}
reps=${3:-3}
providers=${PROVIDERS:-shm tcp}
run_timeout=${RUN_TIMEOUT:-300}

src=$root/tools/bench/ofi-ref.c
ref=$build/ofi-ref
tfab=$build/tools/tfab-perf

die() {
	echo "compare-raw: $*" >&2
	exit 2
}

[[ -d $build ]] || die "no build folder $build"
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive number, not '$reps'"
command -v python3 >/dev/null || die "python3 is needed to read the JSON"

if [[ ! -x $ref || $src -nt $ref ]]; then
	echo "compiling $ref"
	gcc -O2 -std=c11 -D_GNU_SOURCE "$src" -lfabric -o "$ref" || die "could not build ofi-ref"
fi

# Bytes of a size with an optional K/M/G suffix (powers of two, as both programs read them).
to_bytes() {
	local s=$1 n mult=1
	case $s in
	*[kK]) mult=1024 ;;
	*[mM]) mult=$((1024 * 1024)) ;;
	*[gG]) mult=$((1024 * 1024 * 1024)) ;;
	esac
	n=${s%[kKmMgG]}
	[[ $n =~ ^[0-9]+$ ]] || die "bad size '$s'"
	echo $((n * mult))
}

iters_for() {
	if (($(to_bytes "$1") >= 1024 * 1024)); then echo 48; else echo 20000; fi
}

ref_cmd() {
	echo "FI_PROVIDER=$1 $ref -p $1 -s $2 -n $3 -w 4 --json"
}

tfab_cmd() {
	echo "FI_PROVIDER=$1 $tfab raw -p ofi:$1 -s $2 -n $3 -w 4 --json"
}

memcpy_cmd() {
	echo "$tfab memcpy -s $1 -n $2 --json"
}

# Someone may be relinking tfab-perf: give it a minute to come back.
wait_for_tfab() {
	local i
	for ((i = 0; i < 60; i++)); do
		[[ -x $tfab ]] && return 0
		sleep 1
	done
	return 1
}

IFS=, read -ra size_list <<<"$sizes"

echo "commands, each run $reps times, interleaved ref, tfab, memcpy:"
for p in $providers; do
	for s in "${size_list[@]}"; do
		n=$(iters_for "$s")
		echo "  $(ref_cmd "$p" "$s" "$n")"
		echo "  $(tfab_cmd "$p" "$s" "$n")"
		echo "  $(memcpy_cmd "$s" "$n")"
	done
done
echo

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=$work/results
: >"$results"
failed=0

# One run; its JSON line goes to the results file tagged "provider size tool".
run_one() {
	local tool=$1 p=$2 s=$3 n=$4 out=$work/out err=$work/err rc line
	if [[ $tool != ref ]] && ! wait_for_tfab; then
		echo "compare-raw: $tfab is missing" >&2
		failed=1
		return
	fi
	if [[ $tool == ref ]]; then
		FI_PROVIDER=$p timeout "$run_timeout" "$ref" -p "$p" -s "$s" -n "$n" -w 4 --json \
			>"$out" 2>"$err"
	elif [[ $tool == tfab ]]; then
		FI_PROVIDER=$p timeout "$run_timeout" "$tfab" raw -p "ofi:$p" -s "$s" -n "$n" -w 4 \
			--json >"$out" 2>"$err"
	else
		timeout "$run_timeout" "$tfab" memcpy -s "$s" -n "$n" --json >"$out" 2>"$err"
	fi
	rc=$?
	line=$(grep -m1 '^{' "$out")
	if ((rc != 0)) || [[ -z $line ]]; then
		echo "compare-raw: $tool $p $s failed (exit $rc):" >&2
		tail -n 5 "$err" >&2
		failed=1
		return
	fi
	printf '%s %s %s %s\n' "$p" "$(to_bytes "$s")" "$tool" "$line" >>"$results"
}

for p in $providers; do
	for s in "${size_list[@]}"; do
		n=$(iters_for "$s")
		for ((r = 1; r <= reps; r++)); do
			echo "  $p $s: run $r of $reps" >&2
			run_one ref "$p" "$s" "$n"
			run_one tfab "$p" "$s" "$n"
			run_one memcpy "$p" "$s" "$n"
		done
	done
done
echo >&2

python3 - "$results" "$providers" "$sizes" "$reps" <<'EOF' || failed=1
import json, statistics, sys

path, providers, sizes = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(",")
reps = int(sys.argv[4])
runs = {}
with open(path) as f:
    for line in f:
        prov, nbytes, tool, obj = line.split(" ", 3)
        r = json.loads(obj)
        runs.setdefault((prov, int(nbytes), tool), []).append(r)

def bytes_of(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:].lower(), 1)
    return int(s[:-1] if mult > 1 else s) * mult

def med(rs, key):
    return statistics.median(r[key] for r in rs) if rs else None

def num(v, fmt):
    return fmt % v if v is not None else "FAIL"

def ratio(a, b):
    return "%.2f" % (a / b) if a is not None and b else "-"

hdr = ("provider", "bytes", "ref GB/s", "tfab GB/s", "ratio", "ref lat us", "tfab lat us",
       "lat ratio", "memcpy GB/s", "tfab/memcpy")
fmt = "%-9s %10s %10s %10s %7s %11s %12s %10s %12s %12s"
print(fmt % hdr)
for prov in providers:
    for s in sizes:
        n = bytes_of(s)
        ref, tf = runs.get((prov, n, "ref"), []), runs.get((prov, n, "tfab"), [])
        mc = runs.get((prov, n, "memcpy"), [])
        # gbps carries more digits than GBps for small writes
        rb, tb, mb = med(ref, "gbps"), med(tf, "gbps"), med(mc, "gbps")
        rb, tb, mb = [v / 8 if v is not None else None for v in (rb, tb, mb)]
        rl, tl = med(ref, "lat_us"), med(tf, "lat_us")
        row = fmt % (prov, n, num(rb, "%.4f"), num(tb, "%.4f"), ratio(tb, rb),
                     num(rl, "%.3f"), num(tl, "%.3f"), ratio(tl, rl), num(mb, "%.4f"),
                     ("%.3f" % (tb / mb)) if tb is not None and mb else "-")
        if len(ref) != reps or len(tf) != reps or len(mc) != reps:
            row += "  (runs that finished: ref %d, tfab %d, memcpy %d of %d)" % (
                len(ref), len(tf), len(mc), reps)
        print(row)
print("ratio = tfab/ref bandwidth (1.00 is parity, lower is slower); "
      "lat ratio = tfab/ref latency (higher is slower); tfab/memcpy = tfab's bandwidth over "
      "one thread's memcpy (the same-host bound); medians of %d runs" % reps)
print()
print("every run, in run order (GB/s @ lat us):")
for prov in providers:
    for s in sizes:
        n = bytes_of(s)
        for tool in ("ref", "tfab", "memcpy"):
            rs = runs.get((prov, n, tool), [])
            print("  %-4s %-6s %9d  %s" % (prov, tool, n, "  ".join(
                "%.4f@%.3f" % (r["gbps"] / 8, r["lat_us"]) for r in rs)))
EOF

exit $failed
