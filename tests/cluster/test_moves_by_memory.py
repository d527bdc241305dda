"""A tensor moved between two workers of this host (``t.to()``) read by the receiving worker
straight out of the sending one's memory (``workers.lent_memory``), where no slot of shared
memory is ready: real brokers and workers on loopback."""

from __future__ import annotations

import signal

import numpy as np
import pytest

import fabric
from fabric.core.errors import RequestTimeout
from fabric.transport import bulk

from polling import wait_for
from test_cross_memory import connect, through_memory
from test_shm_ahead import _state
from test_shm_path import DTYPES, random_array
from test_shm_path import shm_cluster  # noqa: F401 (a fixture)

MiB = 1 << 20


def lent_bytes(session: fabric.Session) -> int:
    """Bytes ``session``'s device keeps lent by memory, once it ran what was sent."""
    session.sync()
    return session.stats()["device_lent_bytes"]


@pytest.mark.timeout(120)
def test_every_dtype_moves_by_memory_and_each_lend_is_let_go(shm_cluster):
    with connect(shm_cluster, device=0) as session, connect(shm_cluster, device=1) as other:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        assert other.arange(4).sum().numpy() == 6 and through_memory(other)
        for dtype in DTYPES:
            array = random_array(dtype, (1024, 1100))  # (1 MiB at least)
            moved = session.asarray(array).to(other)
            assert moved.session is other
            np.testing.assert_array_equal(moved.numpy(), array)
            assert lent_bytes(session) == 0  # (released once the receiver answered)
        moved = session.asarray(np.arange(MiB, dtype=np.float64))[::2].to(other)  # a view
        np.testing.assert_array_equal(moved.numpy(), np.arange(0, MiB, 2, dtype=np.float64))
        assert lent_bytes(session) == 0


@pytest.mark.timeout(120)
def test_a_move_whose_receiver_never_answered_keeps_its_lend_and_both_go_on(monkeypatch):
    # A lend is let go only once the receiver said it read it: given up on, it stays (until
    # its time runs out), so that the receiver, once it runs again, reads what was lent.
    with fabric.LocalCluster(workers=2, heartbeat=2.0) as cluster, \
            connect(cluster, device=0, timeout=10) as session, \
            connect(cluster, device=1, timeout=1) as other:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        assert other.arange(4).sum().numpy() == 6 and through_memory(other)
        tensor = session.asarray(np.arange(MiB, dtype=np.float64))
        receiver = cluster.workers[1]
        decide = bulk.slot_for_move

        def stopping_the_receiver(*args):  # (once it agreed to take the tensor)
            receiver.send_signal(signal.SIGSTOP)
            wait_for(lambda: _state(receiver.pid) == "T", 5, "the worker to stop")
            return decide(*args)

        monkeypatch.setattr(bulk, "slot_for_move", stopping_the_receiver)
        try:
            with pytest.raises(RequestTimeout):
                tensor.to(other)
            assert lent_bytes(session) == tensor.nbytes  # (the sender is another worker)
        finally:
            receiver.send_signal(signal.SIGCONT)
        monkeypatch.undo()
        other.timeout = 10
        moved = tensor.to(other)
        np.testing.assert_array_equal(moved.numpy(), np.arange(MiB, dtype=np.float64))
        assert lent_bytes(session) == tensor.nbytes  # (the first lend waits for its time)
        assert all(worker.poll() is None for worker in cluster.workers)


@pytest.mark.timeout(120)
def test_without_cross_memory_a_move_takes_a_slot(shm_cluster):
    with connect(shm_cluster, device=0, shared_memory=fabric.SharedMemory(
            cross_memory=False)) as session, \
            connect(shm_cluster, device=1, shared_memory=fabric.SharedMemory(
                cross_memory=False)) as other:
        assert session.arange(4).sum().numpy() == 6 and not through_memory(session)
        tensor = session.asarray(np.arange(MiB, dtype=np.float64))
        moved = tensor.to(other)
        np.testing.assert_array_equal(moved.numpy(), np.arange(MiB, dtype=np.float64))
        assert lent_bytes(session) == 0 and other.in_device_slots
