"""Ctrl-C in a blocking call: a child process blocks in one with a long timeout (30 s), the
test sends it SIGINT once it waits, and the child must raise KeyboardInterrupt well before the
timeout (the test bounds it), then use the same context: the tensor of that key and step, the
flush, the collective, the peer or the world still come. Each child prints what it saw; every
wait is bounded and every child ends."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import tfabtest
import worlds

HERE = os.path.dirname(os.path.abspath(__file__))

# Two contexts of the child joined through blobs; the child prints "waiting" right before it
# blocks, and "interrupted <seconds>" when KeyboardInterrupt came.
PRELUDE = """
import os, sys, threading, time
import numpy as np
import tfab
sys.path.insert(0, %r)
import tfabtest

def pair(**settings):
    a = tfabtest.context(progress_thread=True)
    b = tfabtest.context(**settings)
    pa, pb = a.peer(), b.peer()
    ba, bb = pa.blob(), pb.blob()
    pa.connect(bb)
    pb.connect(ba)
    return a, b, pa, pb

def blocked(call):
    print("waiting", flush=True)
    t0 = time.monotonic()
    try:
        call()
    except KeyboardInterrupt:
        print("interrupted %%.3f" %% (time.monotonic() - t0), flush=True)
        return
    raise SystemExit("no KeyboardInterrupt: the call returned")
""" % HERE


def interrupt(body, delay=0.5, bound=10.0, env=None, setup=""):
    """Run the child (PRELUDE + setup + body); SIGINT it delay seconds after each "waiting" it
    prints. Returns its other output lines; fails unless each SIGINT made it print
    "interrupted" within bound seconds, and it exited 0."""
    child_env = dict(os.environ, **(env or {}))
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + setup + textwrap.dedent(body)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=child_env)
    lines = []
    # Every read below is bounded: a child that hangs is killed (and the test fails).
    watchdog = threading.Timer(120, p.kill)
    watchdog.start()
    try:
        line = p.stdout.readline()
        assert line.strip() == "waiting", (line, p.stderr.read() if p.poll() else "")
        while line.strip() == "waiting":
            time.sleep(delay)
            sent = time.monotonic()
            p.send_signal(signal.SIGINT)
            line = p.stdout.readline()
            took = time.monotonic() - sent
            assert line.startswith("interrupted"), (line, p.stderr.read())
            assert took < bound, "KeyboardInterrupt %.1f s after SIGINT" % took
            lines.append(line.strip())
            line = p.stdout.readline()
        # read() and not communicate(): readline() may hold what came after the line
        rest, err = p.stdout.read(), p.stderr.read()
        assert p.wait(60) == 0, (p.returncode, line, rest, err)
        return lines + (line + rest).split()
    finally:
        watchdog.cancel()
        if p.poll() is None:
            p.kill()
            p.wait(10)


@pytest.mark.parametrize("progress_thread", [False, True])
@pytest.mark.parametrize("delay", [0.05, 0.5])
def test_recv_interrupted_then_received(progress_thread, delay):
    # Interrupted in the first slice (0.05 s) and after it (0.5 s); the same context then
    # receives the tensor of that key and step.
    out = interrupt("""
        a, b, pa, pb = pair(progress_thread=%r)
        blocked(lambda: b.recv(pb, "k", 7, timeout=30))
        a.send("k", 7, np.arange(5))
        t = b.recv(pb, "k", 7, timeout=10)
        assert np.from_dlpack(t).tolist() == [0, 1, 2, 3, 4]
        a.close(); b.close()
        print("received")
        """ % progress_thread, delay=delay)
    assert out[-1] == "received", out


def test_recv_out_and_strings_interrupted():
    out = interrupt("""
        a, b, pa, pb = pair()
        dst = np.zeros(3, np.int32)
        blocked(lambda: b.recv(pb, "o", 1, out=dst, timeout=30))
        a.send("o", 1, np.array([4, 5, 6], np.int32))
        try:
            b.recv(pb, "o", 1, out=np.zeros(4, np.int32), timeout=10)
        except tfab.OutMismatchError as e:
            assert "int32[4]" in str(e) and "int32[3]" in str(e), str(e)
        else:
            raise AssertionError("an out= that does not fit took it")
        other = np.zeros(3, np.int32)  # another array: the content is copied into it
        assert b.recv(pb, "o", 1, out=other, timeout=10) is other
        assert other.tolist() == [4, 5, 6]
        a.send("s", 1, [b"x", b"yz"])
        print(b.recv_strings(pb, "s", 1, timeout=10).tolist() == [b"x", b"yz"])
        a.close(); b.close()
        print("received")
        """)
    assert out[-2:] == ["True", "received"], out


def test_recv_interrupted_then_received_async():
    out = interrupt("""
        a, b, pa, pb = pair()
        blocked(lambda: b.recv_strings(pb, "s", 3, timeout=30))
        f = b.recv_strings_async(pb, "s", 3)
        a.send("s", 3, [b"late"])
        print(f.result(10).tolist() == [b"late"])
        a.close(); b.close()
        print("received")
        """)
    assert out[-2:] == ["True", "received"], out


@pytest.mark.parametrize("progress_thread", [False, True])
def test_flush_interrupted(progress_thread):
    out = interrupt("""
        a, b, pa, pb = pair()
        a.close()
        a = tfabtest.context(progress_thread=%r)
        pa, pb = a.peer(), b.peer()
        ba, bb = pa.blob(), pb.blob()
        pa.connect(bb)
        pb.connect(ba)
        f = a.send("f", 1, np.ones(4))
        blocked(lambda: a.flush(30))
        done = []
        th = threading.Thread(target=lambda: done.append(b.recv(pb, "f", 1, timeout=10)))
        th.start()
        a.flush(10)  # the same context: the send ends once received
        th.join(10)
        assert f.result(10) is None and done  # (its callback may still be on its way)
        a.close(); b.close()
        print("flushed")
        """ % progress_thread)
    assert out[-1] == "flushed", out


def test_accept_and_connect_interrupted():
    out = interrupt("""
        a = tfabtest.context()
        b = tfabtest.context(progress_thread=True)
        port = a.listen("127.0.0.1", 0)
        blocked(lambda: a.accept(30))
        q = []
        th = threading.Thread(target=lambda: q.append(b.connect("127.0.0.1", port, 10)))
        th.start()
        pa = a.accept(10)  # the accept that Ctrl-C interrupted took it
        th.join(10)
        b.send("c", 1, np.arange(3))
        print(np.from_dlpack(a.recv(pa, "c", 1, timeout=10)).tolist() == [0, 1, 2])
        b.close(); a.close()
        print("connected")
        """)
    assert out[-2:] == ["True", "connected"], out


def test_accept_interrupted_then_close_is_prompt():
    out = interrupt("""
        a = tfabtest.context()
        a.listen("127.0.0.1", 0)
        blocked(lambda: a.accept(60))
        t0 = time.monotonic()
        a.close()
        print("closed", time.monotonic() - t0 < 10)
        """)
    assert out[-2:] == ["closed", "True"], out


# A world of two in the child: rank 0 on the main thread, rank 1 on a thread that meets it
# through an allgather of their own and starts its collectives when told (go).
WORLD = """
sys.path.insert(0, %r)
import worlds
ex = worlds.Exchange(2)
go = threading.Event()
done1 = []
def rank1():
    with tfabtest.context() as c1, tfab.World(c1, rank=1, size=2, timeout=30,
                                              allgather=ex.allgather_of(1)) as w1:
        go.wait(60)
        x = np.full(4, 2.0, np.float32)
        w1.allreduce(x).result(30)
        w1.allreduce(np.ones(4, np.float32)).result(30)
        done1.append(x.tolist())
