"""What the ranks of test_world.py run (spawned processes, or threads with allgather=), and the
references the results are checked against: every rank computes every rank's input from a
seed, and folds them in the order doc/world.md documents, rounding as lib/world/reduce.c
does (16-bit floats reduced in float32 and rounded once per step), so that every result is
checked bit for bit."""
import os
import sys
import threading
import time

import numpy as np

import tfabtest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testprocs import free_port  # noqa: E402,F401 (worlds.free_port, for the tests)

SMALL = 65536  # TFAB_ALLREDUCE_SMALL's default: above it (and count >= size), a ring
OPS = ["sum", "avg", "min", "max"]
SIZES = [1, 1000, 300000]
NP_DTYPES = ["float32", "float64", "float16", "int32", "int64"]
TORCH_DTYPES = ["bfloat16", "float16", "float32"]


def rank_main(index, ports, n, port, env, func, args):
    """A rank of a world of n from a torchrun-style environment: joins, runs func(w, *args),
    leaves."""
    os.environ.update({"TFAB_RANK": str(index), "TFAB_WORLD_SIZE": str(n),
                       "TFAB_MASTER_ADDR": "127.0.0.1", "TFAB_MASTER_PORT": str(port),
                       "TFAB_WORLD_NAME": "/job:worker/task:%d" % index})
    os.environ.update(env)
    import tfab
    with tfabtest.context() as ctx:
        with tfab.World(ctx, timeout=60) as w:
            assert (w.rank, w.size) == (index, n), (w.rank, w.size)
            return func(w, *args)


# Inputs and references

def np_input(dtype, count, rank, seed):
    rng = np.random.default_rng([seed, rank, count, NP_DTYPES.index(dtype) if dtype in
                                 NP_DTYPES else 9])
    if dtype == "int32":
        return rng.integers(-2 ** 20, 2 ** 20, count).astype(np.int32)
    if dtype == "int64":
        return rng.integers(-2 ** 50, 2 ** 50, count).astype(np.int64)
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(bool)
    if np.dtype(dtype).kind in "iu":  # every value of the narrow ones, wide ones' low bits
        info = np.iinfo(dtype)
        lo, hi = max(info.min, -2 ** 40), min(info.max, 2 ** 40)
        return rng.integers(lo, hi, count, endpoint=True).astype(dtype)
    # floats of several magnitudes: a sum in another order differs in its last bits
    a = rng.standard_normal(count) * 10.0 ** rng.integers(-2, 3, count)
    return a.astype(dtype)


def torch_input(dtype, count, rank, seed):
    import torch
    a = np_input("float32", count, rank, seed + 7)
    return torch.from_numpy(a).to(getattr(torch, dtype))


