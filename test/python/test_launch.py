"""tfab.World under torch's launchers (doc/python.md, "Worlds under torchrun"): MASTER_PORT is
torch's store's, so the ranks meet through that store, and the world binds no port of its
own. torchrun with its c10d rendezvous (what --standalone runs; rank 0 hosts the store) and
with its static one (its agent hosts the store), and a launch by hand with torch's variables
(rank 0 hosts it); torch's own process group shares the port before or after. Each launch is
bounded, and its whole process group is killed at the end."""
import os
import signal
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "common"))
from testprocs import free_port  # noqa: E402

pytest.importorskip("torch.distributed")
SCRIPT = os.path.join(HERE, "launched.py")
WAIT_S = 150
TORCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RUN_ID")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in TORCH_VARS and k not in ("TFAB_RANK", "TFAB_WORLD_SIZE",
                                                "TFAB_MASTER_ADDR", "TFAB_MASTER_PORT")}
    env.update(TFAB_LOG_LEVEL="info", OMP_NUM_THREADS="1", **extra)
    return env


def run_all(procs):
    """Every process's (exit status, output) within WAIT_S seconds for them all; then each
    one's process group is killed, whatever is left of it."""
    outs = []
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
                out += "\n(killed: still running after %d s)" % WAIT_S
            outs.append((p.returncode, out))
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    return outs


def check(out, rank, size=2, gloo=2):
    assert "WORLD 0 %d %d %g" % (rank, size, sum(range(1, size + 1))) in out, out
    assert "WORLD 1 %d %d %g" % (rank, size, sum(range(11, size + 11))) in out, out
    assert "GLOO %g" % gloo in out and "OK" in out, out
    # The library joined through the store (an allgather), not at a port of its own.
    assert "meeting through an allgather" in out, out
    assert "belongs to torch's store" not in out, out


def torchrun(rdzv, order):
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc_per_node", "2", "--max_restarts", "0",
            # torch 1.13 on Python 3.11 reads the default redirects ("0") as None and fails:
            # stdout to a file and to the console, stderr as it is.
            "--redirects", "1", "--tee", "1"] + rdzv + [SCRIPT, order]
    p = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    (rc, out), = run_all([p])
    assert rc == 0, out
    for rank in range(2):
        mine = "\n".join(line.split(":", 1)[1] for line in out.splitlines()
                         if line.startswith("[default%d]:" % rank))
        check(mine + "\n" + out, rank)


def test_torchrun_c10d_rendezvous(tmp_path):
    # What --standalone runs, on a free port rather than its fixed 29400: the agent picks
    # MASTER_PORT and hosts nothing there (TORCHELASTIC_USE_AGENT_STORE=False), so rank 0
    # hosts the store.
    torchrun(["--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % free_port(),
              "--log_dir", str(tmp_path)], "tfab-first")


def test_torchrun_static_agent_store(tmp_path):
    # The static rendezvous: the agent hosts the store on MASTER_PORT, every rank a client.
    torchrun(["--master_addr", "127.0.0.1", "--master_port", str(free_port()),
              "--log_dir", str(tmp_path)], "torch-first")


@pytest.mark.parametrize("order", ["tfab-first", "torch-first"])
def test_master_port_by_hand(order):
    # No torchrun: no one hosts torch's store, so rank 0 does (shared with init_process_group).
    port = free_port()
    procs = [subprocess.Popen([sys.executable, SCRIPT, order],
                              env=clean_env(RANK=str(r), WORLD_SIZE="2",
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) for r in (1, 0)]
    outs = run_all(procs)[::-1]
    for rank, (rc, out) in enumerate(outs):
        assert rc == 0, out
        check(out, rank)
