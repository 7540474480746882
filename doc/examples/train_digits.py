"""Data-parallel training of a small torch MLP on the digits data set of Debian's python3-sklearn
(sklearn.datasets.load_digits: 1797 8x8 images, no download), its gradients merged at every
step by tfab's allreduce (avg), one per parameter tensor, all in flight at once, in place in
the parameters' .grad (no copy).

    PYTHONPATH=build/lib/python /usr/bin/python3 doc/examples/train_digits.py --ranks 4
        [--compress int8] [--epochs 10] [--batch 64]

It starts its ranks itself (spawned processes, a torchrun-style environment on 127.0.0.1 with a
free port), or, when the environment names its rank, is one rank under a launcher:
TFAB_RANK, TFAB_WORLD_SIZE, TFAB_MASTER_ADDR, TFAB_MASTER_PORT (torchrun's RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT too), or Open MPI's OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE
with TFAB_MASTER_ADDR and TFAB_MASTER_PORT given:

    mpirun -np 4 -x TFAB_MASTER_ADDR=127.0.0.1 -x TFAB_MASTER_PORT=29511 -x PYTHONPATH \\
        /usr/bin/python3 doc/examples/train_digits.py

Every rank starts from rank 0's weights (a fixed seed, and a broadcast from rank 0), and takes
its shard of each epoch's shuffled training set (rank r: every N-th sample from r, as
torch's DistributedSampler does) in batches of batch/N, so that N ranks take the same total
batches and steps as one: --ranks 1 trains alone, the same way. Rank 0 prints the test
accuracy after each epoch, whether every rank ended with the same weights, then
`accuracy <test accuracy in %>` and what its context sent.
"""
import argparse
import multiprocessing as mp
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=None,
                   help="ranks to start (default 4; under a launcher, the world's size)")
    p.add_argument("--compress", choices=["fp16", "bf16", "int8"], default=None,
                   help="compress the gradients while they travel")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=64, help="the total batch of all ranks")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def launcher_env():
    """The environment's rank, as TFAB_* variables; False when it names none."""
    env = os.environ
    if "TFAB_RANK" in env:
        return True
    if "OMPI_COMM_WORLD_RANK" in env:
        env["TFAB_RANK"] = env["OMPI_COMM_WORLD_RANK"]
        env["TFAB_WORLD_SIZE"] = env["OMPI_COMM_WORLD_SIZE"]
        if "TFAB_MASTER_ADDR" not in env:
            sys.exit("train_digits: under mpirun, give TFAB_MASTER_ADDR and TFAB_MASTER_PORT "
                     "(mpirun -x TFAB_MASTER_ADDR=host0 -x TFAB_MASTER_PORT=29511)")
        return True
    if "RANK" in env and "WORLD_SIZE" in env and "MASTER_ADDR" in env:  # torchrun
        env["TFAB_RANK"], env["TFAB_WORLD_SIZE"] = env["RANK"], env["WORLD_SIZE"]
        env["TFAB_MASTER_ADDR"] = env["MASTER_ADDR"]
        env.setdefault("TFAB_MASTER_PORT", str(int(env.get("MASTER_PORT", "29500")) + 1))
        return True
    return False


def data(seed):
    import numpy as np
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=seed,
                                          stratify=y)
    return (torch.from_numpy(xtr), torch.from_numpy(ytr), torch.from_numpy(xte),
            torch.from_numpy(yte))


