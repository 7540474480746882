"""Every torch.distributed operation on the tfab backend, each result compared with gloo's
on the same inputs in the same processes (a gloo group beside the tfab default one):
integers bit for bit, floats within the rounding that another order of summation gives."""
import pytest
import torch
import torch.distributed as dist

import ranks

RED_DTYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16,
              torch.float32, torch.float64]
MOVE_DTYPES = RED_DTYPES + [torch.bool, torch.int16, torch.bfloat16, torch.complex64]
GLOO_MOVES = RED_DTYPES


def G(t):
    """t for gloo: itself, or for a dtype gloo cannot move its bytes (a view: uint8 in a last
    dimension of the element's size, so that counts of rows stay as they are)."""
    if t.dtype in GLOO_MOVES:
        return t
    return t.unsqueeze(-1).view(torch.uint8)
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX]


def _input(rank, dtype, n, salt=0):
    g = torch.Generator().manual_seed(1000 * rank + salt)
    if dtype is torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_complex:
        return torch.randn(n, generator=g, dtype=torch.float32).to(dtype) * (rank + 1j)
    if dtype.is_floating_point:
        # near 1: products of 4 stay in range, sums in 4 orders differ by rounding only
        return (1 + torch.rand(n, generator=g) / 4).to(dtype) * (1 if rank % 2 else -1)
    lo = 0 if dtype is torch.uint8 else -100
    return torch.randint(lo, 100, (n,), generator=g).to(dtype)


def _same(a, b, what):
    if a.dtype.is_floating_point or a.dtype.is_complex:
        tol = {torch.float16: 4e-3, torch.bfloat16: 3e-2}.get(a.dtype, 1e-5)
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: what + ": " + m)
    else:
        assert torch.equal(a, b), "%s: %s != %s" % (what, a, b)


def both(gloo, fn):
    """fn(group) on tfab (the default group) and on gloo: the two results."""
    return fn(None), fn(gloo)


