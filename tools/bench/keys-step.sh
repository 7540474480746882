#!/usr/bin/env bash
#
# keys-step.sh: the time of a step of many keys (10,000 tensors of 64 bytes, one receive and
# one send each, every tensor checked) with control writes batched (TFAB_CTRL_BATCH=1, the
# default) and without (0), interleaved in one run, on each path given. It runs the engine
# test scenario many_keys (test/engine/engine_keys.c), which prints the milliseconds per step
# after the first, resident memory, and control and fabric writes per receive.
#
# usage: tools/bench/keys-step.sh [BUILD_DIR] [REPS] [PATHS]
#   BUILD_DIR  meson build folder (default: build)
#   REPS       runs of each (default 5)
#   PATHS      comma-separated TFAB_PROVIDER values (default shm,ofi:tcp)
# Environment: KEYS (default 10000), STEPS (default 20).

set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
reps=${2:-5}
paths=${3:-shm,ofi:tcp}
bin=$build/test/engine/test_engine
out=$(mktemp)
trap 'rm -f "$out"' EXIT
[[ -x $bin ]] || { echo "keys-step: build $build first (test/engine/test_engine)" >&2; exit 2; }

for ((i = 1; i <= reps; i++)); do
	for path in ${paths//,/ }; do
		for batch in 1 0; do
			env=(TFAB_PROVIDER="$path" TFAB_CTRL_BATCH=$batch MP_ONLY=many_keys
			     TFAB_TEST_KEYS="${KEYS:-10000}" TFAB_TEST_STEPS="${STEPS:-20}")
			[[ $path == ofi:* ]] && env+=(FI_PROVIDER="${path#ofi:}" TFAB_OFI_DOMAIN=lo)
			line=$(env "${env[@]}" "$bin" 2>/dev/null | grep '^many_keys:')
			[[ -n $line ]] || { echo "keys-step: $path batch=$batch failed" >&2; exit 1; }
			echo "$path $batch $line" >>"$out"
		done
	done
done

python3 - "$out" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    path, batch, rest = line.split(" ", 2)
    ms = float(re.search(r"([\d.]+) ms a step", rest).group(1))
    cw = float(re.search(r"([\d.]+) control writes", rest).group(1))
    rss = re.search(r"rss (\d+) KiB at step 100, (\d+) KiB at the end", rest)
    rows.setdefault((path, batch), []).append((ms, cw, rss.groups() if rss else None))
print(f"{'path':>8} {'batch':>5} | {'ms/step median':>14} {'runs':>30} | {'ctrl writes/recv':>16}")
for path in dict.fromkeys(p for p, _ in rows):
    med = {}
    for batch in ("1", "0"):
        r = rows.get((path, batch), [])
        if not r:
            continue
        ms = [x[0] for x in r]
        med[batch] = statistics.median(ms)
        print(f"{path:>8} {batch:>5} | {med[batch]:>14.1f} {' '.join(f'{x:.1f}' for x in ms):>30} |"
              f" {statistics.median(x[1] for x in r):>16.3f}")
    if "1" in med and "0" in med:
        print(f"{path:>8} batched/unbatched step time: {med['1'] / med['0']:.2f}")
PY
