"""One rank of test_launch.py, started by torchrun or by hand with torch's variables (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT and no TFAB_MASTER_PORT): two worlds in turn, each
meeting through torch's store, an allreduce on each, and torch.distributed's own group (gloo,
env://) on the same MASTER_PORT before or after them (argv[1]: "torch-first" or
"tfab-first"). Prints WORLD <i> <rank> <size> <sum>, GLOO <sum>, then OK."""
import datetime
import sys

import numpy as np

import tfab


def gloo_allreduce():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def main():
    order = sys.argv[1]
    if order == "torch-first":
        gloo = gloo_allreduce()
    for i in range(2):  # the second world reads none of the first's records
        with tfab.World(timeout=60) as w:
            a = np.full(4, w.rank + 1 + 10 * i, np.float32)
            w.allreduce(a).result(30)
            print("WORLD %d %d %d %g" % (i, w.rank, w.size, a[0]), flush=True)
    if order == "tfab-first":
        gloo = gloo_allreduce()
    print("GLOO %g" % gloo, flush=True)
    print("OK", flush=True)


if __name__ == "__main__":
    main()
