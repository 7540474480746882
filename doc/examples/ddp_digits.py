"""The digits training of train_digits.py written as plain PyTorch: DistributedDataParallel
on a torch.distributed process group, tfab's or gloo's (--backend), nothing else of tfab's.

Under torchrun (Debian's torch 1.13 spells the options with underscores, and on Python 3.11
needs --redirects and --tee given):

    PYTHONPATH=build/lib/python torchrun --nproc_per_node 4 --redirects 2 --tee 2 \\
        doc/examples/ddp_digits.py --backend tfab

or starting its ranks itself (torch.multiprocessing, a free port on 127.0.0.1):

    PYTHONPATH=build/lib/python /usr/bin/python3 doc/examples/ddp_digits.py --ranks 4 \\
        --backend tfab [--hook fp16|bf16|int8] [--epochs 10] [--batch 64]

The data set is sklearn's digits (1797 8x8 images, in Debian's python3-sklearn, no
download). Every rank takes its shard of each epoch through DistributedSampler, in batches of
batch/N. Rank 0 prints the test accuracy after each epoch, then `accuracy <percent>` and
`training <seconds> s` (the epochs' loop alone).
"""
import argparse
import datetime
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

import tfab.torch  # registers the backend "tfab": every rank imports it, at the top


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["tfab", "gloo"], default="tfab")
    p.add_argument("--ranks", type=int, default=4,
                   help="ranks to start when no launcher did (default 4)")
    p.add_argument("--hook", choices=["fp16", "bf16", "int8"], default=None,
                   help="tfab's DDP comm hook: gradients travel compressed")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=64, help="the total batch of all ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def data(seed):
    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=seed,
                                          stratify=y)
    return (torch.utils.data.TensorDataset(torch.from_numpy(xtr), torch.from_numpy(ytr)),
            torch.from_numpy(xte), torch.from_numpy(yte))


def train(args):
    """One rank's training; the process group is already made."""
    rank, n = dist.get_rank(), dist.get_world_size()
    if args.batch % n:
        raise SystemExit("ddp_digits: --batch %d is not a multiple of %d ranks"
                         % (args.batch, n))
    torch.set_num_threads(1)  # a rank per core at most
    torch.manual_seed(args.seed)
    train_set, xte, yte = data(args.seed)
    sampler = torch.utils.data.distributed.DistributedSampler(train_set, seed=args.seed,
                                                              drop_last=True)
    loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch // n,
                                         sampler=sampler, drop_last=True)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10)))
    if args.hook:
        if args.backend != "tfab":
            raise SystemExit("ddp_digits: --hook is tfab's: use it with --backend tfab")
        model.register_comm_hook(None, getattr(tfab.torch.hooks, args.hook))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    dist.barrier()
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        if rank == 0:
            print("epoch %d/%d: test accuracy %.2f%%"
                  % (epoch + 1, args.epochs, accuracy(model, xte, yte)), flush=True)
    dist.barrier()
    seconds = time.perf_counter() - t0
    if rank == 0:
        print("accuracy %.2f" % accuracy(model, xte, yte))
        print("training %.3f s (%s, %d ranks, %d epochs)" % (seconds, args.backend, n,
                                                             args.epochs), flush=True)


def accuracy(model, x, y):
    model.eval()
    with torch.no_grad():
        return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def rank_main(rank, n, port, args):
    dist.init_process_group(args.backend, init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=n, timeout=datetime.timedelta(seconds=60))
    try:
        train(args)
    finally:
        dist.destroy_process_group()


def main():
    args = parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun, or another launcher
        dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=60))
        try:
            train(args)
        finally:
            dist.destroy_process_group()
        return
    if args.ranks < 1:
        sys.exit("ddp_digits: --ranks must be at least 1")
    with socket.socket() as s:  # the store's port: rank 0 binds it at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(rank_main, args=(args.ranks, port, args), nprocs=args.ranks)


if __name__ == "__main__":
    main()
