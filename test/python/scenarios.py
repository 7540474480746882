"""What the spawned processes of test_transfer.py run (importable by the children)."""
import gc
import os
import resource
import sys
import time

import numpy as np

import tfabtest

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
SHAPES = [(3,), (2, 3), (), (0,), (4, 1, 2), (0, 5), (7,)]


def make(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape)) if shape else 1
    if dtype == "bool":
        a = rng.integers(0, 2, n).astype(bool)
    elif dtype.startswith("complex"):
        a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
    elif dtype.startswith("float"):
        a = rng.standard_normal(n).astype(dtype)
    else:
        a = rng.integers(0, 100, n).astype(dtype)
    return a.reshape(shape)


def as_numpy(t):
    """A view of a received tensor: numpy.from_dlpack where NumPy takes the dtype."""
    if t.dtype == "bool":
        return t.numpy()  # NumPy 1.24's from_dlpack refuses bool
    return np.from_dlpack(t)


def dtypes_send(index, ports, nsteps):
    with tfabtest.context() as ctx:
        peers = tfabtest.connect_all(ctx, index, ports, 2)
        futs = []
        for i, dt in enumerate(DTYPES):
            futs.append(ctx.send("dt/" + dt, 1, make(dt, (5, 3), i)))
            futs.append(ctx.send("dt0/" + dt, 1, make(dt, (), i)))
            futs.append(ctx.send("dte/" + dt, 1, make(dt, (0, 4), i)))
        for step, shape in enumerate(SHAPES):
            futs.append(ctx.send("shape", step, make("float32", shape, step)))
        for f in futs:
            assert f.result(60) is None
        peers[1].close()
        return len(futs)


def dtypes_recv(index, ports, nsteps):
    with tfabtest.context() as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[0]
        for i, dt in enumerate(DTYPES):
            for prefix, shape in (("dt/", (5, 3)), ("dt0/", ()), ("dte/", (0, 4))):
                t = ctx.recv(peer, prefix + dt, 1, timeout=60)
                assert t.dtype == dt, (t.dtype, dt)
                assert t.shape == shape, (t.shape, shape)
                a = as_numpy(t)
                assert a.dtype == np.dtype(dt) and a.shape == shape
                np.testing.assert_array_equal(a, make(dt, shape, i))
                if a.size:
                    # Zero copy: the array is a view of the received buffer.
                    assert a.ctypes.data == t.data_ptr
        for step, shape in enumerate(SHAPES):
            t = ctx.recv(peer, "shape", step, timeout=60)
            a = np.from_dlpack(t)
            assert a.shape == shape
            np.testing.assert_array_equal(a, make("float32", shape, step))
        stats = ctx.stats()
        assert stats["bytes_copied"] == 0, stats
        assert stats["bytes_received"] > 0, stats
        return peer.path


def torch_a(index, ports, _):
    import torch
    with tfabtest.context(progress_thread=True) as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[1]
        futs = [ctx.send("t/f32", 1, torch.arange(12, dtype=torch.float32).reshape(3, 4)),
                ctx.send("t/bf16", 1, torch.arange(8, dtype=torch.bfloat16)),
                ctx.send("t/i64", 1, torch.tensor(7, dtype=torch.int64)),
                ctx.send("t/bool", 1, torch.tensor([True, False, True]))]
        for f in futs:
            f.result(60)
        # And back: into a torch tensor of ours, in place.
        out = torch.zeros(2, 5, dtype=torch.float64)
        got = ctx.recv(peer, "back", 1, out=out, timeout=60)
        assert got is out
        assert torch.equal(out, torch.arange(10, dtype=torch.float64).reshape(2, 5) * 2)
        fut = ctx.recv_async(peer, "back", 2)
        t = torch.from_dlpack(fut.result(60))
        assert torch.equal(t, torch.ones(3, dtype=torch.int32))
        return True


