#!/usr/bin/python3
"""torch_vs_gloo.py: torch.distributed on tfab's backend beside gloo, in one run, interleaved.
  allreduce: dist.all_reduce of float32 tensors from 8 B to 64 MiB on N local ranks (spawned),
    each backend in its own ranks, the two backends' turns alternating from round to round.
    Rank 0 times ITERS calls (after a barrier and a warm-up); every rank's time is the same
    call count, so rank 0's is the job's. Beside them, the same ranks' allreduce through
    tfab.World directly (the Python package without torch): what the process group's own
    Python costs.
  ddp: doc/examples/ddp_digits.py under each backend (its "training" seconds and accuracy).
Prints each round's figures as JSON lines, then a table of the medians: time per call, bus
bandwidth (2 (N-1)/N bytes / time, as NCCL's tests count it), tfab/gloo ratios.
usage: torch_vs_gloo.py [--ranks 4] [--rounds 3] [--sizes 8,256,8K,256K,4M,64M] [--no-ddp]
Needs PYTHONPATH to hold the tfab package (build/lib/python)."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tfab.torch  # noqa: F401 (registers "tfab" in every rank: spawn imports this module)

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "..", "doc", "examples", "ddp_digits.py")


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(text[:-1] if mult > 1 else text) * mult


def iters_of(nbytes, backend):
    # about 0.3 s of gloo's calls; tfab's the same count
    return max(5, min(1000, (16 << 20) // max(nbytes, 1) if nbytes >= 65536 else 300))


def rank_main(rank, n, port, backend, sizes, q):
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=n)
    out = []
    world = None
    if backend == "tfab":
        world = dist.distributed_c10d._get_default_group()._world
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4))
        iters = iters_of(nbytes, backend)
        for _ in range(min(iters, 20)):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        secs = (time.perf_counter() - t0) / iters
        direct = None
        if world is not None:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                world.allreduce(t).result()
            direct = (time.perf_counter() - t0) / iters
        out.append((nbytes, iters, secs, direct))
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        q.put(out)


def allreduce_round(n, backend, sizes):
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(rank_main, args=(n, port, backend, sizes, q), nprocs=n,
                       start_method="spawn")
    return q.get()


def ddp_round(n, backend):
    env = dict(os.environ)
    p = subprocess.run([sys.executable, EXAMPLE, "--backend", backend, "--ranks", str(n)],
                       capture_output=True, text=True, timeout=600, env=env)
    if p.returncode:
        sys.exit("torch_vs_gloo: ddp_digits --backend %s failed:\n%s%s"
                 % (backend, p.stdout, p.stderr))
    acc = float(re.search(r"^accuracy ([\d.]+)", p.stdout, re.M).group(1))
    secs = float(re.search(r"^training ([\d.]+) s", p.stdout, re.M).group(1))
    return secs, acc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default="8,256,8K,256K,4M,64M")
    ap.add_argument("--no-ddp", action="store_true")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    n = args.ranks
    ar = {"tfab": {}, "gloo": {}, "tfab-world": {}}
    ddp = {"tfab": [], "gloo": []}
    for r in range(args.rounds):
        order = ("tfab", "gloo") if r % 2 == 0 else ("gloo", "tfab")
        for backend in order:
            for nbytes, iters, secs, direct in allreduce_round(n, backend, sizes):
                ar[backend].setdefault(nbytes, []).append(secs)
                if direct is not None:
                    ar["tfab-world"].setdefault(nbytes, []).append(direct)
                print(json.dumps({"round": r, "test": "allreduce", "backend": backend,
                                  "bytes": nbytes, "iters": iters, "us": secs * 1e6,
                                  "world_us": None if direct is None else direct * 1e6}),
                      flush=True)
        if not args.no_ddp:
            for backend in order:
                secs, acc = ddp_round(n, backend)
                ddp[backend].append((secs, acc))
                print(json.dumps({"round": r, "test": "ddp_digits", "backend": backend,
                                  "seconds": secs, "accuracy": acc}), flush=True)
    med = statistics.median
    print("\nall_reduce, %d ranks, medians of %d rounds (us per call; busbw GB/s)"
          % (n, args.rounds))
    print("%10s %12s %12s %10s %12s %10s %10s %12s" % (
        "bytes", "tfab us", "gloo us", "tfab/gloo", "tfab.World us", "tfab GB/s",
        "gloo GB/s", "busbw ratio"))
    for nbytes in sizes:
        t, g, w = (med(ar[k][nbytes]) for k in ("tfab", "gloo", "tfab-world"))
        bus = 2 * (n - 1) / n * nbytes / 1e9
        print("%10d %12.1f %12.1f %10.3f %12.1f %10.3f %10.3f %12.2f" % (
            nbytes, t * 1e6, g * 1e6, t / g, w * 1e6, bus / t, bus / g, g / t))
    if not args.no_ddp:
        t = med(s for s, _ in ddp["tfab"])
        g = med(s for s, _ in ddp["gloo"])
        print("\nddp_digits, %d ranks, medians of %d rounds: tfab %.3f s (accuracy %s), "
              "gloo %.3f s (accuracy %s), tfab/gloo %.3f" % (
                  n, args.rounds, t, [a for _, a in ddp["tfab"]], g,
                  [a for _, a in ddp["gloo"]], t / g))


if __name__ == "__main__":
    main()
