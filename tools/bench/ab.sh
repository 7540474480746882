#!/usr/bin/env bash
#
# ab.sh: before and after a change, in one run. Runs `tfab-perf all` (memcpy, raw, then tensor)
# from two builds, interleaved (before, after, before, after, ...) so that drifting load hits
# both alike, and prints per provider, test and size the median bandwidth and latency of each
# build, the after/before ratios, and the after build's bandwidth over the memcpy of its runs
# (the bound of a same-host transfer; a build without memcpy rows leaves their cells "-").
#
# usage: tools/bench/ab.sh BEFORE_BUILD AFTER_BUILD [SIZES] [REPS]
#   BEFORE_BUILD, AFTER_BUILD  meson build folders holding tools/tfab-perf (for the "before",
#                              a worktree of the old commit: git worktree add /tmp/before HEAD~1)
#   SIZES                      comma-separated, K/M/G suffixes allowed (default 8,1M,64M)
#   REPS                       runs of each build per provider (default 5)
# Environment: PROVIDERS (default "sockets tcp shm": libfabric's; "native" is the native shm
#   backend, and "allreduce:N" runs `tfab-perf allreduce --ranks N` on the default path, its
#   bandwidth the bus bandwidth), RUN_TIMEOUT seconds per run (300),
#   ITERS (tfab-perf -n: writes per size; default tfab-perf's own, about 2 GiB per size).
# Exits non-zero if any run failed.
set -u
if [ $# -lt 2 ]; then
	sed -n '3,16p' "$0" | sed 's/^# \{0,1\}//'
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
	case $p in
	native) env=() args=(all -p shm) ;;
	allreduce:*) env=() args=(allreduce --ranks "${p#allreduce:}") ;;
	*)
		env=(FI_PROVIDER="$p")
		[ "$p" != shm ] && env+=(TFAB_OFI_DOMAIN=lo)
		args=(all -p "ofi:$p")
		;;
	esac
	echo "run: ${env[*]} tfab-perf ${args[*]} -s $sizes ${iters[*]} --json (x$reps each build)" >&2
	for r in $(seq 1 "$reps"); do
		for side in before after; do
			bin=$before
			[ "$side" = after ] && bin=$after
			if ! timeout "$run_timeout" env "${env[@]}" "$bin" "${args[@]}" -s "$sizes" \
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
    return statistics.median(v) if v else None
def div(a, b):
    return a / b if a is not None and b else None
def cell(v, fmt):
    return format(v, fmt) if v is not None else "-"
print("| provider | test | bytes | before GB/s | after GB/s | ratio | after / memcpy "
      "| before lat us | after lat us | ratio |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
provs = list(dict.fromkeys(k[0] for k in rows))
rank = {"memcpy": 0, "raw": 1, "tensor": 2}
order = sorted(rows, key=lambda k: (provs.index(k[0]), rank.get(k[1], 3), k[1], k[2]))
for prov, test, size in order:
    s = rows[(prov, test, size)]
    b, a = s["before"], s["after"]
    # gbps carries more digits than GBps for small sizes; an allreduce has its bus bandwidth
    if test == "allreduce":
        bg, ag = med(b, "busbw_GBps"), med(a, "busbw_GBps")
    else:
        bg, ag = div(med(b, "gbps"), 8), div(med(a, "gbps"), 8)
    bl, al = med(b, "lat_us"), med(a, "lat_us")
    mc = rows.get((prov, "memcpy", size), {}).get("after", [])
    bound = None if test == "memcpy" else div(med(mc, "gbps"), 8)
    print(f"| {prov} | {test} | {size} | {cell(bg, '.4g')} | {cell(ag, '.4g')} "
          f"| {cell(div(ag, bg), '.2f')} | {cell(div(ag, bound), '.3g')} "
          f"| {cell(bl, '.3f')} | {cell(al, '.3f')} | {cell(div(al, bl), '.2f')} |")
PY
exit $status