def torch_b(index, ports, _):
    import torch
    with tfabtest.context() as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[0]
        t = ctx.recv(peer, "t/f32", 1, timeout=60)
        x = torch.from_dlpack(t)
        assert x.data_ptr() == t.data_ptr
        assert torch.equal(x, torch.arange(12, dtype=torch.float32).reshape(3, 4))
        t = ctx.recv(peer, "t/bf16", 1, timeout=60)
        assert t.dtype == "bfloat16"
        assert torch.equal(torch.from_dlpack(t), torch.arange(8, dtype=torch.bfloat16))
        assert torch.from_dlpack(ctx.recv(peer, "t/i64", 1, timeout=60)).item() == 7
        t = ctx.recv(peer, "t/bool", 1, timeout=60)
        assert t.dtype == "bool"
        b = torch.from_numpy(t.numpy())  # torch 1.13 takes no bool through DLPack
        assert b.dtype == torch.bool and b.tolist() == [True, False, True]
        assert b.data_ptr() == t.data_ptr
        ctx.send("back", 1, torch.arange(10, dtype=torch.float64).reshape(2, 5) * 2).result(60)
        ctx.send("back", 2, torch.ones(3, dtype=torch.int32)).result(60)
        assert ctx.stats()["bytes_copied"] == 0
        return True


def out_send(index, ports, _):
    with tfabtest.context() as ctx:
        tfabtest.connect_all(ctx, index, ports, 2)
        ctx.send("o", 1, np.arange(12, dtype=np.int32).reshape(3, 4)).result(60)
        return True


def out_recv(index, ports, _):
    import tfab
    with tfabtest.context() as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[0]
        errors = []
        for out in (np.zeros((3, 4), np.float32), np.zeros((4, 3), np.int32),
                    np.zeros((3, 5), np.int32)):
            try:
                ctx.recv(peer, "o", 1, out=out, timeout=60)
            except tfab.OutMismatchError as e:
                assert isinstance(e, ValueError) and "out=" in str(e)
                errors.append(e.name)
            else:
                raise AssertionError("out=%s %s was taken" % (out.dtype, out.shape))
        strided = np.zeros((3, 8), np.int32)[:, ::2]
        try:
            ctx.recv(peer, "o", 1, out=strided, timeout=60)
        except ValueError as e:
            assert "contiguous" in str(e)
            errors.append("strided")
        else:
            raise AssertionError("a strided out= was taken")
        # The refused receives did not take the tensor: a fitting one does.
        out = np.full((3, 4), -1, np.int32)
        assert ctx.recv(peer, "o", 1, out=out, timeout=60) is out
        np.testing.assert_array_equal(out, np.arange(12).reshape(3, 4))
        return errors


def strings_send(index, ports, _):
    with tfabtest.context() as ctx:
        tfabtest.connect_all(ctx, index, ports, 2)
        futs = [ctx.send("s", 1, [b"alpha", b"", b"\x00\xffbin"]),
                ctx.send("s", 2, np.array([[b"a", b"bb"], [b"ccc", b"d"]], dtype=object)),
                ctx.send("s", 3, b"scalar"),
                ctx.send("s", 4, None, is_dead=True)]
        for f in futs:
            f.result(60)
        return True


def strings_recv(index, ports, _):
    with tfabtest.context() as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[0]
        a = ctx.recv_strings(peer, "s", 1, timeout=60)
        assert a.tolist() == [b"alpha", b"", b"\x00\xffbin"]
        b = ctx.recv(peer, "s", 2, timeout=60)  # recv() takes strings too
        assert b.shape == (2, 2) and b.tolist() == [[b"a", b"bb"], [b"ccc", b"d"]]
        c = ctx.recv_strings_async(peer, "s", 3).result(60)
        assert c.shape == () and c.item() == b"scalar"
        assert ctx.recv(peer, "s", 4, timeout=60) is None  # dead
        return True


def timeout_recv(index, ports, _):
    import tfab
    with tfabtest.context() as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[0]
        t0 = time.monotonic()
        try:
            ctx.recv(peer, "never", 1, timeout=0.5)
        except tfab.TimeoutError as e:
            assert isinstance(e, TimeoutError) and e.name == "ETIMEDOUT"
        else:
            raise AssertionError("no timeout")
        elapsed = time.monotonic() - t0
        assert 0.4 < elapsed < 5, elapsed
        fut = ctx.recv_async(peer, "never", 2)
        try:
            fut.result(0.3)
        except TimeoutError:
            pass
        else:
            raise AssertionError("a future without a send completed")
        ctx.step_cleanup(2)
        try:
            fut.result(10)
        except tfab.AbortedError:
            pass
        ctx.send("done", 1, np.zeros(1)).result(30)
        return elapsed