def ops_rank(rank, size, gloo):
    from tfab.torch import stats
    n = 37  # not a multiple of anything
    for dtype in RED_DTYPES:
        for op in OPS:
            x = _input(rank, dtype, n, salt=op.value if hasattr(op, "value") else 0)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=op)
            dist.all_reduce(b, op=op, group=gloo)
            _same(a, b, "all_reduce %s %s" % (op, dtype))
            for root in range(size):
                a, b = x.clone(), x.clone()
                dist.reduce(a, root, op=op)
                dist.reduce(b, root, op=op, group=gloo)
                if rank == root:
                    _same(a, b, "reduce %s %s root %d" % (op, dtype, root))
            # reduce_scatter: gloo has none; its all_reduce, this rank's part
            x = torch.cat([_input(rank, dtype, 3, salt=r) for r in range(size)])
            ref = x.clone()
            dist.all_reduce(ref, op=op, group=gloo)
            ref = ref[3 * rank:3 * rank + 3]
            a = torch.empty(3, dtype=dtype)
            dist._reduce_scatter_base(a, x.clone(), op=op)
            _same(a, ref, "reduce_scatter_tensor %s %s" % (op, dtype))
            a = torch.empty(3, dtype=dtype)
            dist.reduce_scatter(a, list(x.clone().chunk(size)), op=op)
            _same(a, ref, "reduce_scatter %s %s" % (op, dtype))
        if dtype.is_floating_point or dtype in (torch.int32, torch.int64):
            # AVG: gloo has none; its SUM divided by the size (integers toward zero)
            x = _input(rank, dtype, n)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=dist.ReduceOp.AVG)
            dist.all_reduce(b, group=gloo)
            b = (b / size).to(dtype) if dtype.is_floating_point else torch.div(
                b, size, rounding_mode="trunc")
            _same(a, b, "all_reduce AVG %s" % dtype)
    # bfloat16: gloo has no bfloat16 sum; against float32's, rounded
    x = _input(rank, torch.bfloat16, n)
    a, b = x.clone(), x.float()
    dist.all_reduce(a)
    dist.all_reduce(b, group=gloo)
    _same(a, b.bfloat16(), "all_reduce SUM bfloat16")

    for dtype in MOVE_DTYPES:
        x = _input(rank, dtype, n)
        for root in range(size):
            a, b = x.clone(), x.clone()
            dist.broadcast(a, root)
            dist.broadcast(G(b), root, group=gloo)
            _same(a, b, "broadcast %s root %d" % (dtype, root))
        la = [torch.empty(n, dtype=dtype) for _ in range(size)]
        lb = [torch.empty(n, dtype=dtype) for _ in range(size)]
        dist.all_gather(la, x)
        dist.all_gather([G(t) for t in lb], G(x), group=gloo)
        for r in range(size):
            _same(la[r], lb[r], "all_gather %s part %d" % (dtype, r))
        a = torch.empty(size * n, dtype=dtype)
        dist._all_gather_base(a, x)
        _same(a, torch.cat(lb), "all_gather_into_tensor %s" % dtype)
        for root in range(size):
            ga = [torch.empty(n, dtype=dtype) for _ in range(size)] if rank == root else None
            gb = [torch.empty(n, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(x, ga, dst=root)
            dist.gather(G(x), gb and [G(t) for t in gb], dst=root, group=gloo)
            if rank == root:
                for r in range(size):
                    _same(ga[r], gb[r], "gather %s root %d part %d" % (dtype, root, r))
            parts = [_input(rank, dtype, n, salt=r) for r in range(size)]
            sa, sb = torch.empty(n, dtype=dtype), torch.empty(n, dtype=dtype)
            dist.scatter(sa, parts if rank == root else None, src=root)
            dist.scatter(G(sb), [G(t) for t in parts] if rank == root else None, src=root,
                         group=gloo)
            _same(sa, sb, "scatter %s root %d" % (dtype, root))
        # all_to_all_single: equal parts, then split sizes (rank r sends r + j + 1 rows to j)
        x = torch.cat([_input(rank, dtype, 4, salt=r) for r in range(size)])
        a, b = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(a, x)
        dist.all_to_all_single(G(b), G(x), group=gloo)
        _same(a, b, "all_to_all_single %s" % dtype)
        ins = [rank + j + 1 for j in range(size)]
        outs = [j + rank + 1 for j in range(size)]
        x = _input(rank, dtype, sum(ins) * 2).view(-1, 2)
        a = torch.empty(sum(outs), 2, dtype=dtype)
        b = torch.empty(sum(outs), 2, dtype=dtype)
        dist.all_to_all_single(a, x, outs, ins)
        dist.all_to_all_single(G(b), G(x), outs, ins, group=gloo)
        _same(a, b, "all_to_all_single %s split sizes" % dtype)
        xi = [_input(rank, dtype, j + 1, salt=j) for j in range(size)]
        oa = [torch.empty(rank + 1, dtype=dtype) for _ in range(size)]
        ob = [torch.empty(rank + 1, dtype=dtype) for _ in range(size)]
        if dtype is not torch.complex64:  # torch 1.13's all_to_all refuses complex lists
            dist.all_to_all(oa, xi)
            # gloo has no list all_to_all: its all_to_all_single of the pieces end to end
            packed = torch.empty(size * (rank + 1), dtype=dtype)
            dist.all_to_all_single(G(packed), G(torch.cat(xi)), [rank + 1] * size,
                                   [j + 1 for j in range(size)], group=gloo)
            ob = list(packed.chunk(size))
            for j in range(size):
                _same(oa[j], ob[j], "all_to_all %s part %d" % (dtype, j))
    dist.barrier()

    # Non-contiguous tensors: copied (and counted), results where they belong
    before = stats()["copies"]
    m = _input(rank, torch.float32, 6 * 5).view(6, 5).t()
    a, b = m.clone(), m.clone()
    assert not m.is_contiguous()
    dist.all_reduce(m)
    dist.all_reduce(b, group=gloo)
    _same(m, b, "all_reduce of a transposed tensor")
    assert stats()["copies"] >= before + 2, stats()

    # Asynchronous calls: Work.wait, get_future, several in flight
    works = [dist.all_reduce(torch.full((8,), float(i + rank)), async_op=True)
             for i in range(16)]
    futs = [w.get_future() for w in works[:8]]
    for i, w in enumerate(works[8:], 8):
        assert w.wait() is True
        assert w.is_completed() and w.is_success()
    for i, f in enumerate(futs):
        got = f.wait()[0]
        want = sum(float(i + r) for r in range(size))
        assert torch.all(got == want), (i, got)

    # Refusals name the call
    with pytest.raises(RuntimeError, match="BAND"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)
    if rank == 1:
        with pytest.raises(RuntimeError, match="any source"):
            dist.recv(torch.empty(1))
    dist.barrier()
    return True


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_operation_and_dtype_against_gloo(n):
    assert ranks.run(n, ops_rank, with_gloo=True, wait_s=400) == [True] * n


def p2p_rank(rank, size, gloo):
    right, left = (rank + 1) % size, (rank - 1) % size
    # send/recv with tags, posted out of order: tags are separate channels, in order within
    x = [torch.full((5,), float(rank * 10 + t)) for t in range(3)]
    reqs = []
    for t in (2, 0, 1):
        reqs.append(dist.isend(x[t], right, tag=t))
    got = [torch.empty(5) for _ in range(3)]
    for t in (1, 2, 0):
        reqs.append(dist.irecv(got[t], left, tag=t))
    for r in reqs:
        r.wait()
    for t in range(3):
        assert torch.all(got[t] == left * 10 + t), (t, got[t])
    # Many messages on one tag keep their order
    for i in range(20):
        if rank == 0:
            dist.send(torch.tensor([i]), 1)
        elif rank == 1:
            r = torch.empty(1, dtype=torch.int64)
            dist.recv(r, 0)
            assert r.item() == i, (i, r)
    # batch_isend_irecv around the ring, each dtype, against gloo's
    for dtype in MOVE_DTYPES:
        mine = _input(rank, dtype, 11)
        outs = {}
        for name, g in (("tfab", None), ("gloo", gloo)):
            into = torch.empty(11, dtype=dtype)
            ops = [dist.P2POp(dist.isend, mine, right, group=g),
                   dist.P2POp(dist.irecv, into, left, group=g)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            outs[name] = into
        _same(outs["tfab"], outs["gloo"], "batch_isend_irecv %s" % dtype)
        _same(outs["tfab"], _input(left, dtype, 11), "batch_isend_irecv %s source" % dtype)
    dist.barrier()
    return True


@pytest.mark.parametrize("n", [2, 3])
def test_point_to_point(n):
    assert ranks.run(n, p2p_rank, with_gloo=True) == [True] * n
