"""tfab.World and its collectives (doc/world.md) between spawned processes that join from a
torchrun-style environment, on the provider under test, and between threads of this process
that meet through an allgather of their own; every result checked bit for bit against the
library's documented order (worlds.py). Every wait is bounded, and every process ends."""
import gc
import os
import signal
import threading
import time
import weakref

import numpy as np
import pytest

import tfab
import tfabtest
import worlds
from dlpack_ctypes import FakeDeviceTensor


def run_world(n, func, *args, env=None, timeout=240, on_start=None, on_end=None):
    port = worlds.free_port()
    target = (worlds.rank_main, (n, port, env or {}, func, args))
    return tfabtest.run(*[target] * n, timeout=timeout, on_start=on_start, on_end=on_end)


@pytest.mark.parametrize("n", [2, 4])
def test_allreduce_every_dtype_op_and_size(n):
    pytest.importorskip("torch")
    checked = run_world(n, worlds.allreduce_matrix, 1000 * n)
    assert checked == [checked[0]] * n and checked[0] == 210


@pytest.mark.parametrize("n", [2, 4])
def test_broadcast_allgather_reduce_scatter_barrier(n):
    pytest.importorskip("torch")
    times = run_world(n, worlds.other_collectives, 77 * n)
    last_in = max(entered for entered, _ in times)
    first_out = min(left for _, left in times)
    # No rank leaves the barrier before the last one entered it (same host, same clock).
    assert first_out >= last_in - 0.01, times


@pytest.mark.parametrize("n", [2, 3])
def test_reduce_gather_scatter_alltoall(n):
    pytest.importorskip("torch")
    checked = run_world(n, worlds.rooted_and_alltoall, 91 * n)
    assert checked == [39 * n + 9] * n, checked  # every case, on every rank


@pytest.mark.parametrize("n", [2, 4])
def test_many_collectives_in_flight(n):
    assert run_world(n, worlds.many_in_flight, 5, 4) == [4] * n


def test_many_collectives_in_flight_progress_thread():
    # Completions on the progress thread; futures wait on their condition.
    assert run_world(4, worlds.many_in_flight, 9, 4,
                     env={"TFAB_PROGRESS_THREAD": "1"}) == [4] * 4


def test_waiting_ranks_yield_the_cores():
    # Four ranks on two cores: a rank that waits in result() yields its core while idle, so
    # that the ranks it waits for run (about 0.15 ms an allreduce here, where spinning took
    # a scheduler's time slice, 9 to 17 ms).
    took = run_world(4, worlds.small_allreduces, 400)
    assert max(took) < 2.0, took


def test_context_closed_mid_collective():
    assert run_world(2, worlds.close_mid_collective, timeout=120) == ["AbortedError",
                                                                      "PeerFailedError"]


def test_names_peers_and_refusals():
    got = run_world(2, worlds.names_and_peers)
    names = ["/job:worker/task:0", "/job:worker/task:1"]
    assert [g[0] for g in got] == [names, names]
    assert all(paths and all(paths) for _, paths, _ in got)
    # int8 compression within its rounding, and about a quarter of the bytes on the wire.
    assert got[0][2] == got[1][2] == "ok", got


def test_gil_released_in_join_and_waits():
    port = worlds.free_port()
    counts = tfabtest.run(*[(worlds.join_late, (2, port, {}))] * 2, timeout=120)[0]
    # Rank 0 waited about 1.5 s in the join and 1 s in each wait; a thread that ticks every
    # millisecond ran meanwhile (it would not have run at all with the GIL held).
    assert counts["join"] > 100 and counts["wait"] > 50 and counts["result"] > 50, counts


# The stall deadline and heartbeat of the fault case, and what a loaded two-core machine adds
# (as test/world/test_world.py allows).
DEADLINE_MS, BEAT_MS, SLACK_MS = 3000, 500, 1500


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGSTOP"])
def test_rank_killed_or_stopped_mid_allreduce(sig):
    if tfabtest.PROVIDER.startswith("ofi:shm"):
        pytest.skip("a killed process leaves libfabric shm's /dev/shm objects behind")
    ready = tfabtest.SPAWN.Queue()
    victim = 2
    t_fault = []

    def fault_when_running(procs):
        for _ in range(4):
            ready.get(timeout=120)
        time.sleep(0.3)  # in the middle of the allreduces
        t_fault.append(time.time())
        os.kill(procs[victim].pid, getattr(signal, sig))
        return [victim]

    def end(procs):
        if procs[victim].is_alive():
            procs[victim].kill()  # a stopped one too

    env = {"TFAB_OP_TIMEOUT_MS": str(DEADLINE_MS), "TFAB_HEARTBEAT_MS": str(BEAT_MS),
           "TFAB_COLL_PIECE": "262144"}
    got = run_world(4, worlds.fault_rank, ready, env=env, timeout=180,
                    on_start=fault_when_running, on_end=end)
    for r in (0, 1, 3):
        cls, name, at = got[r]
        took_ms = (at - t_fault[0]) * 1000.0
        print("rank %d: %s (%s) after %.0f ms" % (r, cls, name, took_ms))
        assert name.startswith("TFAB_ERR_") and cls in ("PeerFailedError", "TimeoutError"), \
            got[r]
        assert took_ms <= DEADLINE_MS + BEAT_MS + SLACK_MS, (r, took_ms)