def train(args):
    """One rank's training, in a world from the environment (TFAB_RANK, ...)."""
    import torch
    import tfab

    torch.set_num_threads(1)  # a rank per core at most: no threads fighting over them
    torch.manual_seed(args.seed)
    xtr, ytr, xte, yte = data(args.seed)
    with tfab.Context() as ctx, tfab.World(ctx, timeout=60) as world:
        rank, n = world.rank, world.size
        if args.batch % n:
            raise SystemExit("train_digits: --batch %d is not a multiple of %d ranks"
                             % (args.batch, n))
        local = args.batch // n
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 10))
        with torch.no_grad():  # rank 0's weights everywhere, whatever the seeds did
            for f in [world.broadcast(p.data, 0) for p in model.parameters()]:
                f.result(60)
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        names = [name for name, _ in model.named_parameters()]
        steps = len(xtr) // args.batch
        t0 = time.time()
        for epoch in range(args.epochs):
            order = torch.randperm(len(xtr), generator=torch.Generator().manual_seed(
                args.seed * 1000 + epoch))
            shard = order[rank::n]
            model.train()
            total = 0.0
            for step in range(steps):
                idx = shard[step * local:(step + 1) * local]
                opt.zero_grad()
                loss = loss_fn(model(xtr[idx]), ytr[idx])
                loss.backward()
                # Every gradient in flight at once, averaged in place in its .grad.
                futs = [world.allreduce(p.grad, op="avg", compress=args.compress,
                                        key=name if args.compress else None)
                        for name, p in zip(names, model.parameters())]
                for f in futs:
                    f.result(60)
                opt.step()
                total += loss.item()
            # the mean loss of every rank's batches
            mean = world.allreduce(torch.tensor([total / steps], dtype=torch.float64),
                                   op="avg").result(60)
            if rank == 0:
                print("epoch %d/%d: loss %.4f, test accuracy %.2f%%"
                      % (epoch + 1, args.epochs, mean.item(), accuracy(model, xte, yte)),
                      flush=True)
        acc = accuracy(model, xte, yte)
        stats = ctx.stats()
        # Data parallel: every replica holds the same weights, bit for bit.
        with torch.no_grad():
            mine = torch.stack([sum(p.double().sum() for p in model.parameters()),
                                sum((p.double() ** 2).sum() for p in model.parameters())])
        every = world.allgather(mine).result(60)
        in_sync = all(torch.equal(every[0], every[r]) for r in range(n))
    if rank == 0:
        print("replicas in sync: %s" % ("yes" if in_sync else "NO"))
        print("accuracy %.2f" % acc)
        wire = stats.get("coll_bytes_wire", stats["bytes_sent"])
        print("wire bytes %d (rank 0 sent, %d ranks, %d steps, %.1f s)"
              % (wire, n, steps * args.epochs, time.time() - t0), flush=True)
    return acc


def accuracy(model, x, y):
    import torch
    model.eval()
    with torch.no_grad():
        return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def free_port():
    """Rank 0's rendezvous port: below Linux's default ephemeral range (32768 up), where the
    ranks' own listeners take theirs (one could take a port that bind(0) gave before rank 0
    listened on it), and apart from other runs' by the process id."""
    return 22768 + os.getpid() % 10000


def rank_main(rank, n, port, args):
    os.environ.update({"TFAB_RANK": str(rank), "TFAB_WORLD_SIZE": str(n),
                       "TFAB_MASTER_ADDR": "127.0.0.1", "TFAB_MASTER_PORT": str(port)})
    try:
        train(args)
    except tfab_error() as e:
        sys.exit("train_digits: rank %d: %s" % (rank, e))


def tfab_error():
    import tfab
    return tfab.Error


def main():
    args = parse_args()
    if launcher_env():
        size = int(os.environ["TFAB_WORLD_SIZE"])
        if args.ranks is not None and args.ranks != size:
            sys.exit("train_digits: --ranks %d, but the launcher's world has %d"
                     % (args.ranks, size))
        try:
            train(args)
        except tfab_error() as e:
            sys.exit("train_digits: %s" % e)
        return
    n = 4 if args.ranks is None else args.ranks
    if n < 1:
        sys.exit("train_digits: --ranks must be at least 1")
    spawn = mp.get_context("spawn")
    port = free_port()
    procs = [spawn.Process(target=rank_main, args=(r, n, port, args)) for r in range(n)]
    for p in procs:
        p.start()
    deadline = time.time() + 600
    try:
        for p in procs:
            p.join(max(0.1, deadline - time.time()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    codes = [p.exitcode for p in procs]
    if any(codes):
        sys.exit("train_digits: ranks ended with %s" % codes)


if __name__ == "__main__":
    main()
