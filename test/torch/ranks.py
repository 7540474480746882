"""Ranks of a torch.distributed job for the tests: ``run(n, fn, *args)`` starts n processes
with torch.multiprocessing's spawn, each joining the default group (tfab, or gloo) through a
tcp:// store on a free port, calls ``fn(rank, size, *args)`` there and returns every rank's
value. A rank's exception fails the call with its traceback; every wait is bounded and a
rank still running at the end is killed. fn is a test module's top-level function (spawn
imports it by name)."""
import datetime
import os
import sys
import traceback

import torch.multiprocessing as mp

import testprocs


def _main(rank, size, url, backend, with_gloo, timeout_s, destroy, fn, args, q):
    try:
        import torch.distributed as dist
        import tfab.torch  # noqa: F401 (registers the backend)
        timeout = datetime.timedelta(seconds=timeout_s)
        if url.startswith("store:"):  # a store made here, handed to torch
            store = dist.TCPStore("127.0.0.1", int(url[6:]), size, rank == 0, timeout)
            dist.init_process_group(backend, store=store, rank=rank, world_size=size,
                                    timeout=timeout)
        elif url.startswith("env:"):  # env:// reads all four from the environment
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=url[4:], RANK=str(rank),
                              WORLD_SIZE=str(size))
            dist.init_process_group(backend, init_method="env://", timeout=timeout)
        else:
            dist.init_process_group(backend, init_method=url, rank=rank, world_size=size,
                                    timeout=timeout)
        if with_gloo:
            gloo = dist.new_group(backend="gloo")
            value = fn(rank, size, gloo, *args)
        else:
            value = fn(rank, size, *args)
        if destroy:
            dist.destroy_process_group()
        q.put((rank, True, value))
    except BaseException:  # noqa: B902 (every failure goes to the parent)
        q.put((rank, False, traceback.format_exc()))
        sys.stdout.flush()
        os._exit(1)


def run(n, fn, *args, backend="tfab", with_gloo=False, timeout_s=60, wait_s=240, env=None,
        expect_fail=(), init="tcp", tmp=None, destroy=True):
    """Every rank's value of fn, in rank order. with_gloo: fn(rank, size, gloo_group, *args),
    the default group being backend's. Ranks in expect_fail may die: their value is None.
    init: how the ranks meet, "tcp", "env", "file" (a file in the folder tmp) or "store".
    destroy: each rank destroys its default group after fn (False: fn does)."""
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    port = testprocs.free_port()
    url = {"tcp": "tcp://127.0.0.1:%d" % port, "env": "env:%d" % port,
           "store": "store:%d" % port,
           "file": "file://%s/store" % tmp}[init]
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        procs = [ctx.Process(target=_main,
                             args=(r, n, url, backend, with_gloo, timeout_s, destroy, fn, args, q),
                             daemon=True) for r in range(n)]
        for p in procs:
            p.start()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    import time
    end = time.monotonic() + wait_s
    got = {}
    errors = []
    try:
        while len(got) + len(errors) < n - len(expect_fail):
            if time.monotonic() > end:
                errors.append("ranks %s still running after %d s"
                              % (sorted(set(range(n)) - set(got)), wait_s))
                break
            if q.empty():
                if all(not p.is_alive() for p in procs) and q.empty():
                    errors.append("ranks %s ended without a result (exit codes %s)"
                                  % (sorted(set(range(n)) - set(got)),
                                     [p.exitcode for p in procs]))
                    break
                time.sleep(0.01)
                continue
            rank, ok, value = q.get()
            if ok:
                got[rank] = value
            elif rank not in expect_fail:
                errors.append("rank %d failed:\n%s" % (rank, value))
    finally:
        for p in procs:
            p.join(max(0.1, min(10, end - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(5)
    if errors:
        raise AssertionError("\n".join(errors))
    return [got.get(r) for r in range(n)]


def launch(cmd, wait_s=240, torchrun=None, log_dir=None):
    """Runs cmd (a list) in a session of its own, under torchrun with torchrun ranks on this
    host where given: its output, stderr included. Fails (AssertionError) where it exits
    non-zero, prints a traceback, or is still running after wait_s (then its whole session
    is killed)."""
    import signal
    import subprocess
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
               "--nproc_per_node", str(torchrun), "--rdzv_backend", "c10d",
               "--rdzv_endpoint", "127.0.0.1:%d" % testprocs.free_port(),
               # Debian's torch 1.13 on Python 3.11 cannot parse the default "0" of these
               # two (no IntFlag member 0 when iterated)
               "--redirects", "2", "--tee", "2"] + (
                   ["--log_dir", str(log_dir)] if log_dir else []) + list(cmd)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError("%s still running after %d s:\n%s" % (" ".join(cmd), wait_s, out))
    assert p.returncode == 0, out
    assert "Traceback" not in out, out  # not even in a thread that torchrun let pass
    return out
