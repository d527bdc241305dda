"""End-to-end: one connection, sessions on many devices, tensors moved between them."""

from __future__ import annotations

import numpy as np
import pytest

import fabric
from fabric.core.errors import RemoteError


@pytest.fixture(scope="module")
def four_devices():
    """Two workers with two devices each: devices 0, 1 on worker-0 and 2, 3 on worker-1."""
    with fabric.LocalCluster(workers=2, devices_per_worker=2, heartbeat=0.2) as running:
        yield running


@pytest.fixture
def sessions(four_devices):
    first = four_devices.connect(device=0)
    opened = [first] + [first.open(device=d) for d in (1, 2, 3)]
    yield opened
    for session in opened:
        session.close()


def test_one_connection_serves_sessions_on_every_device(sessions):
    assert [s.device.index for s in sessions] == [0, 1, 2, 3]
    assert [s.device.worker for s in sessions] == ["worker-0"] * 2 + ["worker-1"] * 2
    assert len({id(s.connection) for s in sessions}) == 1
    assert [s.arange(3).sum().numpy() for s in sessions] == [3, 3, 3, 3]


@pytest.mark.parametrize("target", [1, 2], ids=["same-worker", "other-worker"])
def test_to_moves_identical_bytes_without_the_client(four_devices, sessions, target):
    original = np.random.default_rng(3).standard_normal((512, 300))  # 1.2 MB
    source = sessions[0].asarray(original)
    uploaded = sessions[0].stats()["bytes_uploaded"]
    moved = source.to(sessions[target])
    assert moved.session is sessions[target] and (moved.shape, moved.dtype) == (
        original.shape, original.dtype)
    assert sessions[0].stats()["bytes_uploaded"] == uploaded  # nothing went up again
    assert moved[0, 0].numpy() == original[0, 0]  # (it has arrived)
    # Between two devices of one worker it moves in memory, and between two workers of this
    # host through shared memory (tests/cluster/test_shm_path.py): the broker never carries it.
    with four_devices.admin() as admin:
        routed = {int(row["id"], 16): row["bytes"] for row in admin.sessions()}
    assert routed[sessions[target].id] < original.nbytes
    assert moved.numpy().tobytes() == original.tobytes()
    np.testing.assert_array_equal((moved * 2).sum(axis=0).numpy(), (original * 2).sum(axis=0))


def test_a_moved_poisoned_tensor_carries_its_error(sessions):
    ints = sessions[0].asarray(np.arange(1, 4))
    bad = ints ** sessions[0].asarray(np.array([-1, -1, -1]))
    moved = bad.to(sessions[3])
    with pytest.raises(RemoteError, match="power"):
        moved.numpy()
    with pytest.raises(RemoteError):
        sessions[0].sync()  # the source still reports it too
    assert (moved.session.arange(2) + 1).numpy().tolist() == [1, 2]


def test_to_the_same_session_is_the_tensor_itself(sessions):
    tensor = sessions[1].ones(3)
    assert tensor.to(sessions[1]) is tensor


def test_the_connection_closes_with_its_last_session(four_devices):
    first = four_devices.connect(device=0)
    second = first.open(device=2)  # (on first's connection; closed with first, too)
    second.close()
    assert not first.connection.closed
    assert first.ones(2).sum().numpy() == 2
    first.close()
    assert first.connection.closed and second.connection is first.connection