class NpArith:
    """a op b and the average's division, as reduce.c computes them, in NumPy."""

    @staticmethod
    def op(op, a, b):
        if a.dtype == np.float16:
            return NpArith.op(op, a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
        if op in ("sum", "avg"):
            return a + b  # integers wrap, as the library's do
        if op == "prod":
            return a * b
        if op == "min":
            return np.where(b < a, b, a)
        return np.where(b > a, b, a)

    @staticmethod
    def div(a, n):
        if a.dtype == np.float16:
            return (a.astype(np.float32) / np.float32(n)).astype(np.float16)
        if a.dtype.kind == "f":
            return a / a.dtype.type(n)
        if a.dtype.kind == "u":
            return a // a.dtype.type(n)
        w = a.astype(np.int64)  # abs(-128) is no int8
        q = np.abs(w) // n  # toward zero
        return np.where(w < 0, -q, q).astype(a.dtype)


class TorchArith:
    @staticmethod
    def op(op, a, b):
        import torch
        if a.dtype in (torch.bfloat16, torch.float16):
            return TorchArith.op(op, a.float(), b.float()).to(a.dtype)
        if op in ("sum", "avg"):
            return a + b
        if op == "prod":
            return a * b
        if op == "min":
            return torch.where(b < a, b, a)
        return torch.where(b > a, b, a)

    @staticmethod
    def div(a, n):
        if a.dtype.is_floating_point and a.dtype != __import__("torch").float64:
            return (a.float() / n).to(a.dtype)
        return a / n


def fold(arith, op, xs):
    acc = xs[0]
    for x in xs[1:]:
        acc = arith.op(op, acc, x)
    return acc


def allreduce_ref(arith, op, xs, algo):
    """The result of an allreduce of xs (one per rank) with algo: "direct" folds in rank
    order; "ring" folds part c (elements count*c//N to count*(c+1)//N) from rank c around."""
    n, count = len(xs), len(xs[0])
    if algo == "direct":
        acc = fold(arith, op, xs)
    else:
        parts = []
        for c in range(n):
            lo, hi = count * c // n, count * (c + 1) // n
            parts.append(fold(arith, op, [xs[(c + k) % n][lo:hi] for k in range(n)]))
        acc = _concat(parts)
    return arith.div(acc, n) if op == "avg" else acc


def reduce_scatter_ref(arith, op, xs, rank):
    """Part rank of a reduce-scatter: folded from rank + 1 around to rank."""
    n = len(xs)
    m = len(xs[0]) // n
    acc = fold(arith, op, [xs[(rank + 1 + k) % n][rank * m:(rank + 1) * m] for k in range(n)])
    return arith.div(acc, n) if op == "avg" else acc


def _concat(parts):
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    import torch
    return torch.cat(parts)


def algo_of(nbytes, count, n, asked=None):
    if asked:
        return asked
    return "ring" if nbytes > SMALL and count >= n else "direct"


def same_bits(a, b):
    """Bit for bit (a float's sign of zero and NaN payload included)."""
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and \
            a.tobytes() == b.tobytes()
    return _torch_same(a, b)


def _torch_same(a, b):
    import torch
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}.get(a.dtype)
    if view is None:
        return bool(torch.equal(a, b))
    return bool(torch.equal(a.contiguous().view(view), b.contiguous().view(view)))


def describe(a, b):
    """Where two results first differ, for the failure message."""
    a = np.asarray(a.float() if hasattr(a, "float") and not isinstance(a, np.ndarray) else a)
    b = np.asarray(b.float() if hasattr(b, "float") and not isinstance(b, np.ndarray) else b)
    bad = np.nonzero(a.reshape(-1) != b.reshape(-1))[0]
    if not len(bad):
        return "same values, other bits or dtype"
    i = bad[0]
    return "%d elements differ, first at %d: got %r, want %r" % (len(bad), i, a.reshape(-1)[i],
                                                                   b.reshape(-1)[i])


# What the ranks run

def allreduce_matrix(w, seed):
    """Every NumPy dtype and torch's bfloat16, float16 and float32, every op, sizes 1, 1000 and
    300000,
    in place and into out=, and the two algorithms asked for by name: each result against the
    reference. Returns the cases checked; raises with every case that failed."""
    n, r = w.size, w.rank
    failed, checked = [], 0
    cases = []
    for dtype in NP_DTYPES:
        for op in OPS:
            for count in SIZES:
                for mode in ("inplace", "out"):
                    cases.append(("numpy", dtype, op, count, mode, None))
    for dtype in TORCH_DTYPES:
        for op in OPS:
            for count in SIZES:
                for mode in ("inplace", "out"):
                    cases.append(("torch", dtype, op, count, mode, None))
    for algo in ("direct", "ring"):
        for count in SIZES:
            cases.append(("numpy", "float32", "sum", count, "inplace", algo))
            cases.append(("numpy", "float16", "avg", count, "out", algo))
            cases.append(("torch", "bfloat16", "sum", count, "out", algo))
    for i, (lib, dtype, op, count, mode, algo) in enumerate(cases):
        if lib == "numpy":
            xs = [np_input(dtype, count, k, seed + i) for k in range(n)]
            arith = NpArith
            mine = xs[r].copy()
        else:
            import torch
            xs = [torch_input(dtype, count, k, seed + i) for k in range(n)]
            arith = TorchArith
            mine = xs[r].clone()
        ptr = _ptr(mine)
        out = None
        if mode == "out":
            out = np.empty_like(mine) if lib == "numpy" else torch.empty_like(mine)
        got = w.allreduce(mine, out=out, op=op, algo=algo).result(60)
        want_obj = mine if out is None else out
        nbytes = count * (2 if dtype in ("float16", "bfloat16") else
                          np.dtype(dtype).itemsize)
        want = allreduce_ref(arith, op, xs, algo_of(nbytes, count, n, algo))
        checked += 1
        case = "%s %s %s count=%d %s algo=%s" % (lib, dtype, op, count, mode, algo)
        if got is not want_obj:
            failed.append("%s: the future's result is not the tensor written" % case)
        elif _ptr(mine) != ptr:
            failed.append("%s: the tensor moved" % case)
        elif not same_bits(got, want):
            failed.append("%s: %s" % (case, describe(got, want)))
        elif mode == "out" and not same_bits(mine, xs[r]):
            failed.append("%s: the input changed" % case)
    if failed:
        raise AssertionError("rank %d: %d of %d allreduces wrong:\n  %s"
                             % (r, len(failed), checked, "\n  ".join(failed[:20])))
    return checked


