#!/usr/bin/env python3
"""context-cycle.py: what a context costs to open and to close, per path setting.

Creates and destroys a tfab.Context REPS times for each TFAB_PROVIDER value given (default:
auto, then shm), and prints the medians of creation and destruction in ms and the resident
memory a live context adds. The bound beside them is the shm path alone (no libfabric).

usage: PYTHONPATH=build/lib/python python3 tools/bench/context-cycle.py [REPS] [PROVIDER ...]
"""
import statistics
import sys
import time

import tfab


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    providers = sys.argv[2:] or ["auto", "shm"]
    print(f"{'provider':>10} {'create ms':>10} {'destroy ms':>11} {'rss KiB':>9}")
    for p in providers:
        create, destroy, rss = [], [], []
        for _ in range(reps):
            before = rss_kib()
            t0 = time.perf_counter()
            ctx = tfab.Context(provider=p)
            t1 = time.perf_counter()
            rss.append(rss_kib() - before)
            ctx.close()
            t2 = time.perf_counter()
            create.append((t1 - t0) * 1e3)
            destroy.append((t2 - t1) * 1e3)
        print(f"{p:>10} {statistics.median(create):10.2f} {statistics.median(destroy):11.2f} "
              f"{statistics.median(rss):9.0f}")


if __name__ == "__main__":
    main()
