"""DistributedDataParallel unchanged on the tfab backend: the same model, seed and batches
trained beside gloo in the same processes reach the same weights; no_sync and
find_unused_parameters work; tfab's compression hooks stay close to the uncompressed run;
the DDP example trains as gloo does."""
import os
import re
import sys

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


EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "doc", "examples")


def _example(launch, name, *args):
    """Runs doc/examples/<name> on 2 ranks, under torchrun or starting its ranks itself
    (--ranks): its output, stderr included."""
    script = os.path.join(EXAMPLES, name)
    if launch == "torchrun":
        return ranks.launch([script] + list(args), torchrun=2)
    return ranks.launch([sys.executable, script, "--ranks", "2"] + list(args))


def _digits(launch, *args):
    """doc/examples/ddp_digits.py, 2 epochs on 2 ranks: (accuracy, its output)."""
    out = _example(launch, "ddp_digits.py", "--epochs", "2", *args)
    acc = re.search(r"^(?:\[\S+\]:)?accuracy ([\d.]+)$", out, re.M)
    assert acc and re.search(r"training [\d.]+ s \(\w+, 2 ranks, 2 epochs\)", out), out
    return float(acc.group(1)), out


def test_ddp_digits_example():
    """The example as its docstring runs it: tfab's backend, spawned and under torchrun,
    trains to gloo's accuracy, within a point (its hooks: test_ddp_matches_gloo)."""
    gloo, out = _digits("spawn", "--backend", "gloo")
    assert gloo > 80.0, out  # the model learns at all in 2 epochs
    for launch in ("spawn", "torchrun"):
        acc, out = _digits(launch, "--backend", "tfab")
        print("ddp_digits %s: accuracy %.2f, gloo's %.2f" % (launch, acc, gloo))
        assert abs(acc - gloo) <= 1.0, "%s: accuracy %.2f, gloo's %.2f\n%s" % (
            launch, acc, gloo, out)


def test_readme_example():
    """The README's PyTorch example under torchrun: each rank's input differs (scaled by its
    rank), so only gradients averaged across the ranks agree."""
    out = _example("torchrun", "torch_ddp.py")
    # one write per line's text (torchrun's ranks share stdout, unbuffered): no anchors
    sums = dict(re.findall(r"rank (\d): gradient sum (-?\d+\.\d{6})", out))
    assert sorted(sums) == ["0", "1"], out
    assert sums["0"] == sums["1"], out