def _ptr(t):
    return t.ctypes.data if isinstance(t, np.ndarray) else t.data_ptr()


def other_collectives(w, seed):
    """broadcast from every root, allgather and reduce_scatter (every op), at each size, then
    a barrier that no rank leaves before the last has entered. Returns the barrier's
    (entered, left) times."""
    import torch
    n, r = w.size, w.rank
    for count in SIZES:
        for root in range(n):
            for dtype in ("float32", "bool"):
                t = np_input(dtype, count, r, seed + root)
                want = np_input(dtype, count, root, seed + root)
                assert w.broadcast(t, root).result(60) is t
                assert same_bits(t, want), ("broadcast", count, root, dtype, describe(t, want))
        tt = torch_input("bfloat16", count, r, seed)
        tt = tt if r == 0 else torch.zeros_like(tt)
        w.broadcast(tt, 0).result(60)
        assert _torch_same(tt, torch_input("bfloat16", count, 0, seed)), ("broadcast bf16", count)
        # allgather: out given, and made (stacked, (size,) + shape)
        x = np_input("int64", count, r, seed)
        out = np.empty(count * n, np.int64)
        assert w.allgather(x, out).result(60) is out
        assert same_bits(out, np.concatenate([np_input("int64", count, k, seed)
                                              for k in range(n)])), ("allgather", count)
        made = w.allgather(x.reshape(1, count)).result(60)
        assert made.shape == (n, 1, count) and same_bits(made.reshape(-1), out)
        tb = torch_input("bfloat16", count, r, seed)
        g = w.allgather(tb).result(60)
        assert g.shape == (n, count) and g.dtype == torch.bfloat16
        assert _torch_same(g, torch.stack([torch_input("bfloat16", count, k, seed)
                                           for k in range(n)])), ("allgather bf16", count)
        # reduce_scatter: every op, float32 and int32 and float16, count elements per rank
        for op in OPS:
            for dtype in ("float32", "int32", "float16"):
                xs = [np_input(dtype, count * n, k, seed + 3) for k in range(n)]
                part = np.empty(count, dtype)
                assert w.reduce_scatter(xs[r].copy(), part, op=op).result(60) is part
                want = reduce_scatter_ref(NpArith, op, xs, r)
                assert same_bits(part, want), ("reduce_scatter", op, dtype, count,
                                                describe(part, want))
        made = w.reduce_scatter(np_input("float64", count * n, r, seed).reshape(n, count)
                                ).result(60)
        assert made.shape == (1, count)
    time.sleep(0.3 * r)  # the last rank enters 0.3 * (n - 1) s after the first
    entered = time.time()
    assert w.barrier().result(60) is None
    return entered, time.time()


