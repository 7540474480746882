#!/usr/bin/env bash
# tensor-vs-raw.sh: runs `tfab-perf all` (memcpy, raw, then tensor, in one run) REPS times per
# provider and prints, per size, the median tensor/raw bandwidth ratio, the median ratio of
# tensor latency to raw one-way latency, copies (must be 0), and the median bandwidth of
# memcpy in the same runs with raw's and tensor's fractions of it (the same-host bound), the
# fabric writes per tensor fetch, and the bandwidth ratio of every run (wanted
# in each run, not only the median). After each run, `tfab-perf memcpy -w W` (W: the window
# of ARGS' -w, else 16, as tensor's) copies into as many destinations in turn as tensor has
# receives in flight: "memcpy-w" and tensor's fraction of it, the bound of tensor at sizes
# whose destinations leave the copying core's cache (raw writes one again and again).
#
# usage: tools/bench/tensor-vs-raw.sh [BUILD_DIR] [SIZES] [REPS]   (PROVIDERS="shm ofi:tcp")
# PROVIDERS holds TFAB_PROVIDER values: shm is the native backend, ofi:NAME libfabric's NAME.
# ARGS adds tfab-perf options to every run, e.g. ARGS="--no-request=32 -w 64".
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
sizes=${2:-8,1M,64M}
reps=${3:-5}
providers=${PROVIDERS:-shm ofi:tcp}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
win=16
[[ " ${ARGS:-} " =~ \ (-w|--window)\ ([0-9]+)\  ]] && win=${BASH_REMATCH[2]}
for p in $providers; do
	for r in $(seq 1 "$reps"); do
		fi=()
		[[ $p == ofi:* ]] && fi=(FI_PROVIDER="${p#ofi:}")
		[ "$r" = 1 ] && echo "run: ${fi[*]} $build/tools/tfab-perf all -p $p -s $sizes ${ARGS:-} --json" >&2
		# shellcheck disable=SC2086 # ARGS is a list of options
		if ! env "${fi[@]}" "$build/tools/tfab-perf" all -p "$p" -s "$sizes" ${ARGS:-} \
			--json | sed "s/^/$p $r /" >>"$out"; then
			echo "tensor-vs-raw: a run failed ($p, run $r)" >&2
			exit 1
		fi
		if ! "$build/tools/tfab-perf" memcpy -s "$sizes" -w "$win" --json |
			sed "s/^/$p $r /; s/\"test\":\"memcpy\"/\"test\":\"memcpy-w\"/" >>"$out"; then
			echo "tensor-vs-raw: memcpy -w $win failed ($p, run $r)" >&2
			exit 1
		fi
	done
done
python3 - "$out" <<'PY'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    prov, rep, js = line.split(" ", 2)
    d = json.loads(js)
    runs.setdefault((prov, d["bytes"], rep), {})[d["test"]] = d
rows = {}
for (prov, size, rep), t in runs.items():
    if "raw" in t and "tensor" in t:
        r, n = t["raw"], t["tensor"]
        m = t["memcpy"]["gbps"] if "memcpy" in t else None
        mw = t["memcpy-w"]["gbps"] if "memcpy-w" in t else None
        rows.setdefault((prov, size), []).append(
            (n["gbps"] / r["gbps"] if r["gbps"] else 0, n["lat_us"] / r["lat_us"],
             n["copies"], r["gbps"] / 8, n["gbps"] / 8, r["lat_us"], n["lat_us"],
             m / 8 if m is not None else None,
             r["gbps"] / m if m else None, n["gbps"] / m if m else None,
             n.get("writes_per_fetch"), mw / 8 if mw else None,
             n["gbps"] / mw if mw else None))
print(f"{'provider':8} {'bytes':>10} {'raw GB/s':>9} {'tensor GB/s':>11} {'bw ratio':>9} "
      f"{'raw lat':>9} {'tensor lat':>10} {'lat ratio':>9} {'copies':>6} "
      f"{'memcpy GB/s':>11} {'raw/memcpy':>10} {'tensor/memcpy':>13} {'writes/fetch':>12}"
      f" {'memcpy-w GB/s':>13} {'tensor/memcpy-w':>15}  per-run bw ratios")
for (prov, size), v in sorted(rows.items()):
    def med(i):
        xs = [x[i] for x in v if x[i] is not None]
        return statistics.median(xs) if xs else None
    opt = lambda i, w, f: format(med(i), f).rjust(w) if med(i) is not None else "-".rjust(w)
    print(f"{prov:8} {size:>10} {med(3):9.3f} {med(4):11.3f} {med(0):9.2f} {med(5):9.2f} "
          f"{med(6):10.2f} {med(1):9.2f} {max(x[2] for x in v):6} "
          f"{opt(7, 11, '.3f')} {opt(8, 10, '.3f')} {opt(9, 13, '.3f')} {opt(10, 12, '.2f')} "
          f"{opt(11, 13, '.3f')} {opt(12, 15, '.3f')}  "
          + " ".join(f"{x[0]:.2f}" for x in v))
PY
