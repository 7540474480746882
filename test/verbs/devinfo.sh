#!/usr/bin/env bash
# In the VM: the harness's own check. ibv_devinfo lists rxe0 with port 1 active, on Ethernet
# (RoCE), with GID index 1 the RoCE v2 GID of the guest's address 10.93.0.1.
set -euo pipefail

if ! command -v ibv_devinfo >/dev/null; then
	echo "SKIP: ibv_devinfo is not installed (apt-get install ibverbs-utils)"
	exit 77
fi

# Its output is printed whatever its exit status, so that a failure shows what it saw.
rc=0
out=$(ibv_devinfo -v -d rxe0 2>&1) || rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne 0 ]; then
	echo "devinfo: ibv_devinfo -v -d rxe0 exited $rc" >&2
	exit 1
fi
check() {
	grep -Eq "$1" <<<"$out" || {
		echo "devinfo: no line matching '$1'" >&2
		exit 1
	}
}
check '^hca_id:[[:space:]]+rxe0$'
check '^[[:space:]]+state:[[:space:]]+PORT_ACTIVE \(4\)$'
check '^[[:space:]]+link_layer:[[:space:]]+Ethernet$'
check '^[[:space:]]+GID\[ *1\]:[[:space:]]+::ffff:10\.93\.0\.1, RoCE v2$'
echo "devinfo: rxe0 port 1 active, GID 1 ::ffff:10.93.0.1"
