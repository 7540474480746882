#!/usr/bin/env bash
#
# ab.sh: before and after a change, in one run. Runs `tfab-perf all` (raw, then tensor) from
# two builds, interleaved (before, after, before, after, ...) so that drifting load hits both
# alike, and prints per provider, test and size the median bandwidth and latency of each
# build and the after/before ratios.
#
# usage: tools/bench/ab.sh BEFORE_BUILD AFTER_BUILD [SIZES] [REPS]
#   BEFORE_BUILD, AFTER_BUILD  meson build folders holding tools/tfab-perf (for the "before",
#                              a worktree of the old commit: git worktree add /tmp/before HEAD~1)
#   SIZES                      comma-separated, K/M/G suffixes allowed (default 8,1M,64M)
#   REPS                       runs of each build per provider (default 5)
# Environment: PROVIDERS (default "sockets tcp shm"), RUN_TIMEOUT seconds per run (300),
#   ITERS (tfab-perf -n: writes per size; default tfab-perf's own, about 2 GiB per size).
# Exits non-zero if any run failed.
set -u
if [ $# -lt 2 ]; then
	sed -n '3,15p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
fi
before=$1/tools/tfab-perf
after=$2/tools/tfab-perf
sizes=${3:-8,1M,64M}
reps=${4:-5}
providers=${PROVIDERS:-sockets tcp shm}
run_timeout=${RUN_TIMEOUT:-300}
iters=()
[ -n "${ITERS:-}" ] && iters=(-n "$ITERS")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
for p in $providers; do
	env=(FI_PROVIDER="$p")
	[ "$p" != shm ] && env+=(TFAB_OFI_DOMAIN=lo)
	echo "run: ${env[*]} tfab-perf all -p ofi:$p -s $sizes ${iters[*]} --json (x$reps each build)" >&2
	for r in $(seq 1 "$reps"); do
		for side in before after; do
			bin=$before
			[ "$side" = after ] && bin=$after
			if ! timeout "$run_timeout" env "${env[@]}" "$bin" all -p "ofi:$p" -s "$sizes" \
				"${iters[@]}" --json | sed "s/^/$p $side /" >>"$out"; then
				echo "ab: a run failed ($p, $side, run $r)" >&2
				status=1
			fi
		done
	done
done
python3 - "$out" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    prov, side, js = line.split(" ", 2)
    try:
        j = json.loads(js)
    except ValueError:
        continue
    key = (prov, j["test"], j["bytes"])
    rows.setdefault(key, {"before": [], "after": []})[side].append(j)
def med(xs, f):
    v = [x[f] for x in xs if x.get(f) is not None]
    return statistics.median(v) if v else float("nan")
print("| provider | test | bytes | before GB/s | after GB/s | ratio | before lat us | after lat us | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for (prov, test, size), s in rows.items():
    b, a = s["before"], s["after"]
    bg, ag, bl, al = med(b, "GBps"), med(a, "GBps"), med(b, "lat_us"), med(a, "lat_us")
    rg = ag / bg if bg else float("nan")
    rl = al / bl if bl else float("nan")
    print(f"| {prov} | {test} | {size} | {bg:.4g} | {ag:.4g} | {rg:.2f} | {bl:.2f} | {al:.2f} | {rl:.2f} |")
PY
exit $status
