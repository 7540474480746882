#!/usr/bin/env bash
# no-request.sh: no-request mode's figures in one script. tensor-vs-raw.sh (tfab-perf all: memcpy,
# raw writes and tensors in one run, medians of REPS runs) three times, on each path:
#   1. without no-request mode, at 8 B, 1 MiB and 64 MiB;
#   2. with it at 8 B (depth 32, so a window of 64: tfab-perf caps the depth at the window);
#   3. with it at 1 MiB and 64 MiB at the default window (standing requests hold at most
#      4 MiB a key, so 4 and 1 of them).
#
# usage: tools/bench/no-request.sh [BUILD_DIR] [REPS]   (PROVIDERS="shm ofi:tcp")
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
reps=${2:-5}
export PROVIDERS=${PROVIDERS:-shm ofi:tcp}
bench=$root/tools/bench/tensor-vs-raw.sh
echo "=== without no-request mode"
ARGS="" "$bench" "$build" 8,1M,64M "$reps" || exit 1
echo "=== --no-request=32 -w 64, 8 B"
ARGS="--no-request=32 -w 64" "$bench" "$build" 8 "$reps" || exit 1
echo "=== --no-request=32, 1 MiB and 64 MiB"
ARGS="--no-request=32" "$bench" "$build" 1M,64M "$reps"
