"""Helpers of the Python suite: processes spawned (multiprocessing, spawn), each with a tfab
context on the provider under test (TFAB_PROVIDER, as meson's python-* tests set it), joined
through the TCP bootstrap; every wait bounded."""
import multiprocessing as mp
import os
import queue
import traceback

PROVIDER = os.environ.get("TFAB_PROVIDER", "shm")
SPAWN = mp.get_context("spawn")


def context(**settings):
    import tfab
    settings.setdefault("connect_timeout_ms", 20000)
    return tfab.Context(PROVIDER, **settings)


def _child(index, func, args, results, ports):
    try:
        value = func(index, ports, *args)
        results.put((index, "ok", value))
    except BaseException:  # reported to the parent, which fails the test
        results.put((index, "err", traceback.format_exc()))


def connect_all(ctx, index, ports, nprocs, timeout=20.0):
    """Process 0 listens and accepts nprocs - 1 peers (a list, in connection order: index
    order is not guaranteed); the others connect to it. Returns the list of peers."""
    if index == 0:
        port = ctx.listen("127.0.0.1", 0)
        for _ in range(nprocs - 1):
            ports.put(port)
        peers = {}
        for _ in range(nprocs - 1):
            p = ctx.accept(timeout)
            peers[len(peers) + 1] = p
        return peers
    port = ports.get(timeout=timeout)
    return {0: ctx.connect("127.0.0.1", port, timeout)}


def run(*targets, timeout=120.0, on_start=None, on_end=None):
    """Run targets ((func, args) each; func(index, ports, *args)) in spawned processes; return
    their values in order, or raise with the failing process's traceback. on_start(procs) may
    watch them, and returns the indexes of those it killed (the killed-peer test); on_end(procs)
    runs first at the end, whatever happened (to end a process it stopped)."""
    results = SPAWN.Queue()
    ports = SPAWN.Queue()
    procs = [SPAWN.Process(target=_child, args=(i, f, a, results, ports), daemon=True)
             for i, (f, a) in enumerate(targets)]
    for p in procs:
        p.start()
    values = {}
    errors = []
    killed = set()
    try:
        if on_start:
            killed = set(on_start(procs) or ())
        import time
        deadline = time.monotonic() + timeout
        while len(values) + len(errors) + len(killed) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("processes did not finish in %.0f s (done: %s)"
                                     % (timeout, sorted(values)))
            try:
                i, kind, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                # A process that died without reporting (and is not expected to).
                dead = [i for i, p in enumerate(procs)
                        if p.exitcode not in (None, 0) and i not in values and i not in killed]
                if dead:
                    raise AssertionError("process %s died: exit %s"
                                         % (dead, [procs[i].exitcode for i in dead]))
                continue
            if kind == "ok":
                values[i] = value
            else:
                errors.append("process %d:\n%s" % (i, value))
                break
    finally:
        if on_end:
            on_end(procs)
        for p in procs:
            p.join(timeout=10)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    if errors:
        raise AssertionError("\n".join(errors))
    return [values.get(i) for i in range(len(procs))]
