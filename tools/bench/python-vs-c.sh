#!/usr/bin/env bash
# python-vs-c.sh: the cost of the Python package over the C library, on one path in one run:
# an 8-byte fetch (latency) and a 64 MiB fetch (bandwidth), from C (`tfab-perf tensor`) and
# from Python (tools/bench/python_perf.py, the same measurements through the tfab package),
# REPS runs each, alternating, and prints the medians with
#   Python's 64 MiB bandwidth / C's                  (target >= 0.95)
#   Python's added microseconds per 8-byte fetch     (one-way latency, Python - C; target <= 3)
#
# usage: tools/bench/python-vs-c.sh [BUILD_DIR] [REPS]      (PROVIDER=shm, ITERS=, SIZES=8,64M,
#        HEAP_DST=1: both receive into the caller's arrays rather than the library's tensors)
# PROVIDER is a TFAB_PROVIDER value: shm is the native backend, ofi:NAME libfabric's NAME.
# ITERS (default: tfab-perf's, about 2 GiB per size) sets -n for both sides.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
reps=${2:-5}
provider=${PROVIDER:-shm}
sizes=${SIZES:-8,64M}
python=/usr/bin/python3
iters=()
[ -n "${ITERS:-}" ] && iters=(-n "$ITERS")
[ -n "${HEAP_DST:-}" ] && iters+=(--heap-dst)
fi=()
[[ $provider == ofi:* ]] && fi=(FI_PROVIDER="${provider#ofi:}")
if [ ! -x "$build/tools/tfab-perf" ] || [ ! -d "$build/lib/python/tfab" ]; then
	echo "python-vs-c: build $build first (tfab-perf and the Python package)" >&2
	exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$reps"); do
	[ "$r" = 1 ] && echo "run: ${fi[*]} $build/tools/tfab-perf tensor -p $provider -s $sizes ${iters[*]} --json" >&2
	if ! env "${fi[@]}" "$build/tools/tfab-perf" tensor -p "$provider" -s "$sizes" \
		"${iters[@]}" --json | sed "s/^/c $r /" >>"$out"; then
		echo "python-vs-c: a C run failed (run $r)" >&2
		exit 1
	fi
	[ "$r" = 1 ] && echo "run: ${fi[*]} PYTHONPATH=$build/lib/python $python $root/tools/bench/python_perf.py -p $provider -s $sizes ${iters[*]}" >&2
	if ! env "${fi[@]}" PYTHONPATH="$build/lib/python" "$python" \
		"$root/tools/bench/python_perf.py" -p "$provider" -s "$sizes" "${iters[@]}" |
		sed "s/^/py $r /" >>"$out"; then
		echo "python-vs-c: a Python run failed (run $r)" >&2
		exit 1
	fi
done
"$python" - "$out" "$provider" <<'PY'
import json, statistics, sys
runs = {}
paths = set()
for line in open(sys.argv[1]):
    lang, rep, js = line.split(" ", 2)
    d = json.loads(js)
    paths.add(d.get("path"))
    runs.setdefault((lang, d["bytes"]), []).append(d)
def med(lang, size, field):
    xs = [d[field] for d in runs.get((lang, size), [])]
    return statistics.median(xs) if xs else None
print(f"path: {sys.argv[2]} ({', '.join(sorted(p for p in paths if p))}); medians of "
      f"{len(runs.get(('c', 8), runs.get(('c', min(s for _, s in runs)), [])))} runs")
print(f"{'bytes':>10} {'C GB/s':>9} {'Py GB/s':>9} {'bw ratio':>9} {'C lat us':>9} "
      f"{'Py lat us':>9} {'added us':>9} {'Py copies':>9}")
for size in sorted({s for _, s in runs}):
    cg, pg = med("c", size, "GBps"), med("py", size, "GBps")
    cl, pl = med("c", size, "lat_us"), med("py", size, "lat_us")
    copies = max((d["copies"] for d in runs.get(("py", size), [])), default=None)
    print(f"{size:>10} {cg:9.3f} {pg:9.3f} {pg / cg if cg else 0:9.3f} {cl:9.2f} {pl:9.2f} "
          f"{pl - cl:9.2f} {copies!s:>9}")
big, small = max(s for _, s in runs), min(s for _, s in runs)
ratio = med("py", big, "GBps") / med("c", big, "GBps")
added = med("py", small, "lat_us") - med("c", small, "lat_us")
print(f"Python/C bandwidth at {big} bytes: {ratio:.3f} (target >= 0.95): "
      f"{'met' if ratio >= 0.95 else 'NOT met'}")
print(f"Python's added us per {small}-byte fetch: {added:.2f} (target <= 3): "
      f"{'met' if added <= 3 else 'NOT met'}")
PY
