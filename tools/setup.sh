#!/usr/bin/env bash
# Installs tfab's build and test dependencies from Debian 12 packages, builds into build/, and
# runs the main job: tfab-perf (one thread's memcpy, the bound, then raw writes and tensors)
# between two local processes over the default fabric.
#   tools/setup.sh              everything
#   tools/setup.sh --deps-only  just the packages (CI uses this)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
	build-essential meson ninja-build pkg-config python3
	libfabric-dev libfabric-bin
	libibverbs-dev ibverbs-providers rdma-core
	libdlpack-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
	libcmocka-dev valgrind clang-format libssl-dev
	# lib/python: the Python package and its tests (Debian's python3)
	python3-dev python3-numpy python3-torch python3-pytest python3-sklearn
	# test/fuzz: libFuzzer targets (CI fuzzes each for 30 s)
	clang libclang-rt-14-dev
	# test/verbs: real kernel verbs (soft-RoCE) inside a QEMU VM
	qemu-system-x86 busybox-static ibverbs-utils kmod iproute2
	# test/faults: test hosts from network namespaces, faults with nftables
	nftables
	# a world under mpirun (PMIx), and tools/bench's MPI_Allreduce reference
	openmpi-bin libopenmpi-dev libpmix-dev
)

sudo=
if [ "$(id -u)" != 0 ]; then
	sudo=sudo
fi
missing=()
for p in "${packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: installing ${missing[*]}"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
		"${missing[@]}" >/dev/null
fi
[ "${1:-}" = "--deps-only" ] && exit 0

[ -d build ] || meson setup build
ninja -C build
echo
build/tools/tfab-info | sed -n '/^Selected/p'
build/tools/tfab-perf
