"""The binding's API in one process: settings, errors, lifetimes, CUDA without a GPU, the
GIL released while waiting, futures and asyncio. Two contexts of this process are joined
through blobs, on the provider under test."""
import asyncio
import gc
import pathlib
import re
import threading
import time

import numpy as np
import pytest

import tfab
import tfabtest
from dlpack_ctypes import FakeDeviceTensor


@pytest.fixture
def pair():
    # Both sides of one process need progress while the test blocks in one of them.
    a = tfabtest.context(progress_thread=True)
    b = tfabtest.context(progress_thread=True)
    pa, pb = a.peer(), b.peer()
    blob_a, blob_b = pa.blob(), pb.blob()
    pa.connect(blob_b)
    pb.connect(blob_a)
    yield a, b, pa, pb
    b.close()
    a.close()


def test_version_is_the_library_s():
    # tfab.__version__ is the C library's, which is its headers' (include/tfab/tfab.h)
    header = (pathlib.Path(__file__).resolve().parents[2] / "include" / "tfab" / "tfab.h").read_text()
    parts = [re.search(rf"#define TFAB_VERSION_{p} (\d+)", header).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    assert tfab.__version__ == tfab.version() == ".".join(parts)


def test_settings_map_to_tfab_settings():
    with tfab.Context("shm", progress_thread=True, op_timeout_ms=1234) as ctx:
        assert ctx.progress_thread
        assert ctx.paths == ["shm"]
    with pytest.raises(tfab.ConfigError) as e:
        tfab.Context("shm", no_such_setting=1)
    assert "TFAB_NO_SUCH_SETTING" in str(e.value) and e.value.name == "TFAB_ERR_CONFIG"
    with pytest.raises(tfab.ConfigError) as e:
        tfab.Context("shm", progress_thread=7)
    assert "TFAB_PROGRESS_THREAD=7" in str(e.value)
    assert any(name == "TFAB_PROVIDER" for name, _, _ in tfab.settings())


def test_progress_thread_from_environment(monkeypatch):
    monkeypatch.setenv("TFAB_PROGRESS_THREAD", "1")
    with tfab.Context("shm") as ctx:
        assert ctx.progress_thread
    with tfab.Context("shm", progress_thread=False) as ctx:
        assert not ctx.progress_thread


def test_errors_are_typed():
    assert issubclass(tfab.TimeoutError, tfab.Error)
    assert issubclass(tfab.TimeoutError, TimeoutError)
    assert issubclass(tfab.PeerFailedError, tfab.Error)
    assert issubclass(tfab.ProtocolError, tfab.Error)
    e = tfab.errors._from_status(-257, "recv")
    assert isinstance(e, tfab.PeerFailedError) and e.name == "TFAB_ERR_PEER_FAILED"
    assert isinstance(tfab.errors._from_status(-258, "x"), tfab.ProtocolError)
    assert isinstance(tfab.errors._from_status(-266, "x"), tfab.TimeoutError)
    assert tfab.status_name(-22) == "EINVAL"


def test_send_recv_in_process(pair):
    a, b, pa, pb = pair
    x = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    f = a.send("k", 1, x)
    t = b.recv(pb, "k", 1, timeout=10)
    assert f.result(10) is None
    v = np.from_dlpack(t)
    np.testing.assert_array_equal(v, x)
    assert v.ctypes.data == t.data_ptr
    assert b.stats()["bytes_copied"] == 0
    assert "tfab.Tensor" in repr(t) and t.nbytes == x.nbytes and t.ndim == 3
    assert t.__dlpack_device__() == (1, 0)


def test_send_keeps_tensor_alive(pair):
    a, b, pa, pb = pair
    x = np.arange(1000, dtype=np.int32)
    rc = __import__("sys").getrefcount(x)
    f = a.send("alive", 1, x)
    assert __import__("sys").getrefcount(x) > rc  # held by the send
    t = b.recv(pb, "alive", 1, timeout=10)
    f.result(10)
    gc.collect()
    assert __import__("sys").getrefcount(x) == rc  # and let go when it completed
    np.testing.assert_array_equal(np.from_dlpack(t), x)


def test_unconsumed_capsule_lets_go(pair):
    import sys
    a, b, pa, pb = pair
    a.send("cap", 1, np.arange(4))
    t = b.recv(pb, "cap", 1, timeout=10)
    before = sys.getrefcount(t)
    cap = t.__dlpack__()
    assert sys.getrefcount(t) == before + 1  # the capsule's tensor holds it
    del cap  # never consumed: its destructor calls the deleter
    assert sys.getrefcount(t) == before
    v = np.from_dlpack(t)  # consumed: held until the array goes
    assert sys.getrefcount(t) == before + 1
    del v
    assert sys.getrefcount(t) == before


def test_view_outlives_tensor_object(pair):
    a, b, pa, pb = pair
    a.send("v", 1, np.full(100, 3, np.int16))
    v = np.from_dlpack(b.recv(pb, "v", 1, timeout=10))  # the Tensor itself is gone
    gc.collect()
    assert (v == 3).all()


def test_close_with_views_alive():
    a = tfabtest.context(progress_thread=True)
    b = tfabtest.context(progress_thread=True)
    pa, pb = a.peer(), b.peer()
    ba, bb = pa.blob(), pb.blob()
    pa.connect(bb)
    pb.connect(ba)
    a.send("c", 1, np.arange(10))
    v = np.from_dlpack(b.recv(pb, "c", 1, timeout=10))
    b.close()
    a.close()
    assert b.closed
    assert v.sum() == 45  # the pool memory stays until the last view goes
    with pytest.raises(ValueError):
        b.recv(pb, "c", 2, timeout=1)
    del v
    gc.collect()


def test_cuda_tensor_without_gpu_is_refused(pair):
    a, b, pa, pb = pair
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU (torch.cuda.is_available())")
    except ImportError:
        pass
    t = FakeDeviceTensor()
    with pytest.raises(tfab.Error) as e:
        a.send("gpu", 1, t)
    assert "CUDA" in str(e.value), str(e.value)
    assert t.deleted == 1  # the refused tensor was handed back


def test_not_a_tensor():
    with tfab.Context("shm") as ctx:
        with pytest.raises(TypeError, match="__dlpack__"):
            ctx.send("x", 1, object())
        with pytest.raises(ValueError, match="at most 512"):
            ctx.send("k" * 513, 1, np.zeros(1))
        with pytest.raises(ValueError, match="contiguous"):
            ctx.send("x", 1, np.zeros((4, 4))[:, ::2])


def test_negative_steps_are_refused(pair):
    """Negative steps are the collectives': each call that takes a step refuses one, and the
    error says so."""
    a, b, pa, pb = pair
    calls = [lambda: a.send("neg", -1, np.zeros(2)),
             lambda: b.recv(pb, "neg", -1, timeout=1),
             lambda: b.recv_async(pb, "neg", -2),
             lambda: b.step_cleanup(-3)]
    for call, step in zip(calls, [-1, -1, -2, -3]):
        with pytest.raises(ValueError) as e:
            call()
        assert "step %d is negative: steps are >= 0" % step in str(e.value), str(e.value)
    a.send("neg", 0, np.ones(2))
    assert np.from_dlpack(b.recv(pb, "neg", 0, timeout=10)).tolist() == [1.0, 1.0]


def test_failures_name_key_step_peer_and_path():
    """A failed operation's exception names it (key and step); one that failed with its peer
    quotes the library's warning, which names the peer's address and path."""
    a = tfabtest.context(op_timeout_ms=300)
    b = tfabtest.context(op_timeout_ms=300)
    try:
        pa, pb = a.peer(), b.peer()
        blob_a, blob_b = pa.blob(), pb.blob()
        pa.connect(blob_b)
        pb.connect(blob_a)
        # the stall deadline fails a receive of what is never sent
        f = b.recv_async(pb, "never", 7)
        with pytest.raises(tfab.TimeoutError) as e:
            f.result(10)
        assert "recv of 'never' step 7" in str(e.value), str(e.value)
        # a blocking receive's own timeout
        with pytest.raises(tfab.TimeoutError) as e:
            b.recv(pb, "late", 8, timeout=0.2)
        assert "recv of 'late' step 8" in str(e.value), str(e.value)
        # the peer leaves while a blocking receive waits on it
        leave = threading.Timer(0.3, a.close)
        leave.start()
        with pytest.raises(tfab.PeerFailedError) as e:
            b.recv(pb, "gone", 9, timeout=10)
        leave.join(10)
        text = str(e.value)
        assert "recv of 'gone' step 9: Peer failed" in text, text
        assert "1 receives ('gone' step 9) and 0 sends with it fail" in text, text
        assert " at " in text and " over %s failed" % pb.path in text, text
    finally:
        b.close()
        a.close()


class _DLPackOf:
    """A tensor that exports through __dlpack__ alone (no buffer protocol): a wrapper."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()


def test_read_only_destinations_refused(pair):
    # Every out= must be writable: refused before anything is posted, nothing written, and the
    # tensor left to a later receive into a writable buffer.
    a, b, pa, pb = pair
    sent = np.arange(1, 9, dtype=np.uint8)
    raw = bytes(8)  # what the read-only destinations share: their bytes are checked after
    ro = np.zeros(8, np.uint8)
    ro.flags.writeable = False
    outs = [bytes(8), ro, memoryview(raw), memoryview(bytearray(8)).toreadonly(),
            _DLPackOf(ro)]
    for step, out in enumerate(outs):
        for recv in (lambda: b.recv(pb, "ro", step, out=out, timeout=10),
                     lambda: b.recv_async(pb, "ro", step, out=out)):
            with pytest.raises(ValueError, match="out= is read-only") as e:
                recv()
            assert "nothing was posted" in str(e.value)
        a.send("ro", step, sent)
    time.sleep(0.5)  # the sends had time to land in anything posted
    assert outs[0] == bytes(8) and raw == bytes(8) and not ro.any()
    for step in range(len(outs)):
        ok = bytearray(8)
        assert b.recv(pb, "ro", step, out=ok, timeout=10) is ok
        assert bytes(ok) == sent.tobytes()
    # A source may be read-only.
    a.send("ro-src", 1, ro)
    a.send("ro-src", 2, memoryview(raw))
    assert not np.from_dlpack(b.recv(pb, "ro-src", 1, timeout=10)).any()
    assert b.recv(pb, "ro-src", 2, timeout=10).numpy().tobytes() == raw


def test_bad_timeouts_steps_and_dtypes_refused(pair):
    a, b, pa, pb = pair
    nan = float("nan")
    calls = {"recv": lambda t: b.recv(pb, "x", 1, timeout=t),
             "recv_strings": lambda t: b.recv_strings(pb, "x", 1, timeout=t),
             "flush": lambda t: a.flush(t),
             "accept": lambda t: b.accept(t),
             "connect": lambda t: b.connect("127.0.0.1", 1, t)}
    for name, call in calls.items():
        for bad in (nan, -1, -0.5):
            with pytest.raises(ValueError, match=r"timeout must be a number >= 0 \(seconds\) "
                               r"or None, got %s" % bad) as e:
                call(bad)
            assert not isinstance(e.value, tfab.Error), name
        with pytest.raises(TypeError, match="timeout must be a number"):
            call("1")
    with pytest.raises(ValueError, match="got nan"):
        b.recv_async(pb, "x", 1).result(nan)
    b.step_cleanup(1)
    # Steps are >= 0 (the library's negative ones are the world's).
    for call in (lambda: a.send("x", -1, np.zeros(2)),
                 lambda: a.send("x", -2, [b"s"]),
                 lambda: b.recv(pb, "x", -1, timeout=1),
                 lambda: b.recv_async(pb, "x", -1),
                 lambda: b.recv_strings(pb, "x", -1, timeout=1),
                 lambda: b.recv_strings_async(pb, "x", -1),
                 lambda: b.step_cleanup(-1)):
        with pytest.raises(ValueError, match=r"step -\d is negative: steps are >= 0"):
            call()
    # Strings are bytes: an object array (or a list) of anything else is refused, not sent
    # as the bytes() of its elements.
    with pytest.raises(TypeError, match="dtype object .* element 1 is int"):
        a.send("x", 1, np.array([b"s", 1], dtype=object))
    with pytest.raises(TypeError, match="list .* element 0 is int"):
        a.send("x", 1, [1, 2])
    with pytest.raises(TypeError, match="dtype <U2 cannot be sent: encode"):
        a.send("x", 1, np.array(["ab"]))
    with pytest.raises(TypeError, match=r"dtype datetime64\[s\] cannot be sent"):
        a.send("x", 1, np.array([1], dtype="datetime64[s]"))
    # Nothing of those was sent: a receive finds nothing.
    with pytest.raises(tfab.TimeoutError):
        b.recv(pb, "x", 1, timeout=0.3)
    # dtypes by the names users write.
    a.send("dt", 1, np.zeros(3, np.float32))
    with pytest.raises(tfab.OutMismatchError,
                       match="the destination is int32, the tensor sent is float32"):
        b.recv(pb, "dt", 1, out=np.zeros(3, np.int32), timeout=10)
    assert np.from_dlpack(b.recv(pb, "dt", 1, timeout=10)).dtype == np.float32


def test_gil_released_while_waiting(pair):
    a, b, pa, pb = pair
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    th = threading.Thread(target=tick)
    th.start()
    with pytest.raises(tfab.TimeoutError):
        b.recv(pb, "nothing", 1, timeout=0.5)
    stop.set()
    th.join(10)
    assert len(ticks) > 50, "another thread ran %d times in 0.5 s" % len(ticks)


def test_threads_share_a_context(pair):
    a, b, pa, pb = pair
    n = 200
    errors = []

    def recv_some(first):
        try:
            for s in range(first, n, 4):
                assert int(np.from_dlpack(b.recv(pb, "th", s, timeout=20))[0]) == s
        except Exception as e:  # noqa
            errors.append(e)

    threads = [threading.Thread(target=recv_some, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    futs = [a.send("th", s, np.array([s])) for s in range(n)]
    for f in futs:
        f.result(30)
    for th in threads:
        th.join(30)
    assert not errors, errors


def test_asyncio(pair):
    a, b, pa, pb = pair

    async def main():
        fut = asyncio.wrap_future(b.recv_async(pb, "aio", 1))
        a.send("aio", 1, np.arange(5))
        while not fut.done():
            await asyncio.sleep(0.001)
        return np.from_dlpack(await asyncio.wait_for(fut, 10)).tolist()

    assert asyncio.run(asyncio.wait_for(main(), 20)) == [0, 1, 2, 3, 4]


def test_future_completed_from_another_thread():
    # tfab.Future makes its condition only when something waits: a waiter, a done callback or
    # concurrent.futures.wait() that came before the completion is told, one after sees it.
    import concurrent.futures as cf
    with tfab.Context("shm") as ctx:
        start = time.monotonic()
        for i in range(200):
            f = tfab.Future(ctx)
            f._ctx = None  # nothing to drive: completed by the thread below
            seen = []
            f.add_done_callback(lambda x: seen.append(x.result()))
            # half complete after the waits below began, half perhaps before
            t = threading.Thread(target=lambda f=f, i=i: (time.sleep(0.001 * (i % 2)),
                                                          f.set_result(i)))
            t.start()
            if i % 4 < 2:  # blocked in result() (notified), or in wait() (its waiter told)
                assert f.result(timeout=60) == i
            assert cf.wait([f], timeout=60).done == {f}
            assert f.result(timeout=60) == i and f.done()
            t.join()
            assert seen == [i]
        # a waiter never notified would sit out its whole timeout each time (a hang, not speed)
        assert time.monotonic() - start < 30
        late = tfab.Future(ctx)
        late.set_result(1)
        seen = []
        late.add_done_callback(lambda x: seen.append(x.result()))
        assert seen == [1]
        with pytest.raises(cf.InvalidStateError):
            late.set_result(2)
        failed = tfab.Future(ctx)
        failed.set_exception(ValueError("x"))
        with pytest.raises(ValueError):
            failed.result()
        assert isinstance(failed.exception(), ValueError)


def test_library_completion_tells_waiters(pair):
    # A receive's future is completed by the library's callback in C (lib/python/future.c),
    # which writes the result straight in unless something waits on the future: then it goes
    # through set_result, which notifies. Each of the three ways to wait comes before the
    # send, on the progress thread's completion; a waiter not told would sit out its timeout.
    import concurrent.futures as cf
    a, b, pa, pb = pair
    start = time.monotonic()
    for i in range(60):
        f = b.recv_async(pb, "told", i)
        seen = []
        if i % 3 == 0:
            f.add_done_callback(lambda x: seen.append(int(np.from_dlpack(x.result())[0])))
        done = threading.Event()

        def wait(f=f, i=i):
            if i % 3 == 1:
                cf.wait([f], timeout=60)
            else:
                f.result(timeout=60)
            done.set()

        th = threading.Thread(target=wait)
        th.start()
        time.sleep(0.002)  # the waiter (or callback) is in place before the send
        a.send("told", i, np.array([i]))
        assert done.wait(30), "a waiter was not told of the library's completion"
        th.join(30)
        assert int(np.from_dlpack(f.result(0))[0]) == i
        if i % 3 == 0:
            assert seen == [i]
    assert time.monotonic() - start < 30
    # and with nothing waiting, the C path: a send's future and a receive into out=
    out = np.zeros(1, np.int64)
    f = b.recv_async(pb, "told", 100, out=out)
    s = a.send("told", 100, np.array([7]))
    assert f.result(30) is out and out[0] == 7
    assert s.result(30) is None and s.done() and s.exception() is None
    failed = b.recv_async(pb, "never", 1)
    b.step_cleanup(1)
    with pytest.raises(tfab.Error):
        failed.result(30)


def test_abort_fails_pending(pair):
    a, b, pa, pb = pair
    f = b.recv_async(pb, "ab", 1)
    b.abort()
    with pytest.raises(tfab.AbortedError):
        f.result(10)
    with pytest.raises(tfab.AbortedError):
        b.recv(pb, "ab", 2, timeout=1)


def test_peer_path(pair):
    a, b, pa, pb = pair
    assert pa.path == pb.path and pa.path in a.paths
    assert pa.status == 0


def test_exit_with_contexts_open():
    import subprocess
    import sys
    code = ("import numpy as np, tfab\n"
            "a = tfab.Context('shm', progress_thread=True)\n"
            "b = tfab.Context('shm', progress_thread=True)\n"
            "pa, pb = a.peer(), b.peer(); ba, bb = pa.blob(), pb.blob()\n"
            "pa.connect(bb); pb.connect(ba)\n"
            "a.send('never-taken', 1, np.zeros(10))\n"
            "f = b.recv_async(pb, 'never-sent', 1)\n"
            "t = (a.send('x', 1, np.ones(3)), b.recv(pb, 'x', 1, timeout=10))\n"
            "v = np.from_dlpack(t[1])\n")
    r = subprocess.run([sys.executable, "-c", code], timeout=60, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