def test_allgather_callable_threads():
    n = 4
    exchange = worlds.Exchange(n)
    results = [None] * n
    threads = [threading.Thread(target=worlds.thread_rank, args=(r, n, exchange, results),
                                daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads), "a rank still runs after 90 s"
    for r in range(n):
        if isinstance(results[r], BaseException):
            raise results[r]
    assert results == [["thread %d" % k for k in range(n)]] * n


def test_allgather_callable_errors():
    class LauncherDown(Exception):
        pass

    def raises(mine):
        raise LauncherDown("the launcher is gone")

    with tfabtest.context() as ctx:
        with pytest.raises(LauncherDown):
            tfab.World(ctx, rank=0, size=2, allgather=raises, timeout=5)
        with pytest.raises(ValueError, match="2 entries for a world of 3"):
            tfab.World(ctx, rank=0, size=3, allgather=lambda mine: [mine, mine], timeout=5)
        with pytest.raises(ValueError, match="bytes"):
            tfab.World(ctx, rank=0, size=2, allgather=lambda mine: [mine, b"x"], timeout=5)
        with pytest.raises(TypeError):
            tfab.World(ctx, rank=0, size=2, allgather=lambda mine: None, timeout=5)
        with pytest.raises(TypeError):
            tfab.World(ctx, rank=0, size=2, allgather=42)
        # The world's refusal of a record that is no rank's: the library's error.
        with pytest.raises(tfab.ProtocolError):
            tfab.World(ctx, rank=0, size=2, allgather=lambda mine: [mine, mine], timeout=5)
        # None of these joined: the context takes a world.
        with tfab.World(ctx, rank=0, size=1) as w:
            assert w.size == 1


def test_world_of_one_lifetimes_and_refusals():
    with tfabtest.context() as ctx:
        w = tfab.World(ctx, rank=0, size=1, name="solo")
        assert (w.rank, w.size, w.name(), w.joined) == (0, 1, "solo", True)
        assert w.failed == []  # none yet, in the order seen
        with pytest.raises(ValueError, match="one per context"):
            tfab.World(ctx, rank=0, size=1)
        # The tensors are held until the future completes, and let go after.
        a = np.arange(6, dtype=np.float32)
        ref = weakref.ref(a)
        f = w.allreduce(a, op="max")
        assert f.result(5) is a
        del a, f
        gc.collect()
        assert ref() is None, "the allreduce kept its tensor"
        # leave() waits for what is in flight; the world's peers and calls go with it.
        w.leave()
        assert not w.joined and repr(w) == "tfab.World(left)"
        with pytest.raises(ValueError, match="left"):
            w.allreduce(np.zeros(2, np.float32))
        w.leave()  # again: nothing
        # A second world on the same context, dropped without leave(): left by its dealloc.
        w2 = tfab.World(ctx, rank=0, size=1)
        del w2
        gc.collect()
        w3 = tfab.World(ctx, rank=0, size=1)
    # Closing the context leaves its world.
    assert not w3.joined
    # A world made without a context makes one of its own, closed when it is left.
    with tfab.World(rank=0, size=1) as w4:
        own = w4.context
        assert w4.allreduce(np.ones(3, np.int64)).result(5).tolist() == [1, 1, 1]
    assert own.closed
    with pytest.raises(tfab.ConfigError):
        tfab.World(tfabtest.context(), rank=1, size=2, timeout=1)  # no TFAB_MASTER_ADDR


def test_dtype_refusals_name_the_dtypes():
    """A collective refused for its dtype names the dtypes as users write them."""
    with tfabtest.context() as ctx, tfab.World(ctx, rank=0, size=1) as w:
        with pytest.raises(TypeError, match="not complex64$"):
            w.allreduce(np.zeros(4, np.complex64))
        with pytest.raises(TypeError, match="not bool$"):
            w.allreduce(np.zeros(4, np.bool_))
        with pytest.raises(TypeError, match="out= is float64, its input float32"):
            w.allreduce(np.zeros(4, np.float32), out=np.zeros(4, np.float64))
        with pytest.raises(TypeError, match="out= is int32, its input int64"):
            w.reduce_scatter(np.zeros(4, np.int64), np.zeros(4, np.int32))


def test_world_of_one_new_collectives():
    """reduce, gather, scatter and alltoall on a world of one: their results, in place and
    not, and the tensors let go once the future completes."""
    with tfabtest.context() as ctx, tfab.World(ctx, rank=0, size=1) as w:
        a = np.array([3, -128, 127], np.int8)
        assert w.reduce(a, op="prod").result(5) is a and a.tolist() == [3, -128, 127]
        out = np.zeros(3, np.int8)
        assert w.reduce(a, out=out, op="avg").result(5) is out and out.tolist() == a.tolist()
        g = w.gather(np.arange(3, dtype=np.uint8)).result(5)
        assert g.shape == (1, 3) and g.tolist() == [[0, 1, 2]]
        part = np.zeros(2, np.float64)
        assert w.scatter(np.array([1.5, 2.5]), part).result(5) is part
        assert part.tolist() == [1.5, 2.5]
        b = np.zeros(4, np.int16)
        ref = weakref.ref(b)
        assert w.alltoall(np.arange(4, dtype=np.int16), b).result(5) is b
        assert b.tolist() == [0, 1, 2, 3]
        del b
        gc.collect()
        assert ref() is None and w._w.inflight == 0


def test_world_of_one_read_only_destinations():
    # What a collective writes must be writable (refused before it starts); what it only
    # reads may be read-only.
    ro = np.arange(4, dtype=np.float32)
    ro.flags.writeable = False
    with tfabtest.context() as ctx, tfab.World(ctx, rank=0, size=1) as w:
        for start in (lambda: w.allreduce(ro),
                      lambda: w.allreduce(np.ones(4, np.float32), out=ro),
                      lambda: w.allgather(np.ones(4, np.float32), out=ro),
                      lambda: w.reduce_scatter(np.ones(4, np.float32), out=ro)):
            with pytest.raises(ValueError, match="read-only"):
                start()
        assert w._w.inflight == 0 and ro.tolist() == [0, 1, 2, 3]
        out = np.zeros(4, np.float32)
        assert w.allreduce(ro, out=out).result(5) is out and out.tolist() == [0, 1, 2, 3]
        assert w.broadcast(ro).result(5) is ro  # the root's tensor is only read


def test_world_of_one_bad_arguments_named():
    with tfabtest.context() as ctx:
        with pytest.raises(ValueError, match="timeout must be a number >= 0 .* got nan"):
            tfab.World(ctx, rank=0, size=1, timeout=float("nan"))
        with tfab.World(ctx, rank=0, size=1) as w:
            with pytest.raises(TypeError, match=r"uint64\) tensors, not complex64"):
                w.allreduce(np.ones(4, np.complex64))
            with pytest.raises(ValueError, match="op is one of"):
                w.allreduce(np.ones(4, np.int8), op="xor")
            with pytest.raises(ValueError, match="no root 1 in a world of 1"):
                w.reduce(np.ones(4, np.int8), root=1)
            with pytest.raises(TypeError, match="not bool$"):
                w.reduce(np.ones(4, np.bool_))
            with pytest.raises(ValueError, match="gather's out holds the world's size"):
                w.gather(np.ones(4, np.int32), out=np.ones(3, np.int32))
            with pytest.raises(ValueError, match="scatter's root needs"):
                w.scatter(None, np.ones(4, np.int32))
            with pytest.raises(ValueError, match="send_counts has 2 entries, not 1"):
                w.alltoall(np.ones(4, np.int32), np.ones(4, np.int32), [2, 2], None)
            with pytest.raises(ValueError, match="counts are >= 0"):
                w.alltoall(np.ones(4, np.int32), np.ones(4, np.int32), [-4], None)
            with pytest.raises(tfab.Error, match="EINVAL"):  # counts that do not add up
                w.alltoall(np.ones(4, np.int32), np.ones(4, np.int32), [3], [3])
            assert w._w.inflight == 0
            with pytest.raises(TypeError, match="allreduce's out= is int32, its input float32"):
                w.allreduce(np.ones(4, np.float32), out=np.ones(4, np.int32))
            with pytest.raises(TypeError, match="allgather's out= is float64, its input int32"):
                w.allgather(np.ones(4, np.int32), out=np.ones(4, np.float64))
            for bad in (float("nan"), -1):
                with pytest.raises(ValueError, match="timeout must be a number >= 0"):
                    w.wait(bad)
                with pytest.raises(ValueError, match="timeout must be a number >= 0"):
                    w.leave(bad)
            assert w.joined


def test_gpu_tensors_through_host_proxies():
    """A CUDA tensor in a collective goes through host proxies: here a world of one, with
    host memory claiming to be a GPU's (TFAB_CUDA_EMULATE): the input is read and the result
    lands in out=. Without a GPU or the emulation, the library refuses it and says why."""
    with tfabtest.context(cuda_emulate=1) as ctx, tfab.World(ctx, rank=0, size=1) as w:
        a, b = FakeDeviceTensor(8), FakeDeviceTensor(8)
        for i in range(8):
            a.buf[i] = i + 0.5
        copied = ctx.stats()["bytes_copied"]
        assert w.allreduce(a, out=b).result(5) is b
        assert list(b.buf) == [i + 0.5 for i in range(8)]
        assert ctx.stats()["bytes_copied"] - copied == 2 * 8 * 4  # in, and the result out
    try:
        import torch
        if torch.cuda.is_available():
            return  # a real GPU takes it: nothing to refuse
    except ImportError:
        pass
    with tfabtest.context() as ctx, tfab.World(ctx, rank=0, size=1) as w:
        with pytest.raises(tfab.Error) as e:
            w.allreduce(FakeDeviceTensor(4)).result(5)
        assert "CUDA" in str(e.value), str(e.value)
