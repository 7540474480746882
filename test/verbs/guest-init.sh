#!/bin/busybox sh
# /init of the tfab test VM; test/verbs/vm.py puts it in the initramfs with busybox and the
# kernel modules. Loads the modules, mounts this machine's root (9p, read-only) with fresh proc,
# sys, dev and tmpfs over it, mounts the job share at its host path, adds rxe0 on dummy0
# (10.93.0.1), runs the job chrooted with only its own environment, and prints its exit status
# on the console, where vm.py reads it. Markers: TFAB-VM-READY, TFAB-VM-EXIT: N,
# TFAB-VM-SETUP-FAILED: why.
set -euo pipefail
/bin/busybox --install -s /bin
export PATH=/bin

stamp() {
	read -r up _ </proc/uptime
	echo "tfab-vm-init: $* at ${up} s"
}

fail() {
	echo "TFAB-VM-SETUP-FAILED: $*"
	poweroff -f
	sleep 60
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
while read -r m; do
	insmod "/modules/$m" || fail "insmod $m"
done </modules/order
stamp "modules loaded"

p9=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$p9" job /job || fail "cannot mount the job share"
read -r job </job/path
r=/newroot
mount -t 9p -o "$p9,ro,cache=loose" host "$r" || fail "cannot mount the host's root"
mount -t proc proc "$r/proc"
mount -t sysfs sysfs "$r/sys"
mount -t devtmpfs devtmpfs "$r/dev"
mkdir -p "$r/dev/shm" "$r/dev/pts"
mount -t devpts devpts "$r/dev/pts"
# A checkout under /tmp (a CI clone, say) stays visible through the guest's own /tmp: its
# top folder is bound back in over the tmpfs.
top=
case "$job" in
/tmp/?*)
	top=${job#/tmp/}
	top=${top%%/*}
	mkdir -p /hosttmp
	mount --bind "$r/tmp" /hosttmp || fail "cannot bind the host's /tmp"
	;;
esac
for d in /tmp /dev/shm /run; do
	mount -t tmpfs -o mode=1777 tmpfs "$r$d"
done
if [ -n "$top" ]; then
	mkdir -p "$r/tmp/$top"
	mount --bind "/hosttmp/$top" "$r/tmp/$top" || fail "cannot bind /tmp/$top"
fi
mount --move /job "$r$job" || fail "cannot mount the job share at $job"
hostname localhost
ip link set lo up
stamp "root mounted"

# rxe0 sits on dummy0 (made by the dummy module) rather than lo: libfabric's verbs provider
# ignores an interface named lo, and finds no IP address for a device on it.
echo 1 >/proc/sys/net/ipv6/conf/dummy0/disable_ipv6
ip addr add 10.93.0.1/24 dev dummy0
ip link set dummy0 up
chroot "$r" rdma link add rxe0 type rxe netdev dummy0 ||
	fail "rdma link add rxe0 type rxe netdev dummy0"
# Wait for the port and its RoCE v2 GID for 10.93.0.1 (index 1); read, not a fork per file.
port=/sys/class/infiniband/rxe0/ports/1
want="4: ACTIVE/0000:0000:0000:0000:0000:ffff:0a5d:0001"
i=0
while :; do
	state= gid=
	read -r state <"$port/state" || true
	read -r gid <"$port/gids/1" || true
	[ "$state/$gid" = "$want" ] && break
	i=$((i + 1))
	[ "$i" -lt 100 ] || fail "rxe0 port 1: state '$state', GID 1 '$gid' after 10 s"
	sleep 0.1
done

stamp "rxe0 active"
echo TFAB-VM-READY
rc=0
chroot "$r" /usr/bin/env -i /bin/sh "$job/job.sh" </dev/null >"$r$job/stdout" \
	2>"$r$job/stderr" || rc=$?
echo "TFAB-VM-EXIT: $rc"
poweroff -f
sleep 60
