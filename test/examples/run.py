#!/usr/bin/env python3
"""Runs the C examples of doc/examples as a user would, on this host, every wait bounded.

    run.py pair PAIR              a sender and a receiver (pair.c)
    run.py allreduce ALLREDUCE N  N ranks of one world (allreduce.c)

The sender listens on a port of the system's choosing and prints it; the world's rank 0
listens on a port that was free a moment before, below the ephemeral range (testprocs.py).
So runs in parallel do not collide. Exits 0
when every process exited 0, else prints what each one said and exits 1.
"""
import os
import select
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testprocs import free_port, finish  # noqa: E402

WAIT_S = 30


def start(argv, env=None):
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def report(outs):
    for i, (rc, out) in enumerate(outs):
        print("--- process %d (exit %s):\n%s" % (i, rc, out.strip()))
    return 0 if all(rc == 0 for rc, _ in outs) else 1


def pair(exe):
    sender = start([exe, "send", "0"])
    ready, _, _ = select.select([sender.stdout], [], [], WAIT_S)
    line = sender.stdout.readline() if ready else ""
    if not line.startswith("listening on port "):
        return report(finish([sender], WAIT_S, {0: line}))
    receiver = start([exe, "recv", "127.0.0.1", line.split()[-1]])
    return report(finish([sender, receiver], WAIT_S, {0: line}))


def allreduce(exe, n):
    env = dict(os.environ, TFAB_WORLD_SIZE=str(n), TFAB_MASTER_ADDR="127.0.0.1",
               TFAB_MASTER_PORT=str(free_port()), TFAB_WORLD_TIMEOUT_MS="20000")
    return report(finish([start([exe], dict(env, TFAB_RANK=str(r))) for r in range(n)], WAIT_S))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "pair":
        sys.exit(pair(sys.argv[2]))
    if len(sys.argv) == 4 and sys.argv[1] == "allreduce":
        sys.exit(allreduce(sys.argv[2], int(sys.argv[3])))
    sys.exit(__doc__)
