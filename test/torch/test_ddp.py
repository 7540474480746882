"""DistributedDataParallel unchanged on the tfab backend: the same model, seed and batches
trained beside gloo in the same processes reach the same weights; no_sync and
find_unused_parameters work; tfab's compression hooks stay close to the uncompressed run."""
import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import ranks


class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        self.a = torch.nn.Linear(20, 64)
        self.b = torch.nn.Linear(64, 10)
        self.unused = torch.nn.Linear(64, 10) if unused else None

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _train(rank, group, steps, unused=False, no_sync_every=0, hook=None):
    torch.manual_seed(0)
    model = Net(unused)
    ddp = DDP(model, process_group=group, find_unused_parameters=unused,
              bucket_cap_mb=0.01)  # several buckets
    if hook is not None:
        ddp.register_comm_hook(group, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        x = torch.randn(16, 20, generator=g)
        y = torch.randint(0, 10, (16,), generator=g)
        if no_sync_every and step % no_sync_every:
            with ddp.no_sync():
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            continue
        opt.zero_grad() if not no_sync_every else None
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        if no_sync_every:
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def ddp_rank(rank, size, gloo, case):
    import tfab.torch
    tfab_group = dist.distributed_c10d._get_default_group()
    kw = {"unused": case == "unused", "no_sync_every": 3 if case == "no_sync" else 0}
    if case in ("fp16", "bf16", "int8"):
        want = _train(rank, gloo, 20)
        got = _train(rank, tfab_group, 20, hook=getattr(tfab.torch.hooks, case))
        tol = {"fp16": 1e-3, "bf16": 1e-2, "int8": 1e-2}[case]
    else:
        want = _train(rank, gloo, 20, **kw)
        got = _train(rank, tfab_group, 20, **kw)
        tol = 1e-5
    worst = max((a - b).abs().max().item() for a, b in zip(got, want))
    assert worst <= tol, "%s: weights differ from gloo's by %g (tolerance %g)" % (
        case, worst, tol)
    # every rank holds the same weights
    for p in got:
        ref = p.clone()
        dist.broadcast(ref, 0)
        assert torch.equal(ref, p)
    return worst


@pytest.mark.parametrize("case", ["plain", "no_sync", "unused", "fp16", "bf16", "int8"])
def test_ddp_matches_gloo(case):
    worst = ranks.run(3, ddp_rank, case, with_gloo=True)
    print("%s: largest difference from gloo's weights %s" % (case, worst))
