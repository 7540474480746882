#!/usr/bin/python3
"""strangers.py: what strangers on a listening port cost the peers that are not strangers.

Each round runs the same job twice, with and without strangers, in an order that alternates
from round to round (the VM changes speed from one process to the next: compare within a
round). The job: 4 ranks join a world (rank 0 meets the others on TFAB_MASTER_PORT), and an
acceptor process accepts 2 peers. With strangers, 16 silent clients, 16 that send garbage
(8 a length far beyond any message, 8 a short frame that is no message) and 4 that hold
another key (a HELLO, then a made-up PROOF) connect to rank 0's meeting port and to the
acceptor's port before any rank or peer comes. Every process has the same TFAB_AUTH_KEY and
TFAB_HANDSHAKE_TIMEOUT_MS (2000 ms).

Measured inside the processes, so that starting Python is not counted: ranks 1 to 3 and the
2 peers start, make their contexts and wait; then all go at once. The join is the longest
tfab.World() of ranks 1 to 3 (rank 0 started first, to listen); the accept, the longer
ctx.connect() of the 2 peers (the acceptor is accepting before they go). Printed:
the medians over the rounds, their ratio with strangers to without (the target is at most
1.5), each round's pair, and whether every stranger was closed by the listener within its
handshake deadline (1 s allowed past it for a loaded machine).

Loopback only. Needs the build's Python package and Debian's python3:

    PYTHONPATH=build/lib/python /usr/bin/python3 tools/bench/strangers.py [ROUNDS]
"""
import os
import selectors
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time

DEADLINE_MS = 2000
SLACK_S = 1.0
N_SILENT, N_GARBAGE, N_WRONG_KEY = 16, 16, 4
RANKS, PEERS = 4, 2
KEY = os.urandom(24).hex()


def child_env(extra=None):
    env = dict(os.environ)
    env.update({"TFAB_AUTH_KEY": KEY, "TFAB_HANDSHAKE_TIMEOUT_MS": str(DEADLINE_MS),
                "TFAB_LOG_LEVEL": "error", "TFAB_PROVIDER": env.get("TFAB_PROVIDER", "shm")})
    env.update(extra or {})
    return env


# The processes of the job: this script, in another role.

def ready():
    """Started, its context made: it waits for the word to go, so that each is timed alone."""
    print("READY", flush=True)
    sys.stdin.readline()


def role_rank(rank, port):
    import tfab
    ctx = tfab.Context()
    if rank:
        ready()
    t0 = time.perf_counter()
    w = tfab.World(ctx, rank=rank, size=RANKS, timeout=60)
    print("JOIN %.6f" % (time.perf_counter() - t0), flush=True)
    w.leave(timeout=30)
    ctx.close()


def role_acceptor():
    import tfab
    ctx = tfab.Context()
    print("PORT %d" % ctx.listen("127.0.0.1", 0), flush=True)
    peers = [ctx.accept(timeout=60) for _ in range(PEERS)]
    # a listener goes on listening: the strangers still in hand end by their deadline
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    while not stop.is_set():
        try:
            peers.append(ctx.accept(timeout=0.2))
        except TimeoutError:
            pass
    ctx.close()


def role_connector(port):
    import tfab
    ctx = tfab.Context()
    ready()
    t0 = time.perf_counter()
    peer = ctx.connect("127.0.0.1", port, timeout=60)
    print("CONNECT %.6f" % (time.perf_counter() - t0), flush=True)
    peer.close()
    ctx.close()


def spawn(*args):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *map(str, args)],
                            env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def value_of(proc, tag, timeout=90):
    out, _ = proc.communicate(timeout=timeout)
    for line in out.splitlines():
        if line.startswith(tag + " "):
            return float(line.split()[1])
    raise RuntimeError("no %s line from %s:\n%s" % (tag, proc.args, out))


# Strangers, all driven by one thread: each records how long after connecting it was closed.

class Stranger:
    def __init__(self, kind, port):
        self.kind, self.port = kind, port
        self.sock = None
        self.t0 = self.closed_after = None
        self.inbuf = b""
        self.state = 0

    def connect(self, until):
        while time.time() < until:
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=1)
                break
            except OSError:
                time.sleep(0.02)
        if self.sock is None:
            raise RuntimeError("cannot reach port %d" % self.port)
        self.t0 = time.perf_counter()
        if self.kind == "garbage-long":
            self.sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        elif self.kind == "garbage-short":
            self.sock.sendall(struct.pack(">I", 6) + b"hello!")
        elif self.kind == "wrong-key":
            self.sock.sendall(struct.pack(">I", 38) + b"TFAU\x01C" + os.urandom(32))
        self.sock.setblocking(False)

    def readable(self):
        try:
            data = self.sock.recv(4096)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self.closed_after = time.perf_counter() - self.t0
            return True
        self.inbuf += data
        # wrong-key: once the listener's HELLO is in, a made-up PROOF
        if self.kind == "wrong-key" and self.state == 0 and len(self.inbuf) >= 42:
            self.sock.setblocking(True)
            self.sock.sendall(struct.pack(">I", 36) + b"TFAP" + os.urandom(32))
            self.sock.setblocking(False)
            self.state = 1
        return False


