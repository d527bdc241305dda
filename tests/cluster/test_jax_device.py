"""The jax device in real worker processes: refused with exit 2 where jax is missing, N XLA
CPU devices for --devices N, tensors moved between them, a dtype XLA cannot hold refused at
the op's line, and a compile that never starves the worker's heartbeats."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from value_edges import CASES, check_on

import fabric
from fabric import LocalCluster
from fabric.core.errors import DtypeNotSupported
from fabric.core.flow import COMPILES_BATCHES

HEARTBEAT = 0.2  # (liveness 3: a worker silent for 0.6 s is lost)


def test_a_jax_worker_without_jax_exits_2_within_seconds_naming_the_extra():
    # jax hidden from this Python, as where it is not installed (None in sys.modules)
    hide = ("import sys; sys.modules['jax'] = None; from fabric.cli.main import main; "
            "main(['worker', '--backend', 'jax', '--broker', 'tcp://127.0.0.1:1'])")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "FABRIC_WORKER_TOKEN": "t" * 32})
    assert done.returncode == 2, done.stderr
    assert time.monotonic() - started < 15
    assert "jax is not installed" in done.stderr and "fabric-arrays[jax]" in done.stderr


def test_devices_n_are_n_xla_cpu_devices_and_tensors_move_between_them(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # (on a GPU host too: its CPU's devices)
    with LocalCluster(workers=1, backend="jax", devices_per_worker=2) as cluster:
        listed = fabric.devices(cluster.address, token=cluster.token, timeout=10)
        assert [(d.backend, d.settings["platform"], d.settings["device"]) for d in listed] \
            == [("jax", "cpu", "cpu:0"), ("jax", "cpu", "cpu:1")]
        with cluster.connect(device=0) as first, cluster.connect(device=1) as second:
            a = first.asarray(np.arange(12.0).reshape(3, 4))
            b = (a * 2).to(second)  # out of device 0 through host memory, into device 1
            c = second.arange(4) + b.sum(axis=0)
            np.testing.assert_array_equal(c.numpy(), np.arange(4) + (np.arange(12.0).reshape(
                3, 4) * 2).sum(axis=0))
            assert second.zeros(3).numpy().tolist() == [0, 0, 0]  # made on device 1


def test_a_dtype_xla_cannot_hold_is_refused_at_the_call():
    """The device says which dtypes it holds: an upload, a cast or a creation of another is
    refused by the client before anything is sent."""
    with LocalCluster(workers=1, backend="jax") as cluster, cluster.connect() as session:
        assert "float128" not in session.device.settings["dtypes"]
        x = session.asarray(np.ones(3))
        for refused in (lambda: session.asarray(np.ones(3, np.longdouble)),
                        lambda: x.astype(np.longdouble),
                        lambda: session.zeros(3, dtype=np.clongdouble)):
            sent = session.stats()["batches_sent"]
            with pytest.raises(DtypeNotSupported, match="cannot hold (float|complex)") as raised:
                refused()
            assert "astype to one of" in raised.value.message
            assert session.stats()["batches_sent"] == sent
        assert (x + 1).sum().numpy() == 6  # the session goes on


def test_a_long_compile_never_starves_the_heartbeats():
    with LocalCluster(workers=1, backend="jax", heartbeat=HEARTBEAT) as cluster, \
            cluster.connect() as session:
        @fabric.function
        def long(x):
            for _ in range(600):
                x = np.tanh(x) * 0.5 + np.sin(x) * 0.25
            return x
        x = session.asarray(np.linspace(0, 1, 100))
        started = time.perf_counter()
        first = long(x).numpy()  # traced and compiled on the device's thread
        compiled_in = time.perf_counter() - started
        started = time.perf_counter()
        again = long(x).numpy()
        replayed_in = time.perf_counter() - started
        # (longer than twice the 0.6 s a worker may stay silent)
        assert compiled_in > 2 * HEARTBEAT * 3, "the compile was too short to tell"
        assert replayed_in < compiled_in / 5
        stats = session.stats()
        assert stats["device_compiles"] == 1 and stats["device_compile_seconds"] > 0
        expected = np.linspace(0, 1, 100)
        for _ in range(600):
            expected = np.tanh(expected) * 0.5 + np.sin(expected) * 0.25
        np.testing.assert_allclose(first, expected, rtol=1e-12)
        np.testing.assert_array_equal(again, first)
        # the broker heard the worker all along: the same session serves on
        assert session.asarray(np.ones(2)).sum().numpy() == 2
        assert [d.worker for d in fabric.devices(cluster.address, token=cluster.token)] \
            == ["worker-0"]


def test_a_streamed_loop_gives_numpys_values_as_its_batches_are_compiled(jax_session):
    def step(x, b):
        for _ in range(4):
            x = x * b + 0.25
        return x
    values = np.random.default_rng(1).random((2, 1000))
    x, b = (jax_session.asarray(v) for v in values)
    expected = values[0]
    for _ in range(150):  # (batches of 256 entries: each is seen again, and replayed)
        x = step(x, b)
        expected = step(expected, values[1])
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-12)
    stats = jax_session.stats()
    assert stats["ops"] >= 150 * 8
    assert stats["device_batch_graphs"] >= 1 and stats["device_batch_replays"] >= 1


def test_an_update_drops_a_values_leading_ones_as_numpy_does(jax_session):
    # (found by test_differential's chains: jax's .at[] refuses a value of more dimensions)
    local = np.zeros((2, 3), np.float32)
    t = jax_session.asarray(local)
    t[..., :1] = jax_session.asarray(np.ones((1, 2, 1)))
    t[0] = np.full((1, 1, 3), 2.0)
    local[..., :1], local[0] = np.ones((1, 2, 1)), np.full((1, 1, 3), 2.0)
    np.testing.assert_array_equal(t.numpy(), local)


def test_a_worker_killed_mid_compile_fails_its_session_fast_and_typed():
    with LocalCluster(workers=1, backend="jax", heartbeat=HEARTBEAT) as cluster, \
            cluster.connect(timeout=30) as session:
        @fabric.function
        def longer(x):
            for _ in range(900):
                x = np.tanh(x) * 0.5 + np.sin(x) * 0.25
            return x
        result = longer(session.asarray(np.ones(10)))  # several seconds of trace and compile
        session.flush()
        time.sleep(0.5)
        cluster.workers[0].send_signal(signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(fabric.SessionLost, match="worker-0"):
            result.numpy()
        assert time.monotonic() - started < 10


def test_an_op_past_the_memory_limit_is_refused_and_the_jax_worker_goes_on():
    with LocalCluster(workers=1, backend="jax", worker_args=("--memory-limit", "100000")) \
            as cluster, cluster.connect() as session:
        small = session.ones(1000)
        big = session.ones((100, 1000))  # 800 KB past a 100 KB limit: never allocated
        with pytest.raises(fabric.QuotaExceeded, match="--memory-limit"):
            big.numpy()
        assert (small * 2).sum().numpy() == 2000  # the device and the session go on


def test_a_streamed_loop_on_large_arrays_is_cut_by_entries_alone_and_replayed(jax_session):
    """A jax device compiles the batches it sees again (its settings say so): the client cuts
    them by entries alone, not by the elements their ops touch, so each pass of a loop on
    large arrays sends the same batches (on a numpy device: two ops a batch at 1M elements)."""
    assert jax_session.device.settings["compiles"] == COMPILES_BATCHES
    values = np.random.default_rng(2).random((2, 1 << 20))
    x, b = (jax_session.asarray(v) for v in values)
    expected = values[0]
    sent = jax_session.stats()["batches_sent"]
    for _ in range(3):  # passes of 100 ops each: seen, seen again (compiled), replayed
        for _ in range(50):
            x = x * b + 0.25
            expected = expected * values[1] + 0.25
        np.testing.assert_allclose(x.numpy(), expected, rtol=1e-12)
    stats = jax_session.stats()
    assert stats["batches_sent"] - sent <= 3 * 2  # (under 512 entries a pass: one or two)
    assert stats["device_batch_replays"] >= 1


def test_a_streamed_loop_is_cut_where_it_repeats_so_that_few_batches_compile(jax_session):
    """A loop whose body does not divide a batch's entries (bench W5's cheap step: 50 ops
    and their 50 frees a call, against 512 entries a batch) sends the same batch each time
    round, cut where the body repeats: the device compiles a few, where batches cut at a
    count began at another step of the body each time (a new batch to compile for most)."""
    def step(x, b, c):  # (its argument let go after it returns: a body of 100 entries)
        for _ in range(25):
            x = x * b + c
        return x
    values = np.random.default_rng(3).random((3, 1000)) * [[1], [0.4], [1]]
    x, b, c = (jax_session.asarray(v) for v in values)
    before = jax_session.stats()
    for _ in range(3):
        y, expected = x, values[0]
        for _ in range(60):
            y, expected = step(y, b, c), step(expected, *values[1:])
        np.testing.assert_allclose(y.numpy(), expected, rtol=1e-12)
    stats = jax_session.stats()
    assert stats["device_compiles"] - before["device_compiles"] <= 4  # (cut at a count:
    # 12, and 12 replays)
    assert stats["device_batch_replays"] - before["device_batch_replays"] >= 20  # (of about
    # 12 batches a pass)


def test_sort_and_argsort_take_kind_and_stable_giving_numpys_stable_order_of_ties(jax_session):
    # (found by test_differential's chains: jax's sorts refused numpy's kind, and the client
    # numpy 2's stable)
    local = np.array([[1.0, 0.0, 1.0, 0.0, -0.0], [0.0, 0.0, 1.0, 1.0, 0.0]])
    t = jax_session.asarray(local)
    for how in ({"kind": "stable"}, {"stable": True}, {"kind": "quicksort"}, {}):
        np.testing.assert_array_equal(np.argsort(t, axis=None, **how).numpy(),
                                      np.argsort(local, axis=None, kind="stable"))
        np.testing.assert_array_equal(np.sort(t, axis=0, **how).numpy(), np.sort(local, axis=0))
    with pytest.raises(ValueError, match="can't be provided at the same time"):
        np.argsort(t, kind="stable", stable=True)


@pytest.mark.parametrize("name, args, params", CASES)
def test_values_xla_computes_otherwise_are_numpys_through_a_session(jax_session, name, args,
                                                                    params):
    check_on(jax_session, name, args, params)
