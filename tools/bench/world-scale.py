#!/usr/bin/env python3
"""world-scale: worlds of many ranks on this host, what their join and their allreduces take
and what each rank holds.

Per world size N, one run of

    tfab-perf allreduce --ranks N -s 8,64K -n 10 --verify --footprint --json

(N local processes on the default path: native shm on one host): a join, 10 verified
allreduces of 8 B and of 64 KiB after a barrier, then the world's footprint. Printed per size:
the slowest rank's join, each allreduce's latency, and per rank the memory it holds alone and
its share of shared memory (proportional set sizes, so that pages two ranks map count half to
each), its file descriptors and the peers it connected. With --mpi, Open MPI's MPI_Allreduce
on the same ranks and sizes (mpirun --oversubscribe, tools/bench/mpi_allreduce.c) runs beside
each, interleaved over --rounds, and the table gives medians and tfab's latency over MPI's.

A world that fails (the join, an allreduce, a wrong result, the time limit) prints why and the
script goes on to the next size; it exits 1 if any did.

usage: tools/bench/world-scale.py [--ranks 16,64,256,1024] [--rounds 1] [--mpi]
                                  [--timeout S] [--build DIR] [--json FILE]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = "8,64K"


def raise_fd_limit():
    """Each rank may hold a descriptor or more per peer: the soft limit up to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_tfab(perf, n, timeout):
    """One world of n ranks: ({bytes: row}, the world row, wall seconds) or (None, why, s)."""
    cmd = [perf, "allreduce", "--ranks", str(n), "-s", SIZES, "-n", "10", "--verify",
           "--footprint", "--json"]
    env = dict(os.environ, TFAB_LOG_LEVEL=os.environ.get("TFAB_LOG_LEVEL", "warn"))
    t0 = time.monotonic()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                             preexec_fn=raise_fd_limit, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None, "no result within %d s" % timeout, time.monotonic() - t0
    wall = time.monotonic() - t0
    rows, world = {}, None
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if r["test"] == "world":
                world = r
            else:
                rows[r["bytes"]] = r
    if out.returncode or world is None or not all(r["verified"] for r in rows.values()):
        why = [l for l in out.stderr.splitlines() if l.strip()]
        return None, "exit %d: %s" % (out.returncode, why[-1] if why else "no output"), wall
    return rows, world, wall


def run_mpi(mpi, n, timeout):
    """Open MPI's allreduce on n ranks: {bytes: row}, or None."""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(n), mpi, "-s", SIZES,
           "-n", "10"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             preexec_fn=raise_fd_limit, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode:
        return None
    return {r["bytes"]: r for r in map(json.loads, (l for l in out.stdout.splitlines()
                                                    if l.startswith("{")))}


def med(v):
    return statistics.median(v) if v else None


def fmt(v, spec):
    return format(v, spec) if v is not None else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="16,64,256,1024")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--mpi", action="store_true", help="Open MPI's allreduce beside each")
    ap.add_argument("--timeout", type=int, default=900, help="seconds a world may take")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--json", help="write every run's rows here")
    a = ap.parse_args()
    perf = os.path.join(a.build, "tools", "tfab-perf")
    mpi = os.path.join(a.build, "tools", "mpi-allreduce")
    if not os.access(perf, os.X_OK):
        sys.exit("world-scale: no %s (build first)" % perf)
    if a.mpi and not (shutil.which("mpirun") and os.access(mpi, os.X_OK)):
        sys.exit("world-scale: --mpi needs mpirun and %s (Debian: openmpi-bin, libopenmpi-dev)"
                 % mpi)
    sizes = [int(x) for x in a.ranks.split(",")]
    runs, failed = [], False
    for rnd in range(a.rounds):
        for n in sizes:
            rows, world, wall = run_tfab(perf, n, a.timeout)
            run = {"round": rnd, "ranks": n, "wall_s": wall}
            if rows is None:
                run["failed"] = world
                failed = True
                print("world-scale: %d ranks failed after %.0f s: %s" % (n, wall, world),
                      file=sys.stderr)
            else:
                run.update(tfab=rows, world=world)
            if a.mpi:
                run["mpi"] = run_mpi(mpi, n, a.timeout)
            runs.append(run)
            print("world-scale: round %d, %d ranks: %.1f s" % (rnd + 1, n, wall), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(runs, f, indent=1)
    b8, b64 = 8, 64 << 10
    print("worlds on one host (%d cores), %d round(s), medians; tfab-perf allreduce, path %s"
          % (os.cpu_count(), a.rounds,
             next((r["world"]["path"] for r in runs if "world" in r), "-")))
    head = ("ranks", "ok", "run s", "join s", "8 B us", "64K us", "own MiB", "shm MiB", "fds",
            "peers")
    if a.mpi:
        head += ("MPI 8 B us", "8 B tfab/MPI", "MPI 64K us", "64K tfab/MPI")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for n in sizes:
        rs = [r for r in runs if r["ranks"] == n]
        ok = [r for r in rs if "world" in r]
        w = lambda k: med([r["world"][k] for r in ok])
        lat = lambda b: med([r["tfab"][b]["lat_us"] for r in ok])
        cells = [str(n), "%d/%d" % (len(ok), len(rs)), fmt(med([r["wall_s"] for r in rs]), ".1f"),
                 fmt(w("join_ms") / 1e3 if ok else None, ".2f"), fmt(lat(b8), ".1f"),
                 fmt(lat(b64), ".1f"), fmt(w("rss_kb") / 1024 if ok else None, ".1f"),
                 fmt(w("shm_kb") / 1024 if ok else None, ".2f"), fmt(w("fds"), ".0f"),
                 fmt(w("peers"), ".1f")]
        if a.mpi:
            m = [r["mpi"] for r in rs if r.get("mpi")]
            m8, m64 = med([x[b8]["lat_us"] for x in m]), med([x[b64]["lat_us"] for x in m])
            cells += [fmt(m8, ".1f"), fmt(lat(b8) / m8 if ok and m8 else None, ".2f"),
                      fmt(m64, ".1f"), fmt(lat(b64) / m64 if ok and m64 else None, ".2f")]
        print("| " + " | ".join(cells) + " |")
    for r in runs:
        if "failed" in r:
            print("%d ranks, round %d: %s" % (r["ranks"], r["round"] + 1, r["failed"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