def rooted_and_alltoall(w, seed):
    """reduce (every op; int8, uint8, uint16, float32, float16 and torch's uint8 and bfloat16)
    to every root, in place and into out=; gather and scatter from every root; alltoall with
    uneven counts (some empty), equal ones (None), a torch tensor, and counts that differ
    between ranks 0 and 1 (both fail, EINVAL; the next one is right). Each result against
    the reference. Returns the cases checked."""
    import errno
    import torch
    import tfab
    n, r = w.size, w.rank
    checked = 0
    ops = OPS + ["prod"]
    for root in range(n):
        for i, dtype in enumerate(["int8", "uint8", "uint16", "float32", "float16"]):
            for op in ops:
                count = (1, 1000, 30000)[(i + len(op)) % 3]
                xs = [np_input(dtype, count, k, seed + i) for k in range(n)]
                mine = xs[r].copy()
                out = np.full_like(mine, 7) if op in ("sum", "prod") else None
                got = w.reduce(mine, out=out, op=op, root=root).result(60)
                case = ("reduce", dtype, op, count, root)
                if r != root:
                    assert got is None and same_bits(mine, xs[r]), case
                    assert out is None or (out == 7).all(), case  # not written off the root
                else:
                    want = fold(NpArith, op, xs)
                    want = NpArith.div(want, n) if op == "avg" else want
                    assert got is (mine if out is None else out), case
                    assert same_bits(got, want), (case, describe(got, want))
                checked += 1
        for dtype in ("uint8", "bfloat16"):
            xs = [torch.from_numpy(np_input("uint8", 500, k, seed)) if dtype == "uint8" else
                  torch_input(dtype, 500, k, seed) for k in range(n)]
            mine = xs[r].clone()
            got = w.reduce(mine, op="prod" if dtype == "uint8" else "sum", root=root).result(60)
            if r == root:
                want = fold(TorchArith, "prod" if dtype == "uint8" else "sum", xs)
                assert got is mine and _torch_same(got, want), ("reduce torch", dtype, root)
            checked += 1
        # gather and scatter: float64 and bool (any dtype), out made on the root
        for count in SIZES:
            for dtype in ("float64", "bool"):
                xs = [np_input(dtype, count, k, seed + root) for k in range(n)]
                got = w.gather(xs[r].copy(), root=root).result(60)
                if r == root:
                    assert got.shape == (n, count) and same_bits(got, np.stack(xs)), \
                        ("gather", dtype, count, root)
                else:
                    assert got is None
                whole = np.concatenate(xs) if r == root else None
                part = np.zeros(count, dtype)
                assert w.scatter(whole, part, root=root).result(60) is part
                assert same_bits(part, xs[r]), ("scatter", dtype, count, root)
                checked += 2

    def sends(frm, to, v):
        return ((frm * 7 + to * 3 + v) % 5) * (1, 300, 20000)[v]

    for v in range(3):
        for dtype in ("int32", "float16"):
            sc = [sends(r, k, v) for k in range(n)]
            rc = [sends(k, r, v) for k in range(n)]
            pieces = [np_input(dtype, sends(k, j, v), 1000 * k + j, seed) for k in range(n)
                      for j in range(n)]  # rank k's for rank j at k * n + j
            x = np.concatenate([pieces[r * n + j] for j in range(n)])
            out = np.zeros(sum(rc), dtype)
            assert w.alltoall(x, out, sc, rc).result(60) is out
            want = np.concatenate([pieces[k * n + r] for k in range(n)])
            assert same_bits(out, want), ("alltoall", v, dtype, describe(out, want))
            checked += 1
    # equal pieces (None), torch
    x = torch.arange(4 * n, dtype=torch.int64) + 100 * r
    out = torch.zeros(4 * n, dtype=torch.int64)
    assert w.alltoall(x, out).result(60) is out
    want = torch.cat([torch.arange(4 * r, 4 * r + 4) + 100 * k for k in range(n)])
    assert torch.equal(out, want), (out, want)
    checked += 1
    # counts that differ: rank 0 sends rank 1 one element more than rank 1 expects
    sc = [3] * n
    rc = [3] * n
    if r == 0:
        sc[1] = 4
    x = np.arange(sum(sc), dtype=np.int32)
    out = np.full(sum(rc), -1, np.int32)
    try:
        w.alltoall(x, out, sc, rc).result(60)
        failed = None
    except tfab.Error as e:
        failed = e
    if r <= 1:
        assert failed is not None and abs(failed.status) == errno.EINVAL, failed
    else:
        assert failed is None or isinstance(failed, tfab.PeerFailedError), failed
    if r == 1:
        assert (out[:3] == -1).all(), out  # nothing from rank 0
    out = np.zeros(3 * n, np.int32)
    x = np.arange(3 * n, dtype=np.int32) + 10 * r
    assert w.alltoall(x, out, [3] * n, [3] * n).result(60) is out
    assert out.tolist() == [10 * k + 3 * r + i for k in range(n) for i in range(3)], out
    return checked + 2


