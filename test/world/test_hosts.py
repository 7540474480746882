#!/usr/bin/env python3
"""A world over two hosts (doc/world.md): two network namespaces joined by a veth pair stand for
two hosts, with ranks 0 and 1 on the first and 2 and 3 on the second (each pair started by one
`ip netns exec`, so that it shares a mount namespace: one host to tfab). Every pair must take
its best path, the native shm path within a host and ofi:tcp between them, and the world then
allreduces 4 MiB three times, every result checked (test_coll env).

    test_hosts.py TEST_COLL

Needs root and iproute2 (else 77, saying why). Every namespace and process it makes is gone at
the end.
"""
import os
import shutil
import subprocess
import sys

WAIT_S = 120
TAG = "tfw%d" % (os.getpid() % 100000)
HOSTS = {"a": "10.77.91.1", "b": "10.77.91.2"}
PORT = 29400 + os.getpid() % 500


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


def skip(why):
    print("SKIP: " + why)
    sys.exit(77)


def hosts_up():
    sh("ip", "link", "add", TAG + "a", "type", "veth", "peer", "name", TAG + "b")
    for h, addr in HOSTS.items():
        ns = TAG + h
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "set", TAG + h, "netns", ns)
        sh("ip", "-n", ns, "link", "set", TAG + h, "name", "eth0")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")


def hosts_down():
    for h in HOSTS:
        sh("ip", "netns", "del", TAG + h, check=False)
    sh("ip", "link", "del", TAG + "a", check=False)


def main():
    coll = os.path.abspath(sys.argv[1])
    if os.geteuid() != 0:
        skip("network namespaces need root")
    if not shutil.which("ip"):
        skip("ip not found (Debian: iproute2)")
    try:
        hosts_up()
    except subprocess.CalledProcessError as e:
        hosts_down()
        skip("cannot make network namespaces here: %s" % (e.stderr or e).strip())
    procs = []
    try:
        for h, ranks in (("a", (0, 1)), ("b", (2, 3))):
            env = dict(os.environ, TFAB_WORLD_SIZE="4", TFAB_MASTER_ADDR=HOSTS["a"],
                       TFAB_MASTER_PORT=str(PORT), TFAB_WORLD_HOST=HOSTS[h],
                       TFAB_PROVIDER="shm,ofi:tcp", FI_PROVIDER="tcp", TFAB_OFI_DOMAIN="eth0",
                       TFAB_LOG_LEVEL="warn", TFAB_WORLD_TIMEOUT_MS="60000")
            script = " & ".join("TFAB_RANK=%d %s env 3 > %s.%d 2>&1" % (r, coll, TAG, r)
                                for r in ranks) + " & wait"
            procs.append(subprocess.Popen(["ip", "netns", "exec", TAG + h, "sh", "-c", script],
                                          env=env, start_new_session=True))
        for p in procs:
            try:
                p.wait(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        outs = {}
        for r in range(4):
            try:
                with open("%s.%d" % (TAG, r)) as f:
                    outs[r] = f.read()
            except OSError:
                outs[r] = ""
        bad = []
        for r in range(4):
            if "OK" not in outs[r].splitlines():
                bad.append("rank %d did not finish its allreduces" % r)
            for k in range(4):
                if k == r:
                    continue
                want = "shm" if (r < 2) == (k < 2) else "ofi:tcp"
                if "PATH %d-%d=%s" % (r, k, want) not in outs[r]:
                    bad.append("rank %d is not on %s to rank %d" % (r, want, k))
        for r in range(4):
            print("--- rank %d:\n%s" % (r, outs[r].strip()))
        for b in bad:
            print("FAILED: " + b)
        return 1 if bad else 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        for r in range(4):
            try:
                os.unlink("%s.%d" % (TAG, r))
            except OSError:
                pass
        hosts_down()


if __name__ == "__main__":
    sys.exit(main())
