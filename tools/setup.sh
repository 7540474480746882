#!/usr/bin/env bash
# Installs tfab's dependencies from Debian 12 packages, builds into build/, and runs the main
# job: tfab-perf (one thread's memcpy, the bound, then raw writes and tensors) between two
# local processes over the default fabric.
#   tools/setup.sh                 everything: the library's packages and the tests' (below)
#   tools/setup.sh --deps-only     just the packages, all of them (CI uses this)
#   tools/setup.sh --library-only  the library's packages alone, and a build without the tests
# The packages come in two groups. The library's are what building and using tfab takes: the
# compiler and meson, the fabrics, DLPack, OpenSSL, protobuf-c, the Python package's. The
# tests' are what only the test suites and benchmarks take, from cmocka to QEMU and torch.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-all}
case $mode in
all | --deps-only | --library-only) ;;
*)
	echo "usage: tools/setup.sh [--deps-only | --library-only]" >&2
	exit 2
	;;
esac

# What the library needs to build and run.
library_packages=(
	build-essential meson ninja-build pkg-config python3
	# the fabrics: libfabric (and fi_info), raw ibverbs with its device drivers
	libfabric-dev libfabric-bin
	libibverbs-dev ibverbs-providers rdma-core
	# tensors as DLPack describes them; HMAC for authenticated peers (libcrypto)
	libdlpack-dev libssl-dev
	# string tensors as TensorProto (meson feature protobuf)
	libprotobuf-c-dev protobuf-c-compiler
	# joining a world under mpirun through PMIx (meson feature pmix)
	libpmix-dev
	# lib/python: the Python package (Debian's python3), and NumPy arrays to send
	python3-dev python3-numpy
	# `pip install .` of the package into a venv (pyproject.toml, doc/building.md)
	python3-mesonpy python3-venv
)

# What only the tests and benchmarks need (meson option tests, on by default).
test_packages=(
	# the test framework, the valgrind runs and the clang-format test
	libcmocka-dev valgrind clang-format
	# test/unit's TensorProto reference vectors (protoc)
	protobuf-compiler
	# lib/python's tests and its training example
	python3-torch python3-pytest python3-sklearn
	# test/fuzz: libFuzzer targets (CI fuzzes each for 20 s)
	clang libclang-rt-14-dev
	# test/verbs: real kernel verbs (soft-RoCE) inside a QEMU VM
	qemu-system-x86 busybox-static ibverbs-utils kmod iproute2
	# test/faults: test hosts from network namespaces, faults with nftables
	nftables
	# a world under mpirun, and tools/bench's MPI_Allreduce reference
	openmpi-bin libopenmpi-dev
	# tools/bench/vs-ucx.py's point-to-point reference (ucx_perftest)
	ucx-utils
	# the API reference (ninja -C build doc) and its test of the public headers' comments
	doxygen
)

packages=("${library_packages[@]}")
[ "$mode" = --library-only ] || packages+=("${test_packages[@]}")

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
[ "$mode" = --deps-only ] && exit 0

# Without the tests' packages, the tests are left out of the build (cmocka is required).
tests=true
[ "$mode" = --library-only ] && tests=false
if [ -d build ]; then
	meson configure build -Dtests=$tests
else
	meson setup build -Dtests=$tests
fi
ninja -C build
[ "$mode" = --library-only ] && exit 0
echo
build/tools/tfab-info | sed -n '/^Selected/p'
build/tools/tfab-perf