def many_in_flight(w, seed, rounds):
    """Collectives of several kinds and sizes started together, waited for in another order
    (the last first), then w.wait() for a second batch: every result right."""
    n, r = w.size, w.rank
    assert w.context.progress_thread == (os.environ.get("TFAB_PROGRESS_THREAD") == "1")
    for rnd in range(rounds):
        futs, checks = [], []
        for i, count in enumerate([1, 300000, 1000, 70000, 300000, 5, 1000, 300000]):
            dtype = ["float32", "float64", "int32", "float16"][i % 4]
            xs = [np_input(dtype, count, k, seed + rnd * 100 + i) for k in range(n)]
            mine = xs[r].copy()
            op = OPS[i % 4]
            algo = [None, "ring", "direct"][i % 3]
            nbytes = mine.nbytes
            futs.append(w.allreduce(mine, op=op, algo=algo))
            checks.append((mine, allreduce_ref(NpArith, op, xs,
                                               algo_of(nbytes, count, n, algo)), (i, dtype, op)))
        b = np_input("float64", 200000, r, seed + rnd)
        futs.append(w.broadcast(b, rnd % n))
        checks.append((b, np_input("float64", 200000, rnd % n, seed + rnd), "broadcast"))
        g = np.empty(n * 1000, np.int32)
        futs.append(w.allgather(np_input("int32", 1000, r, seed + rnd), g))
        checks.append((g, np.concatenate([np_input("int32", 1000, k, seed + rnd)
                                          for k in range(n)]), "allgather"))
        futs.append(w.barrier())
        if rnd % 2 == 0:
            for f in reversed(futs):
                f.result(60)
        else:
            w.wait(60)
            assert all(f.done() for f in futs)
            for f in futs:
                f.result(0)
        for got, want, what in checks:
            assert same_bits(got, want), (rnd, what, describe(got, want))
    return rounds


def small_allreduces(w, count):
    """count allreduces of 8 bytes, one after the other: how long they took."""
    x = np.ones(2, np.float32)
    w.barrier().result(60)
    t0 = time.monotonic()
    for _ in range(count):
        x[:] = 1.0
        w.allreduce(x).result(60)
    took = time.monotonic() - t0
    assert x.tolist() == [float(w.size)] * 2
    return took


def close_mid_collective(w):
    """Rank 0 starts an allreduce that rank 1 never joins and closes its context: its future
    fails with AbortedError and its world is left; rank 1 sees its peer go, and its next
    collective fails. Returns the exception class names."""
    import tfab
    if w.rank == 0:
        f = w.allreduce(np.ones(1000, np.float32))
        time.sleep(0.2)
        assert not f.done()
        w.context.close()
        e = f.exception(10)
        assert isinstance(e, tfab.AbortedError), repr(e)
        assert not w.joined
        return type(e).__name__
    # No collective here until rank 0 is gone (one that does not match rank 0's is an error).
    end = time.time() + 30
    while w.peer(0).status == 0 and time.time() < end:
        w.context.progress()
        time.sleep(0.001)
    assert w.peer(0).status != 0, "rank 1 did not see rank 0 go"
    try:
        w.barrier().result(30)
    except tfab.Error as e:
        return type(e).__name__
    raise AssertionError("rank 1: a barrier with a closed rank completed")


