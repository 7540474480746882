#!/usr/bin/env bash
# In the VM: tfab-perf raw between a local pair of processes on PROVIDER, every byte and
# immediate verified, and every size reported verified.
# usage: perf_raw.sh TFAB_PERF PROVIDER
#
# libfabric 1.17's ofi_rxm crashes when a peer closes while this side still holds unread
# remote-write completions from it: closing the connection flushes the verbs CQ and reposts the
# receive buffers on the endpoint it just closed (use after free, SIGSEGV under fi_cq_read).
# tfab-perf's server closes its endpoint as soon as its own last write has completed, so on
# verbs;ofi_rxm the client sometimes crashes in the last size, before printing it. A last,
# extra 0-byte size takes that hit; the crash, after every real size was verified, is a SKIP
# with this reason. Anything else that goes wrong fails.
set -euo pipefail

perf=$1
provider=$2
sizes=(0 8 4096 1048576)
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

status=0
"$perf" raw -p "$provider" --verify -s 0,8,4K,1M,0 -n 20 --timeout 60000 --json >"$out" \
	2>"$err" || status=$?
cat "$out"
cat "$err" >&2
verified=0
for n in "${sizes[@]}"; do
	if grep -q "\"bytes\":$n,.*\"verified\":true" "$out"; then
		verified=$((verified + 1))
	else
		echo "perf_raw: no verified result for $n bytes" >&2
	fi
done
rows=$(grep -c '"verified":true' "$out" || true)
if [ "$status" = 0 ] && [ "$verified" = "${#sizes[@]}" ] && [ "$rows" = 5 ]; then
	exit 0
fi
if [ "$verified" = "${#sizes[@]}" ] && grep -q "terminated with signal 11" "$err" &&
	grep -A1 "terminated with signal 11" "$err" | grep -q "libfabric\.so\.1(+0xb7882)"; then
	echo "SKIP: every size verified, then tfab-perf crashed inside libfabric in the last" \
		"(extra) size (libfabric 1.17 ofi_rxm reposts receives on a closed connection; see" \
		"doc/verbs-vm.md)"
	exit 77
fi
echo "perf_raw: tfab-perf exited with $status, $verified of ${#sizes[@]} sizes verified" >&2
exit 1