th = threading.Thread(target=rank1, daemon=True)
th.start()
""" % HERE


@pytest.mark.parametrize("progress_thread", [False, True])
def test_world_wait_result_and_leave_interrupted(progress_thread):
    out = interrupt(setup=WORLD, body="""
        ctx = tfabtest.context(progress_thread=%r)
        w = tfab.World(ctx, rank=0, size=2, timeout=30, allgather=ex.allgather_of(0))
        x = np.ones(4, np.float32)
        f = w.allreduce(x)
        blocked(lambda: w.wait(30))
        blocked(lambda: f.result(30))
        blocked(lambda: w.leave(30))
        assert w.joined  # as after a timeout
        go.set()
        w.wait(30)  # the same world: both collectives complete
        assert f.result(0) is x and x.tolist() == [3.0] * 4
        assert w.allreduce(np.ones(4, np.float32)).result(30).tolist() == [2.0] * 4
        w.leave()
        th.join(30)
        assert done1 == [[3.0] * 4]
        ctx.close()
        print("completed")
        """ % progress_thread)
    assert out[-1] == "completed" and len(out) == 4, out  # interrupted three times


def test_world_join_interrupted():
    port = worlds.free_port()
    out = interrupt("""
        ctx = tfabtest.context()
        blocked(lambda: tfab.World(ctx, rank=0, size=2, timeout=30))
        def rank1():
            with tfabtest.context() as c1, tfab.World(c1, rank=1, size=2, timeout=30) as w1:
                w1.allreduce(np.ones(2, np.int64)).result(30)
        th = threading.Thread(target=rank1, daemon=True)
        th.start()
        with tfab.World(ctx, rank=0, size=2, timeout=30) as w:  # takes the join that went on
            print(w.allreduce(np.ones(2, np.int64)).result(30).tolist() == [2, 2])
        th.join(30)
        ctx.close()
        print("joined")
        """, env={"TFAB_MASTER_ADDR": "127.0.0.1", "TFAB_MASTER_PORT": str(port)})
    assert out[-2:] == ["True", "joined"], out


def test_import_keeps_python_signal_handlers():
    # Debian's libfabric loads libinfinipath, whose constructor took SIGINT (and SIGTERM,
    # SIGSEGV, ...) for a handler that ends the process with exit status 1: importing tfab
    # gives them back, so Ctrl-C in plain Python code raises KeyboardInterrupt too, and
    # SIGTERM ends the process by the signal.
    out = interrupt("""
        blocked(lambda: time.sleep(30))
        print("slept")
        """)
    assert out[-1] == "slept", out
    p = subprocess.Popen([sys.executable, "-c", PRELUDE + "print('ready', flush=True)\n"
                          "time.sleep(30)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == -signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