def names_and_peers(w):
    """Every rank's name, its peers' paths, a tensor sent to the next rank on its world peer
    (send/recv beside the collectives), and what a world's peer refuses."""
    import tfab
    n, r = w.size, w.rank
    names = [w.name(k) for k in range(n)]
    assert w.peer(r) is None
    nxt, prv = (r + 1) % n, (r - 1) % n
    f = w.context.send("hello/%d" % nxt, 1, np.full(3, r, np.int32), peer=w.peer(nxt))
    got = w.context.recv(w.peer(prv), "hello/%d" % r, 1, timeout=30)
    f.result(30)
    assert np.from_dlpack(got).tolist() == [prv] * 3
    try:
        w.peer(nxt).close()
        raise AssertionError("a world's peer closed")
    except ValueError:
        pass
    for bad in (-1, n):
        try:
            w.peer(bad)
            raise AssertionError("peer(%d)" % bad)
        except IndexError:
            pass
    paths = [w.peer(k).path for k in range(n) if k != r]
    # Wrong arguments are refused before the library is called, on every rank alike.
    x = np.zeros(4, np.float32)
    for call, exc in ((lambda: w.allreduce(x, op="xor"), ValueError),
                      (lambda: w.allreduce(np.zeros(4, np.complex64)), TypeError),
                      (lambda: w.reduce(x, root=n), ValueError),
                      (lambda: w.alltoall(x, np.zeros(4, np.float32), [4] + [0] * n), ValueError),
                      (lambda: w.allreduce(x, out=np.zeros(4, np.float64)), TypeError),
                      (lambda: w.allreduce(x, out=np.zeros(5, np.float32)), ValueError),
                      (lambda: w.allreduce(np.zeros((4, 4), np.float32)[:, 1]), ValueError),
                      (lambda: w.allgather(x, np.zeros(4, np.float32)), ValueError),
                      (lambda: w.reduce_scatter(np.zeros(n + 1, np.float32)), ValueError),
                      (lambda: w.broadcast(x, n), ValueError),
                      (lambda: w.allreduce([1.0, 2.0]), TypeError)):
        try:
            call()
            raise AssertionError("not refused: %s" % exc.__name__)
        except exc:
            pass
    # A world cannot be left from a future's callback (progress runs it, in result()). The
    # last rank to enter a barrier may end it inside its call, before a callback is added; so
    # in round 0 rank 0 enters first and the others only once it says so, in round 1 the
    # others first: each rank adds its callback to a barrier that cannot have ended.
    seen = []

    def leave_here(fut):
        try:
            w.leave()
        except RuntimeError as e:
            seen.append(str(e))
    for rnd in range(2):
        early = [0] if rnd == 0 else list(range(1, n))
        late = [k for k in range(n) if k not in early]
        if r in early:
            f = w.barrier()
            assert not f.done(), "a barrier ended before every rank entered it"
            f.add_done_callback(leave_here)
            told = [w.context.send("entered/%d/%d" % (rnd, k), 1, np.full(1, r, np.int32),
                                   peer=w.peer(k)) for k in late]
            f.result(30)
            for t in told:
                t.result(30)
        else:
            for k in early:
                w.context.recv(w.peer(k), "entered/%d/%d" % (rnd, r), 1, timeout=30)
            w.barrier().result(30)
    assert len(seen) == 1 and "callback" in seen[0], seen
    # Compression: int8 with error feedback, within its rounding of the exact average, and
    # fewer bytes on the wire than the values stand for (the context's statistics).
    g = np_input("float32", 10000, r, 5)
    s0 = w.context.stats()
    res = w.allreduce(g.copy(), op="avg", compress="int8", key="g").result(60)
    want = np.mean([np_input("float32", 10000, k, 5) for k in range(n)], axis=0)
    scale = np.abs(want).max()
    assert np.abs(res - want).max() <= 0.05 * scale, "int8 allreduce far off"
    s1 = w.context.stats()
    wire = s1["coll_bytes_wire"] - s0["coll_bytes_wire"]
    logical = s1["coll_bytes_logical"] - s0["coll_bytes_logical"]
    compress = "ok" if 0 < wire <= 0.3 * logical else "wire %d of %d" % (wire, logical)
    return names, paths, compress