def timeout_peer(index, ports, _):
    with tfabtest.context() as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[1]
        ctx.recv(peer, "done", 1, timeout=60)
        return True


def killed_sender(index, ports, event):
    with tfabtest.context(heartbeat_ms=100) as ctx:
        tfabtest.connect_all(ctx, index, ports, 2)
        ctx.send("k", 1, np.ones(4)).result(60)
        time.sleep(120)  # killed here


def killed_receiver(index, ports, event):
    import tfab
    with tfabtest.context(heartbeat_ms=100, op_timeout_ms=3000) as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[0]
        ctx.recv(peer, "k", 1, timeout=60)
        event.set()
        t0 = time.monotonic()
        try:
            ctx.recv(peer, "k", 2, timeout=60)
        except (tfab.PeerFailedError, tfab.TimeoutError) as e:
            assert e.name in ("TFAB_ERR_PEER_FAILED", "TFAB_ERR_TIMEOUT"), e.name
            return (e.name, time.monotonic() - t0, peer.status)
        raise AssertionError("a receive from a killed peer returned")


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)


def loop_send(index, ports, n):
    with tfabtest.context() as ctx:
        tfabtest.connect_all(ctx, index, ports, 2)
        a = np.arange(1024, dtype=np.float32)  # 4 KiB: a leaked block shows
        window = []
        for step in range(n):
            window.append(ctx.send("loop", step, a))
            if len(window) >= 32:
                window.pop(0).result(60)
        for f in window:
            f.result(60)
        del window, f
        gc.collect()
        # Every send let its array go (one reference here, one in getrefcount's argument).
        assert sys.getrefcount(a) == 2, sys.getrefcount(a)
        return True


def loop_recv(index, ports, n):
    with tfabtest.context() as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, 2)[0]
        probe = max(n // 10, 1)
        rss = objs = refs = None
        want = np.arange(1024, dtype=np.float32)
        for step in range(n):
            t = ctx.recv(peer, "loop", step, timeout=60)
            a = np.from_dlpack(t)
            if step % 997 == 0:
                np.testing.assert_array_equal(a, want)
            del a, t
            if step == probe:
                gc.collect()
                rss, objs = rss_kib(), len(gc.get_objects())
                refs = (sys.getrefcount(peer), sys.getrefcount(ctx._c), sys.getrefcount(None))
        gc.collect()
        grown = rss_kib() - rss
        objs_grown = len(gc.get_objects()) - objs
        # No reference leaked to what every receive touches (None: within noise).
        now = (sys.getrefcount(peer), sys.getrefcount(ctx._c), sys.getrefcount(None))
        assert now[:2] == refs[:2], (refs, now)
        assert abs(now[2] - refs[2]) < 1000, (refs, now)
        return (grown, objs_grown, refs)


def fan_source(index, ports, nprocs):
    """Process 0 sends each receiver a tensor of its own (send to peer) and one for anyone."""
    with tfabtest.context(progress_thread=True) as ctx:
        peers = tfabtest.connect_all(ctx, index, ports, nprocs)
        futs = []
        for i, p in peers.items():
            futs.append(ctx.send("mine", 1, np.full(8, i, np.int64), peer=p))
        for f in futs:
            f.result(60)
        # Every receiver replies with its index: gather them.
        got = sorted(int(np.from_dlpack(ctx.recv(p, "reply", 1, timeout=60))[0])
                     for p in peers.values())
        return got


def fan_sink(index, ports, nprocs):
    with tfabtest.context() as ctx:
        peer = tfabtest.connect_all(ctx, index, ports, nprocs)[0]
        a = np.from_dlpack(ctx.recv(peer, "mine", 1, timeout=60))
        assert (a == a[0]).all()
        ctx.send("reply", 1, np.array([a[0]], np.int64)).result(60)
        return int(a[0])
