"""Tensors between spawned processes on the provider under test (TFAB_PROVIDER)."""
import os

import pytest

import scenarios
import tfabtest
from tfabtest import run


def test_every_dtype_zero_copy_and_shape_changes():
    sent, path = run((scenarios.dtypes_send, (0,)), (scenarios.dtypes_recv, (0,)))
    assert sent > 0
    assert path, "the peer has a path"


def test_torch_both_ways():
    pytest.importorskip("torch")
    assert run((scenarios.torch_a, (0,)), (scenarios.torch_b, (0,))) == [True, True]


def test_out_refused_then_taken():
    _, errors = run((scenarios.out_send, (0,)), (scenarios.out_recv, (0,)))
    assert errors == ["EINVAL", "EINVAL", "EINVAL", "strided"]


def test_strings():
    assert run((scenarios.strings_send, (0,)), (scenarios.strings_recv, (0,))) == [True, True]


def test_timeout_and_cleanup():
    _, elapsed = run((scenarios.timeout_peer, (0,)), (scenarios.timeout_recv, (0,)))
    assert elapsed < 5


def test_killed_peer():
    if tfabtest.PROVIDER.startswith("ofi:shm"):
        pytest.skip("a killed process leaves libfabric shm's /dev/shm objects behind")
    event = tfabtest.SPAWN.Event()

    def kill_sender_when_received(procs):
        assert event.wait(60), "the first tensor never arrived"
        procs[0].kill()
        return [0]

    _, (name, elapsed, status) = run((scenarios.killed_sender, (event,)),
                                     (scenarios.killed_receiver, (event,)),
                                     on_start=kill_sender_when_received)
    assert elapsed < 30, elapsed
    assert status < 0


def test_three_processes():
    n = 4
    got = run((scenarios.fan_source, (n,)), *[(scenarios.fan_sink, (n,))] * (n - 1))
    assert got[0] == [1, 2, 3]
    assert sorted(got[1:]) == [1, 2, 3]


def test_receives_in_a_loop_flat_memory():
    # 100,000 on the fast paths; the slow libfabric ones check the same with fewer.
    n = int(os.environ.get("TFAB_PY_LOOP", "100000" if tfabtest.PROVIDER == "shm" else "20000"))
    _, (grown_kib, objs_grown, _) = run((scenarios.loop_send, (n,)),
                                        (scenarios.loop_recv, (n,)), timeout=600)
    assert grown_kib < 2048, "resident memory grew by %d KiB" % grown_kib
    assert objs_grown < 100, "%d more objects tracked by the GC" % objs_grown