def strangers_start(ports, until):
    kinds = (["silent"] * N_SILENT + ["garbage-long"] * (N_GARBAGE // 2) +
             ["garbage-short"] * (N_GARBAGE - N_GARBAGE // 2) + ["wrong-key"] * N_WRONG_KEY)
    strangers = [Stranger(k, p) for p in ports for k in kinds]
    for s in strangers:
        s.connect(until)
    return strangers


def strangers_watch(strangers, stop_at):
    sel = selectors.DefaultSelector()
    for s in strangers:
        sel.register(s.sock, selectors.EVENT_READ, s)
    open_ = len(strangers)
    while open_ and time.time() < stop_at:
        for key, _ in sel.select(timeout=0.1):
            if key.data.readable():
                sel.unregister(key.fileobj)
                open_ -= 1
    for s in strangers:
        s.sock.close()


def run_job(with_strangers):
    """One job: (join s, accept s, strangers or [])."""
    with socket.socket() as s:  # a free port for the meeting
        s.bind(("127.0.0.1", 0))
        master = s.getsockname()[1]
    os.environ["TFAB_MASTER_ADDR"] = "127.0.0.1"
    os.environ["TFAB_MASTER_PORT"] = str(master)
    acceptor = spawn("acceptor")
    port = int(acceptor.stdout.readline().split()[1])
    zero = spawn("rank", 0, master)
    strangers, watcher = [], None
    if with_strangers:
        strangers = strangers_start([master, port], time.time() + 20)
        watcher = threading.Thread(target=strangers_watch,
                                   args=(strangers, time.time() + 30), daemon=True)
        watcher.start()
    ranks = [spawn("rank", r, master) for r in range(1, RANKS)]
    conns = [spawn("connector", port) for _ in range(PEERS)]
    for p in ranks + conns:
        line = p.stdout.readline()
        if line.strip() != "READY":
            raise RuntimeError("%s did not start: %s" % (p.args, line))
    for p in ranks + conns:
        p.stdin.write("go\n")
        p.stdin.flush()
    join = max(value_of(p, "JOIN") for p in ranks)
    value_of(zero, "JOIN")
    accept = max(value_of(p, "CONNECT") for p in conns)
    if watcher:
        watcher.join(35)
    acceptor.stdin.write("done\n")
    acceptor.stdin.flush()
    acceptor.communicate(timeout=30)
    return join, accept, strangers


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    rows, late = [], []
    for r in range(rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        got = {}
        for with_strangers in order:
            join, accept, strangers = run_job(with_strangers)
            got[with_strangers] = (join, accept)
            late += [(s.kind, s.port, s.closed_after) for s in strangers
                     if s.closed_after is None or s.closed_after > DEADLINE_MS / 1e3 + SLACK_S]
        rows.append((got[False], got[True]))
        print("round %d: join %.1f ms without, %.1f ms with strangers; accept %.1f ms "
              "without, %.1f ms with" % (r + 1, got[False][0] * 1e3, got[True][0] * 1e3,
                                         got[False][1] * 1e3, got[True][1] * 1e3), flush=True)
    for i, what in ((0, "join (4 ranks)"), (1, "accept (2 peers)")):
        without = statistics.median(row[0][i] for row in rows)
        with_ = statistics.median(row[1][i] for row in rows)
        print("%-17s median without strangers %7.1f ms, with %7.1f ms: ratio %.2f "
              "(target <= 1.5)" % (what, without * 1e3, with_ * 1e3, with_ / without))
    total = rounds * 2 * (N_SILENT + N_GARBAGE + N_WRONG_KEY)
    if late:
        print("strangers NOT closed within %d ms (+%.0f s): %d of %d, e.g. %s" %
              (DEADLINE_MS, SLACK_S, len(late), total, late[:3]))
        return 1
    print("strangers: all %d closed by the listeners within their handshake deadline "
          "(%d ms, +%.0f s allowed)" % (total, DEADLINE_MS, SLACK_S))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        role_rank(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "acceptor":
        role_acceptor()
    elif len(sys.argv) > 1 and sys.argv[1] == "connector":
        role_connector(int(sys.argv[2]))
    else:
        sys.exit(main())
