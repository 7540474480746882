#!/usr/bin/env bash
# gpu-checks.sh: the checks and figures of the GPU proxy path, as one script for a machine
# with a GPU (a lent device's time is short): the GPU tests, the bounds (cuda-copy: one copy
# as the engine makes it; cuda-turns: two processes on one GPU), and GPU tensors on native
# shm, each build in turn, REPS times, medians in the JSON lines' order.
#
# usage: tools/bench/gpu-checks.sh BUILD [OLD_BUILD] [REPS]   (default REPS 3)
#   BUILD, OLD_BUILD: meson build folders made with CUDA (their tools/tfab-perf and tests).
#   Binaries built elsewhere travel with their libraries: set LD_LIBRARY_PATH.
set -u
build=$1
old=${2:-}
reps=${3:-3}
run() { echo "== $*"; timeout 120 "$@"; echo "rc=$?"; }
nvidia-smi -L 2>/dev/null
TFAB_PROVIDER=shm TFAB_CUDA_CHUNK=65536 run "$build/test/engine/test_cuda"
TFAB_COLL_PIECE=65536 TFAB_LOG_LEVEL=error run "$build/test/world/test_coll" gpu 3
run "$build/tools/cuda-copy" 21
run "$build/tools/cuda-turns" 5 2000
for i in $(seq "$reps"); do
	for b in $old $build; do
		# no --verify: its fill and check would be timed too
		echo "== run $i: $b"
		timeout 60 "$b/tools/tfab-perf" tensor -p shm --device cuda -s 8,1M,64M -n 32 --json
	done
done
run "$build/tools/tfab-perf" tensor -p shm --device cuda -s 8,1M,64M -n 4 --json --verify
