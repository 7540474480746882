#!/usr/bin/env python3
"""Joining a world (doc/world.md): ranks as processes of this host, from a torchrun-style
environment, and ranks as threads of one process through an allgather of their own; and a
rank killed or stopped in the middle of the collectives (test_coll.c, env mode).

    test_world.py WORLD_RANK TEST_COLL

Each case starts its ranks, bounds every wait, and checks what each rank printed
(world_rank.c): the ranks that should join joined, knew every rank's name and traded a
tensor with every other rank; the ones that should not failed with the named status, and
the log says why. Every process started is gone at the end.
"""
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import testprocs  # noqa: E402

RANK = None
COLL = None
WAIT_S = 60
BASE_PORT = 29600 + os.getpid() % 1000  # one per case below, apart from any other run's


def start(rank, size, port, extra=None, argv=None):
    env = dict(os.environ)
    env.update({"TFAB_RANK": str(rank), "TFAB_WORLD_SIZE": str(size),
                "TFAB_MASTER_ADDR": "127.0.0.1", "TFAB_MASTER_PORT": str(port),
                "TFAB_WORLD_NAME": "/job:worker/task:%d" % rank, "TFAB_LOG_LEVEL": "warn"})
    env.update(extra or {})
    return subprocess.Popen(argv or [RANK, "env"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(procs):
    return testprocs.finish(procs, WAIT_S)


class Failed(Exception):
    pass


def expect(cond, what, outs):
    if not cond:
        raise Failed(what + "\n" + "\n".join(
            "--- process %d (exit %s):\n%s" % (i, rc, out.strip()) for i, (rc, out) in
            enumerate(outs)))


def joined_well(outs, size):
    for rank, (rc, out) in enumerate(outs):
        expect(rc == 0 and "OK" in out.splitlines(), "rank %d did not join and trade" % rank,
               outs)
        expect("JOINED rank=%d size=%d" % (rank, size) in out, "rank %d: wrong rank" % rank,
               outs)
        for r in range(size):
            expect("NAME %d=/job:worker/task:%d" % (r, r) in out,
                   "rank %d does not know rank %d's name" % (rank, r), outs)


def case_four_ranks(port, provider):
    """4 ranks join, in an order other than theirs, and trade a tensor pairwise."""
    extra = {"TFAB_PROVIDER": provider} if provider else {}
    if provider and provider.startswith("ofi:"):
        extra["FI_PROVIDER"] = provider[4:]  # the suite runs with FI_PROVIDER=sockets
    procs = []
    for rank in (2, 0, 3, 1):
        procs.append((rank, start(rank, 4, port, extra)))
        time.sleep(0.05)
    procs.sort()
    joined_well(finish([p for _, p in procs]), 4)


def case_one_rank(port, _provider):
    """A world of one: nothing to meet."""
    joined_well(finish([start(0, 1, port)]), 1)


def case_missing_rank(port, _provider):
    """Rank 2 of 3 never comes: both others fail with TFAB_ERR_TIMEOUT, and say which."""
    extra = {"TFAB_WORLD_TIMEOUT_MS": "3000"}
    outs = finish([start(0, 3, port, extra), start(1, 3, port, extra)])
    for rank, (rc, out) in enumerate(outs):
        expect(rc == 3 and "JOIN_FAILED status=TFAB_ERR_TIMEOUT" in out,
               "rank %d did not fail with TFAB_ERR_TIMEOUT" % rank, outs)
    expect("rank(s) 2 of 3 did not arrive within 3000 ms" in outs[0][1],
           "rank 0 does not name the missing rank", outs)
    expect("rank 0 says: rank(s) 2 of 3 did not arrive" in outs[1][1],
           "rank 1 does not say what rank 0 said", outs)


def case_settings_differ(port, _provider):
    """Rank 1 sends small operands as tensors (TFAB_COLL_EAGER=0), rank 0 eager; then rank 1
    without the segments (TFAB_COLL_SHM=0), rank 0 with: each time the join fails on both
    with TFAB_ERR_CONFIG, naming the setting, rather than collectives that would wait for
    operands that go another way."""
    for name in ("TFAB_COLL_EAGER", "TFAB_COLL_SHM"):
        outs = finish([start(0, 2, port), start(1, 2, port, {name: "0"})])
        for rank, (rc, out) in enumerate(outs):
            expect(rc == 3 and "JOIN_FAILED status=TFAB_ERR_CONFIG" in out,
                   "rank %d did not fail with TFAB_ERR_CONFIG" % rank, outs)
            expect(name in out, "rank %d does not name %s" % (rank, name), outs)


def case_twice_and_wrong_size(port, _provider):
    """Rank 1 comes twice, and a rank says the world is larger: the second rank 1 (whichever
    came second) and the other size are refused by name, with TFAB_ERR_PROTOCOL; rank 0 then
    times out waiting for rank 2, and tells the rank 1 it took."""
    extra = {"TFAB_WORLD_TIMEOUT_MS": "5000"}
    zero = start(0, 3, port, extra)
    ones = [start(1, 3, port, extra), start(1, 3, port, extra)]
    wrong = start(2, 4, port, extra)
    outs = finish([zero] + ones + [wrong])
    expect("JOIN_FAILED status=TFAB_ERR_TIMEOUT" in outs[0][1] and
           "rank(s) 2 of 3 did not arrive" in outs[0][1], "rank 0 did not time out", outs)
    refused = [i for i in (1, 2) if "JOIN_FAILED status=TFAB_ERR_PROTOCOL" in outs[i][1] and
               "rank 1 arrived twice" in outs[i][1]]
    expect(len(refused) == 1, "not exactly one rank 1 was refused", outs)
    taken = 3 - refused[0]
    expect("JOIN_FAILED status=TFAB_ERR_TIMEOUT" in outs[taken][1] and
           "rank 0 says: rank(s) 2 of 3" in outs[taken][1],
           "the rank 1 that was taken did not hear of the timeout", outs)
    expect("JOIN_FAILED status=TFAB_ERR_PROTOCOL" in outs[3][1] and
           "rank 2 says the world has 4 ranks; rank 0 says 3" in outs[3][1],
           "the rank of another size was not refused", outs)


KEY = "0123456789abcdef-world-test"


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


class Stranger(threading.Thread):
    """A connection to rank 0's port that is no rank: silent, sending garbage (a length of
    528 and an HTTP request; a frame of 10 bytes that is no record), or holding another key
    (a HELLO, then a made-up PROOF). It records its address and how long after connecting
    rank 0 closed it (None: not within 30 s)."""

    def __init__(self, port, kind):
        super().__init__(daemon=True)
        self.port, self.kind = port, kind
        self.addr = self.closed_after = self.got = None
        self.connected = threading.Event()

    def run(self):
        end = time.time() + 10
        s = None
        while s is None and time.time() < end:
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=1)
            except OSError:
                time.sleep(0.05)
        if s is None:
            self.connected.set()
            return
        t0 = time.time()
        self.addr = "127.0.0.1:%d" % s.getsockname()[1]
        self.connected.set()
        s.settimeout(30)
        try:
            if self.kind == "garbage":
                s.sendall(b"\x00\x00\x02\x10" + b"GET / HTTP/1.0\r\n" * 40)
            elif self.kind == "junk":
                s.sendall(frame(b"0123456789"))
            elif self.kind == "wrong_key":
                s.sendall(frame(b"TFAU\x01C" + bytes(range(32))))
                hello = recv_exact(s, struct.unpack(">I", recv_exact(s, 4))[0])
                s.sendall(frame(b"TFAP" + bytes(32)))
                refusal = recv_exact(s, struct.unpack(">I", recv_exact(s, 4))[0])
                self.got = (hello[:4], hello[5:6], refusal)
            while s.recv(4096):
                pass
            self.closed_after = time.time() - t0
        except socket.timeout:
            pass
        except OSError:  # a reset, or closed in the middle of a message
            self.closed_after = time.time() - t0
        finally:
            s.close()


def strangers_at(port):
    """One stranger of each kind, connected to rank 0's port once it listens."""
    strangers = [Stranger(port, k) for k in ("silent", "garbage", "junk", "wrong_key")]
    for st in strangers:
        st.start()
    for st in strangers:
        st.connected.wait(15)
    return strangers


def strangers_refused(strangers, outs, deadline_s):
    for st in strangers:
        st.join(35)
        expect(st.addr is not None, "stranger %s could not reach rank 0's port" % st.kind,
               outs)
        expect(st.closed_after is not None and st.closed_after <= deadline_s,
               "rank 0 did not close the %s stranger within %.1f s (%s)" %
               (st.kind, deadline_s, st.closed_after), outs)
        expect(any(line.startswith("tfab warn [bootstrap]: rank 0: refused " + st.addr + ":")
                   for line in outs[0][1].splitlines()),
               "rank 0 did not log the %s stranger's refusal with its address %s" %
               (st.kind, st.addr), outs)
    wrong = [st for st in strangers if st.kind == "wrong_key"][0]
    expect(wrong.got == (b"TFAU", b"A", b"TFAR"),
           "the stranger with another key did not get a HELLO and a refusal: %r" %
           (wrong.got,), outs)


def case_strangers(port, _provider):
    """Before rank 1 comes, rank 0's port takes four strangers: a silent one, two that send
    garbage and one with another key. With a handshake deadline of 20 s, they must not hold
    rank 1 up: the world joins within TFAB_WORLD_TIMEOUT_MS = 5 s (a bound on the join,
    not a measure of speed). Each stranger is refused with a warning naming its address,
    and closed: the silent one when the meeting ends."""
    extra = {"TFAB_HANDSHAKE_TIMEOUT_MS": "20000", "TFAB_WORLD_TIMEOUT_MS": "5000",
             "TFAB_AUTH_KEY": KEY}
    zero = start(0, 2, port, extra)
    strangers = strangers_at(port)
    one = start(1, 2, port, extra)
    outs = finish([zero, one])
    joined_well(outs, 2)
    strangers_refused(strangers, outs, 15.0)


def case_strangers_deadline(port, _provider):
    """The same strangers with a handshake deadline of 500 ms and rank 1 coming 3 s later:
    rank 0 closes each within its deadline (1.5 s allowed for a loaded machine), and the world
    still joins."""
    extra = {"TFAB_HANDSHAKE_TIMEOUT_MS": "500", "TFAB_WORLD_TIMEOUT_MS": "20000",
             "TFAB_AUTH_KEY": KEY}
    zero = start(0, 2, port, extra)
    strangers = strangers_at(port)
    time.sleep(3)
    one = start(1, 2, port, extra)
    outs = finish([zero, one])
    joined_well(outs, 2)
    strangers_refused(strangers, outs, 2.0)


def case_no_world(port, _provider):
    """No TFAB_WORLD_SIZE: TFAB_ERR_CONFIG, saying so."""
    outs = finish([start(0, "", port)])
    expect(outs[0][0] == 3 and "JOIN_FAILED status=TFAB_ERR_CONFIG" in outs[0][1] and
           "no world to join" in outs[0][1], "joined without a size", outs)


def start_launched(names, rank, size, port, extra=None):
    """A rank started as a launcher starts it: names "torchrun" (RANK, WORLD_SIZE, LOCAL_RANK,
    LOCAL_WORLD_SIZE, MASTER_ADDR) or "ompi" (OMPI_COMM_WORLD_*, TFAB_MASTER_ADDR), no
    TFAB_RANK nor TFAB_WORLD_SIZE; port: TFAB_MASTER_PORT (None: unset)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TFAB_", "OMPI_", "PMIX_")) and
           k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                     "MASTER_PORT")}
    if names == "torchrun":
        env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1")
    else:
        env.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE=str(size),
                   OMPI_COMM_WORLD_LOCAL_RANK=str(rank), OMPI_COMM_WORLD_LOCAL_SIZE=str(size),
                   TFAB_MASTER_ADDR="127.0.0.1")
    if port is not None:
        env["TFAB_MASTER_PORT"] = str(port)
    env.update({"TFAB_WORLD_NAME": "/job:worker/task:%d" % rank, "TFAB_LOG_LEVEL": "info"})
    env.update(extra or {})
    return subprocess.Popen([RANK, "env"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def case_torchrun_names(port, _provider):
    """torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and MASTER_ADDR, with the
    world's own TFAB_MASTER_PORT: the ranks join, and the log says where each setting came
    from."""
    outs = finish([start_launched("torchrun", r, 2, port) for r in range(2)])
    joined_well(outs, 2)
    for r, (_, out) in enumerate(outs):
        expect("rank %d (from RANK) of 2 (from WORLD_SIZE), local rank '%d' (from LOCAL_RANK) "
               "of '2' (from LOCAL_WORLD_SIZE) on this host; meeting at 127.0.0.1:%d "
               "(address from MASTER_ADDR, port from TFAB_MASTER_PORT)" % (r, r, port) in out,
               "rank %d does not say where its settings came from" % r, outs)


def case_ompi_names(port, _provider):
    """Open MPI's OMPI_COMM_WORLD_* without mpirun's PMIx (no PMIX_RANK): the ranks join
    through rank 0, their rank and size from those."""
    outs = finish([start_launched("ompi", r, 2, port) for r in range(2)])
    joined_well(outs, 2)
    expect("(from OMPI_COMM_WORLD_RANK) of 2 (from OMPI_COMM_WORLD_SIZE)" in outs[1][1],
           "rank 1 does not say its rank came from Open MPI's variables", outs)


def case_torch_port_refused(port, _provider):
    """MASTER_PORT without TFAB_MASTER_PORT: torch's store listens there, so neither rank 0
    nor the others take it; the join fails at once with TFAB_ERR_CONFIG, saying why. TFAB_*
    wins over the launchers' names."""
    t0 = time.monotonic()
    outs = finish([start_launched("torchrun", r, 2, None, {"MASTER_PORT": str(port)})
                   for r in range(2)])
    for r, (rc, out) in enumerate(outs):
        expect(rc == 3 and "JOIN_FAILED status=TFAB_ERR_CONFIG" in out and
               "MASTER_PORT=%d belongs to torch's store" % port in out and
               "TFAB_MASTER_PORT" in out, "rank %d was not refused torch's port" % r, outs)
    expect(time.monotonic() - t0 < 20, "the refusal waited", outs)
    # TFAB_RANK and TFAB_WORLD_SIZE win over RANK and WORLD_SIZE, TFAB_MASTER_PORT over
    # MASTER_PORT: ranks 0 and 1 of 2 although RANK says 5 of 9.
    extra = {"MASTER_PORT": "1", "RANK": "5", "WORLD_SIZE": "9"}
    outs = finish([start_launched("torchrun", r, 2, port + 1000,
                                  dict(extra, TFAB_RANK=str(r), TFAB_WORLD_SIZE="2"))
                   for r in range(2)])
    joined_well(outs, 2)


def case_threads_allgather(_port, provider):
    """4 ranks as threads of one process, meeting through their own allgather: which needs
    no master port, so torchrun's MASTER_PORT refuses nothing."""
    env = dict(os.environ, TFAB_LOG_LEVEL="warn", MASTER_PORT="29500")
    env.pop("TFAB_MASTER_PORT", None)
    if provider:
        env["TFAB_PROVIDER"] = provider
    p = subprocess.Popen([RANK, "threads", "4"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    outs = finish([p])
    expect(outs[0][0] == 0 and outs[0][1].count("JOINED") == 4 and
           "OK" in outs[0][1].splitlines(), "the threads did not join and trade", outs)
    for r in range(4):
        expect(outs[0][1].count("NAME %d=/job:worker/task:%d" % (r, r)) == 4,
               "not every thread knows rank %d's name" % r, outs)


class Lines:
    """A process's output lines as they come, each with the time it was read."""

    def __init__(self, proc):
        self.proc, self.lines, self.cond = proc, [], threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cond.notify_all()
        with self.cond:
            self.lines.append((time.monotonic(), None))
            self.cond.notify_all()

    def wait_for(self, prefix, bound_s):
        end = time.monotonic() + bound_s
        with self.cond:
            while time.monotonic() < end:
                for t, line in self.lines:
                    if line is not None and line.startswith(prefix):
                        return t, line
                    if line is None:
                        return None
                self.cond.wait(timeout=max(0.01, end - time.monotonic()))
        return None

    def text(self):
        with self.cond:
            return "\n".join(l for _, l in self.lines if l is not None)


# The stall deadline and heartbeat of the fault cases, and what a loaded two-core machine
# adds to the bound on seeing a failure (as the fault suite allows, doc/faults.md).
DEADLINE_MS, BEAT_MS, SLACK_MS = 3000, 500, 1500


def coll_fault(port, sig, count=None, ring=False):
    """4 ranks allreduce 4 MiB (or count floats) again and again; rank 2 gets sig in the
    middle: every other rank's allreduce fails with a named status within the deadline plus
    a heartbeat, and every process ends."""
    extra = {"TFAB_OP_TIMEOUT_MS": str(DEADLINE_MS), "TFAB_HEARTBEAT_MS": str(BEAT_MS),
             "TFAB_COLL_PIECE": "262144"}
    if count:
        extra["TEST_COLL_COUNT"] = str(count)
    if ring:
        # a rank that fails stays (as long as the deadline), so that the others learn of
        # it from its draining collective (DEAD), not from its end
        extra["TEST_COLL_RING"] = "1"
        extra["TEST_COLL_LINGER_MS"] = str(DEADLINE_MS + BEAT_MS)
    procs = [start(r, 4, port, extra, [COLL, "env"]) for r in range(4)]
    lines = [Lines(p) for p in procs]
    try:
        seen = lines[0].wait_for("ITER 3", WAIT_S)
        outs = [(None, l.text()) for l in lines]
        expect(seen is not None, "rank 0 did not finish 4 allreduces", outs)
        t_fault = time.monotonic()
        os.kill(procs[2].pid, sig)
        for r in (0, 1, 3):
            got = lines[r].wait_for("COLL_FAILED", (DEADLINE_MS + BEAT_MS + SLACK_MS) / 1000.0
                                    + 5)
            outs = [(None, l.text()) for l in lines]
            expect(got is not None, "rank %d: no failure after rank 2's %s" %
                   (r, signal.Signals(sig).name), outs)
            at_ms = int(got[1].split("at_ms=")[1])
            took = at_ms - t_fault * 1000.0
            status = got[1].split("status=")[1].split()[0]
            print("# rank %d: %s after %.0f ms" % (r, status, took), flush=True)
            expect(status.startswith("TFAB_ERR_"), "rank %d: an unnamed status" % r, outs)
            # a death is seen as one (the bootstrap connection closes), not by a deadline
            expect(sig != signal.SIGKILL or status == "TFAB_ERR_PEER_FAILED",
                   "rank %d: %s after rank 2's death" % (r, status), outs)
            expect(took <= DEADLINE_MS + BEAT_MS + SLACK_MS,
                   "rank %d: the failure took %.0f ms" % (r, took), outs)
        for r in (0, 1, 3):
            try:
                rc = procs[r].wait(timeout=30)
            except subprocess.TimeoutExpired:
                rc = None
            outs = [(None, l.text()) for l in lines]
            expect(rc == 4, "rank %d did not end with the failure (exit %s)" % (r, rc), outs)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


class Skip(Exception):
    pass


def case_mpirun(_port, _provider):
    """mpirun -np 4 starts the ranks (no TFAB_RANK: they meet through mpirun's PMIx), which
    join, trade a tensor pairwise, and allreduce 4 MiB three times, checked."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise Skip("mpirun not found (Debian: openmpi-bin)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFAB_RANK")}
    env["TFAB_LOG_LEVEL"] = "warn"
    for argv, lines in (([RANK, "env"], ["OK"]), ([COLL, "env", "3"], ["ITER 2", "OK"])):
        p = subprocess.Popen([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "4"] +
                             argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        outs = finish([p])
        out = outs[0][1]
        if "built without PMIx" in out:
            raise Skip("tfab was built without PMIx (libpmix-dev)")
        expect(outs[0][0] == 0, "mpirun failed", outs)
        for rank in range(4):
            expect("JOINED rank=%d size=4" % rank in out, "rank %d did not join" % rank, outs)
        for line in lines:
            expect(out.splitlines().count(line) == 4, "not every rank printed " + line, outs)


def case_coll_kill(port, _provider):
    """A rank killed in the middle of an allreduce."""
    coll_fault(port, signal.SIGKILL)


def case_coll_stop(port, _provider):
    """A rank stopped in the middle of an allreduce (found by the deadline and heartbeats)."""
    coll_fault(port, signal.SIGSTOP)


def case_coll_kill_eager(port, _provider):
    """A rank killed in the middle of 8-byte allreduces, whose operands travel eager in
    control messages (COLL_DATA): the engine's failure of its peer reaches them."""
    coll_fault(port, signal.SIGKILL, 2)


def case_coll_stop_eager(port, _provider):
    """A rank stopped in the middle of 8-byte allreduces (eager operands)."""
    coll_fault(port, signal.SIGSTOP, 2)


def case_coll_kill_eager_ring(port, _provider):
    """A rank killed in the middle of ring allreduces of 256 bytes, whose pieces (64 bytes)
    go eager and wait for one another: the collectives that fail drain, sending DEAD in place
    of what they owe, which fails their neighbours' in turn."""
    coll_fault(port, signal.SIGKILL, 64, ring=True)


CASES = [
    (case_four_ranks, None),
    (case_four_ranks, "ofi:tcp"),
    (case_one_rank, None),
    (case_missing_rank, None),
    (case_twice_and_wrong_size, None),
    (case_settings_differ, None),
    (case_strangers, None),
    (case_strangers_deadline, None),
    (case_no_world, None),
    (case_torchrun_names, None),
    (case_ompi_names, None),
    (case_torch_port_refused, None),
    (case_threads_allgather, None),
    (case_coll_kill, None),
    (case_coll_stop, None),
    (case_coll_kill_eager, None),
    (case_coll_stop_eager, None),
    (case_coll_kill_eager_ring, None),
    (case_mpirun, None),
]


def main():
    """Every case but mpirun's, or the cases named after the two programs; 77 (skip) when
    every case run was skipped."""
    global RANK, COLL
    RANK = os.path.abspath(sys.argv[1])
    COLL = os.path.abspath(sys.argv[2])
    named = sys.argv[3:]
    cases = [(i, fn, provider) for i, (fn, provider) in enumerate(CASES)
             if (fn.__name__[5:] in named if named else fn is not case_mpirun)]
    failed = skipped = 0
    for n, (i, fn, provider) in enumerate(cases):
        name = fn.__name__[5:] + (" on " + provider if provider else "")
        t0 = time.time()
        try:
            fn(BASE_PORT + i, provider)
            print("ok %d - %s (%.1f s)" % (n + 1, name, time.time() - t0), flush=True)
        except Skip as e:
            skipped += 1
            print("ok %d - %s # SKIP %s" % (n + 1, name, e), flush=True)
        except Failed as e:
            failed += 1
            print("not ok %d - %s: %s" % (n + 1, name, e), flush=True)
    print("1..%d" % len(cases))
    if failed:
        return 1
    return 77 if cases and skipped == len(cases) else 0


if __name__ == "__main__":
    sys.exit(main())
