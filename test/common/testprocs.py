"""What the Python drivers of the tests share: a port for a world's rank 0, and the end of
a group of processes with every wait bounded. Import it after putting this folder on
sys.path (os.path.join(os.path.dirname(__file__), "..", "common"))."""
import os
import random
import socket
import subprocess
import time


def free_port():
    """A port free now, below the kernel's ephemeral range (ip_local_port_range), which bind
    to port 0 and connect() draw from: so that no rank's own listener (libfabric tcp's, on
    an ephemeral port) or outgoing connection takes it before rank 0 listens on it, as
    happened to one from bind to port 0 ("Address already in use", once in a run of
    python-world-ofi-tcp)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.randrange(max(1024, low - 10000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below %d" % low)


def finish(procs, wait_s, early=None):
    """Every process's (exit status, output), within wait_s seconds for them all; one still
    running then is killed, and its output says so. early: output already read, by index."""
    end = time.time() + wait_s
    outs = []
    for i, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1, end - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n(killed: still running after %d s)" % wait_s
        outs.append((p.returncode, (early or {}).get(i, "") + out))
    return outs
