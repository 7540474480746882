#!/usr/bin/env bash
#
# lat-ab.sh: the 8-byte tensor latency of several builds (or settings), interleaved in one run
# (A, B, ..., A, B, ...) so that drifting load hits all alike: `tfab-perf tensor -s 8 -w 1`,
# 20,000 transfers and 10,000 ping-pong rounds a run, one-way latency (half a round). Prints
# per build the median, the first quartile and the minimum: on a VM the runs fall into two
# speeds of cross-core traffic, and the quartile shows the faster one.
#
# usage: tools/bench/lat-ab.sh REPS SPEC...
#   SPEC  a meson build folder holding tools/tfab-perf, optionally followed by settings:
#         build,TFAB_CTRL_BATCH=0 (comma-separated VAR=VALUE)
# Environment: PROVIDER (TFAB_PROVIDER of the runs; default shm), SIZE (default 8).
set -u
if [ $# -lt 2 ]; then
	sed -n '3,14p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
fi
reps=$1
shift
provider=${PROVIDER:-shm}
size=${SIZE:-8}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fi=()
[[ $provider == ofi:* ]] && fi=(FI_PROVIDER="${provider#ofi:}")
for ((i = 0; i < reps; i++)); do
	for spec in "$@"; do
		build=${spec%%,*}
		envs=()
		[[ $spec == *,* ]] && IFS=, read -r -a envs <<<"${spec#*,}"
		lat=$(env "${fi[@]}" "${envs[@]}" "$build/tools/tfab-perf" tensor -p "$provider" \
			-s "$size" -n 20000 -w 1 --json | tail -1 |
			python3 -c 'import json,sys; print(json.load(sys.stdin)["lat_us"])') || {
			echo "lat-ab: a run of $spec failed" >&2
			exit 1
		}
		echo "$spec $lat" >>"$out"
	done
done
python3 - "$out" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    spec, lat = line.split()
    runs.setdefault(spec, []).append(float(lat))
print(f"{'build':40} {'median us':>10} {'q1 us':>8} {'min us':>8}  runs")
for spec, v in runs.items():
    s = sorted(v)
    print(f"{spec:40} {statistics.median(s):10.3f} {s[len(s) // 4]:8.3f} {s[0]:8.3f}  "
          + " ".join(f"{x:.3f}" for x in v))
PY
