#!/usr/bin/env bash
# allreduce-vs-mpi.sh: the world's figures in one script. tfab-perf allreduce and Open MPI's
# MPI_Allreduce (tools/bench/mpi_allreduce.c, timed the same way) on the same N local ranks
# and sizes, REPS times each, interleaved; per size the medians of latency and bus bandwidth,
# and tfab's over MPI's (bus bandwidth: > 1 is tfab faster; latency: < 1 is tfab faster).
#
# usage: tools/bench/allreduce-vs-mpi.sh [BUILD_DIR] [RANKS] [SIZES] [REPS]
#        (defaults: build, 4, 8,64K,1M,64M, 5; ARGS adds tfab-perf options, such as -p ofi:tcp)
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
ranks=${2:-4}
sizes=${3:-8,64K,1M,64M}
reps=${4:-5}
perf=$build/tools/tfab-perf
mpi=$build/tools/mpi-allreduce
if [ ! -x "$mpi" ] || ! command -v mpirun >/dev/null; then
	echo "allreduce-vs-mpi: needs mpirun and $mpi (Debian: openmpi-bin, libopenmpi-dev)" >&2
	exit 2
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for i in $(seq "$reps"); do
	# shellcheck disable=SC2086
	TFAB_LOG_LEVEL=warn "$perf" allreduce --ranks "$ranks" -s "$sizes" --json ${ARGS:-} \
		>>"$out/tfab" || exit 1
	mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$mpi" -s "$sizes" >>"$out/mpi" ||
		exit 1
done
python3 - "$out/tfab" "$out/mpi" "$ranks" "$reps" <<'PY'
import json, statistics, sys
def load(path):
    rows = {}
    for line in open(path):
        r = json.loads(line)
        rows.setdefault(r["bytes"], []).append(r)
    return rows
t, m = load(sys.argv[1]), load(sys.argv[2])
print("allreduce of float32 on %s local ranks, medians of %s runs (tfab path %s)"
      % (sys.argv[3], sys.argv[4], next(iter(t.values()))[0]["path"]))
print("%10s %6s | %10s %10s %7s | %11s %11s %7s" % ("bytes", "algo", "tfab us", "MPI us",
      "ratio", "tfab busbw", "MPI busbw", "ratio"))
for b in sorted(t):
    tl = statistics.median(r["lat_us"] for r in t[b]); ml = statistics.median(r["lat_us"] for r in m[b])
    tb = statistics.median(r["busbw_GBps"] for r in t[b]); mb = statistics.median(r["busbw_GBps"] for r in m[b])
    print("%10d %6s | %10.2f %10.2f %7.2f | %11.3f %11.3f %7.2f" % (b, t[b][0]["algo"], tl, ml,
          tl / ml, tb, mb, tb / mb if mb else float("nan")))
    print("%17s   tfab runs: %s" % ("", " ".join("%.3g" % r["busbw_GBps"] for r in t[b])))
    print("%17s   MPI runs:  %s" % ("", " ".join("%.3g" % r["busbw_GBps"] for r in m[b])))
PY