def gil_during_waits(w):
    """Rank 1 joins 1.5 s late (its caller sleeps) and starts its allreduce 1 s late: rank
    0's join, w.wait() and result() let a Python thread run meanwhile. Returns how many times
    that thread ran during each, on rank 0."""
    if w.rank != 0:
        time.sleep(1.0)
        w.allreduce(np.ones(10, np.float32)).result(30)
        time.sleep(1.0)
        w.allreduce(np.ones(10, np.float32)).result(30)
        return None
    counts = {}
    for what in ("wait", "result"):
        ticks = Ticker()
        f = w.allreduce(np.ones(10, np.float32))
        if what == "wait":
            w.wait(30)
        else:
            f.result(30)
        counts[what] = ticks.stop()
        assert f.result(0).tolist() == [float(w.size)] * 10
    return counts


class Ticker:
    """A thread that counts while it runs."""

    def __init__(self):
        self.n = 0
        self.go = True
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while self.go:
            self.n += 1
            time.sleep(0.001)

    def stop(self):
        self.go = False
        self.t.join(5)
        return self.n


def join_late(index, ports, n, port, env):
    """Rank 0 counts a thread's ticks while its join waits for rank 1, which comes 1.5 s late;
    then both run gil_during_waits."""
    import tfab
    os.environ.update({"TFAB_RANK": str(index), "TFAB_WORLD_SIZE": str(n),
                       "TFAB_MASTER_ADDR": "127.0.0.1", "TFAB_MASTER_PORT": str(port)})
    with tfabtest.context() as ctx:
        if index:
            time.sleep(1.5)
        ticks = Ticker()
        w = tfab.World(ctx, timeout=60)
        joined = ticks.stop()
        with w:
            counts = gil_during_waits(w)
        return None if index else dict(counts, join=joined)


def fault_rank(w, ready):
    """Allreduces of 4 MiB again and again until one fails (a rank killed or stopped by the
    test); returns (exception class, status name, when it failed) on the others."""
    import tfab
    x = np.ones(1 << 20, np.float32)
    w.allreduce(x).result(60)
    ready.put(w.rank)
    end = time.time() + 60
    while time.time() < end:
        x[:] = 1.0
        try:
            w.allreduce(x).result(60)
        except tfab.Error as e:
            return type(e).__name__, e.name, time.time()
        assert x[0] == w.size
    raise AssertionError("rank %d: nothing failed in 60 s" % w.rank)


# Ranks as threads of one process, meeting through an allgather of their own

class Exchange:
    """An allgather between the threads of one process (what a launcher gives)."""

    def __init__(self, n):
        self.slots = [None] * n
        self.barrier = threading.Barrier(n, timeout=30)

    def allgather_of(self, rank):
        def allgather(mine):
            assert isinstance(mine, bytes)
            self.slots[rank] = mine
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out
        return allgather


def thread_rank(rank, n, exchange, results):
    import tfab
    try:
        with tfabtest.context() as ctx:
            with tfab.World(ctx, rank=rank, size=n, name="thread %d" % rank,
                            allgather=exchange.allgather_of(rank), timeout=30) as w:
                xs = [np_input("float32", 100000, k, 11) for k in range(n)]
                got = w.allreduce(xs[rank].copy()).result(30)
                assert same_bits(got, allreduce_ref(NpArith, "sum", xs, algo_of(
                    400000, 100000, n))), describe(got, allreduce_ref(NpArith, "sum", xs,
                                                                       "ring"))
                results[rank] = [w.name(k) for k in range(n)]
    except BaseException as e:  # reported by the test
        results[rank] = e
