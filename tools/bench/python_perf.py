#!/usr/bin/python3
"""python_perf.py: tfab-perf tensor's two measurements from Python (the tfab package), for
python-vs-c.sh. A server process sends, a client receives, on one TFAB_PROVIDER path:
  bandwidth: the server keeps WINDOW sends posted, the client WINDOW receives, each (key "bw",
    step i) once, into tensors of the library's pool (tfab-perf's default), or with --heap-dst
    into an array of its own (out=); one send buffer, as tfab-perf has;
  latency: ping-pong of one tensor each way, the receives of the next round posted ahead as
    tfab-perf's are; one-way latency is half a round trip.
Prints one JSON object per size: test "python", bytes, iters, window, gbps, lat_us, copies.
usage: python_perf.py [-p PROVIDER] [-s 8,64M] [-n ITERS] [-w WINDOW]
Needs PYTHONPATH to hold the tfab package (build/lib/python)."""
import argparse
import json
import multiprocessing as mp
import time

import numpy as np

import tfab


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(text[:-1] if mult > 1 else text) * mult


def iters_of(size, n):
    if n:
        return n
    return max(32, min(100000, (2 << 30) // max(size, 1)))


def window_of(size, w):
    if w:
        return w
    return max(2, min(16, (256 << 20) // max(size, 1), 64))


HEAP_DST = False


def out_of(array):
    """Where a receive lands: the library's tensor (its pool, as tfab-perf's default), or with
    --heap-dst the caller's array (out=), as tfab-perf --heap-dst."""
    return array if HEAP_DST else None


def server(provider, sizes, n, w, q, heap_dst):
    global HEAP_DST
    HEAP_DST = heap_dst
    with tfab.Context(provider) as ctx:
        q.put(ctx.listen("127.0.0.1", 0))
        peer = ctx.accept(timeout=30)
        step = 0
        for size in sizes:
            src = np.zeros(size, np.uint8)
            iters, window = iters_of(size, n), window_of(size, w)
            # Warm-up (meta-data cache, registrations), then bandwidth.
            for phase in (max(iters // 10, 2), iters):
                futs = []
                for i in range(phase):
                    futs.append(ctx.send("bw", step, src))
                    step += 1
                    if len(futs) >= window:
                        futs.pop(0).result(120)
                for f in futs:
                    f.result(120)
            # Latency: answer each ping with a pong, as tfab-perf does: the receives of this
            # round and the next posted ahead (into two arrays in turn), sends from another.
            rx = [np.zeros(size, np.uint8) for _ in range(2)]
            rounds = max(iters // 10, 2) + iters
            ahead = [ctx.recv_async(peer, "ping", step + k, out=out_of(rx[k % 2]))
                     for k in range(2)]
            pending = []
            for i in range(rounds):
                ahead.pop(0).result(120)
                pending.append(ctx.send("pong", step + i, src))
                if i + 2 < rounds:
                    ahead.append(ctx.recv_async(peer, "ping", step + i + 2,
                                                out=out_of(rx[i % 2])))
                if len(pending) > 2:
                    pending.pop(0).result(120)
            for f in pending:
                f.result(120)
            step += rounds
        ctx.flush(120)


def client(provider, sizes, n, w, q, out, heap_dst):
    global HEAP_DST
    HEAP_DST = heap_dst
    with tfab.Context(provider) as ctx:
        peer = ctx.connect("127.0.0.1", q.get(timeout=30), timeout=30)
        step = 0
        for size in sizes:
            dst = np.zeros(size, np.uint8)
            iters, window = iters_of(size, n), window_of(size, w)
            for phase in (max(iters // 10, 2), iters):
                t0 = time.perf_counter()
                futs = []
                for i in range(phase):
                    futs.append(ctx.recv_async(peer, "bw", step, out=out_of(dst)))
                    step += 1
                    if len(futs) >= window:
                        futs.pop(0).result(120)  # a library tensor goes back to the pool
                for f in futs:
                    f.result(120)
                del futs
                t1 = time.perf_counter()
            gbps = size * iters * 8 / (t1 - t0) / 1e9
            # Latency, as tfab-perf does: the pong receives of this round and the next
            # posted ahead (their requests travel during the round before), into two arrays
            # in turn; the pings sent from another; a send's completion waited for later.
            rx = [np.zeros(size, np.uint8) for _ in range(2)]
            warm = max(iters // 10, 2)
            rounds = warm + iters
            ahead = [ctx.recv_async(peer, "pong", step + k, out=out_of(rx[k % 2]))
                     for k in range(2)]
            pending = []
            for i in range(rounds):
                if i == warm:
                    t0 = time.perf_counter()
                pending.append(ctx.send("ping", step + i, dst))
                ahead.pop(0).result(120)
                if i + 2 < rounds:
                    ahead.append(ctx.recv_async(peer, "pong", step + i + 2,
                                                out=out_of(rx[i % 2])))
                if len(pending) > 2:
                    pending.pop(0).result(120)
            t1 = time.perf_counter()
            for f in pending:
                f.result(120)
            step += rounds
            lat = (t1 - t0) / iters / 2 * 1e6
            out.put(json.dumps({"test": "python", "path": peer.path, "bytes": size,
                                "iters": iters, "window": window, "gbps": gbps,
                                "GBps": gbps / 8, "lat_us": lat,
                                "copies": ctx.stats()["bytes_copied"]}))
        out.put(None)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-p", "--provider", default=None)
    ap.add_argument("-s", "--sizes", default="8,64M")
    ap.add_argument("-n", "--iters", type=int, default=0)
    ap.add_argument("-w", "--window", type=int, default=0)
    ap.add_argument("--heap-dst", action="store_true",
                    help="receive into the caller's arrays (out=), as tfab-perf --heap-dst")
    a = ap.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    mp.set_start_method("spawn")
    q, out = mp.Queue(), mp.Queue()
    ps = [mp.Process(target=server, args=(a.provider, sizes, a.iters, a.window, q, a.heap_dst)),
          mp.Process(target=client,
                     args=(a.provider, sizes, a.iters, a.window, q, out, a.heap_dst))]
    for p in ps:
        p.start()
    rc = 0
    while True:
        try:
            line = out.get(timeout=600)
        except Exception:
            rc = 1
            break
        if line is None:
            break
        print(line, flush=True)
    for p in ps:
        p.join(timeout=60)
        if p.is_alive():
            p.kill()
            rc = 1
        elif p.exitcode:
            rc = 1
    raise SystemExit(rc)


if __name__ == "__main__":
    main()
