#!/usr/bin/env bash
# In the VM: ibv_rc_pingpong server and client over rxe0 on GID index 1 (RoCE v2), checking the
# received buffers (-c) and sleeping on completion events (-e). Both sides must finish and
# report their exchanges.
set -euo pipefail

if ! command -v ibv_rc_pingpong >/dev/null; then
	echo "SKIP: ibv_rc_pingpong is not installed (apt-get install ibverbs-utils)"
	exit 77
fi

iters=500
args=(-d rxe0 -g 1 -n "$iters" -s 4096 -c -e)
dir=$(mktemp -d)
server=
cleanup() {
	[ -z "$server" ] || kill "$server" 2>/dev/null || true
	rm -rf "$dir"
}
trap cleanup EXIT

timeout 60 ibv_rc_pingpong "${args[@]}" >"$dir/server" 2>&1 &
server=$!
# The client fails fast while the server is not listening yet: retry that, nothing else.
for try in $(seq 50); do
	if timeout 60 ibv_rc_pingpong "${args[@]}" localhost >"$dir/client" 2>&1; then
		break
	fi
	if ! grep -q "Couldn't connect to" "$dir/client" || [ "$try" = 50 ]; then
		cat "$dir/client" >&2
		echo "rc_pingpong: client failed" >&2
		exit 1
	fi
	sleep 0.2
done
status=0
wait "$server" || status=$?
server=
for side in server client; do
	sed "s/^/$side: /" "$dir/$side"
	grep -q "^$iters iters in " "$dir/$side" || {
		echo "rc_pingpong: the $side did not report $iters iterations (status $status)" >&2
		exit 1
	}
done
[ "$status" = 0 ] || {
	echo "rc_pingpong: the server exited with $status" >&2
	exit 1
}
