"""Zero-copy uploads (``session.upload_buffer`` and ``asarray``; ``fabric.transport.bulk``): an
array written in a slot its device lent becomes a tensor with no copy at all, end to end on real
processes: its values, its lifetime, its slot never leaked, and every other array (another
session's buffer, a view of one, a sealed one) uploaded as before, by a copy."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import fabric
from fabric.core.shm import SharedMemory, held_segments, parse_name

from conftest import HEARTBEAT
import test_shm_path
from test_shm_path import mapped

no_segments_left = test_shm_path.no_segments_left  # (autouse: nothing left open or mapped)

SHAPE = (512, 1024)  # 4 MiB of float64: over the 1 MiB threshold


@pytest.fixture(scope="module")
def one_worker():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as running:
        yield running


def connect(cluster, **options) -> fabric.Session:
    return fabric.connect(cluster.address, token=cluster.token, **options)


def device_segments(cluster) -> int:
    """How many segments of its own pool the worker holds."""
    worker = cluster.workers[0].pid
    return sum(parse_name(name).pid == worker for name in held_segments(worker))


def sealed(session: fabric.Session, seed: int) -> tuple[fabric.Tensor, np.ndarray]:
    """A tensor made of an upload buffer filled with random values, and those values."""
    values = np.random.default_rng(seed).random(SHAPE)
    buffer = session.upload_buffer(SHAPE)
    buffer[...] = values
    return session.asarray(buffer), values


@pytest.mark.timeout(60)
def test_a_buffer_becomes_a_tensor_without_a_copy_and_turns_read_only(one_worker):
    with connect(one_worker) as session:
        buffer = session.upload_buffer(SHAPE, "int32")
        assert buffer.flags.writeable and buffer.flags.c_contiguous
        assert buffer.dtype == np.int32 and buffer.shape == SHAPE
        buffer[...] = np.arange(buffer.size, dtype=np.int32).reshape(SHAPE)
        transfers = session.connection.segments.transfers
        tensor = session.asarray(buffer)
        assert not buffer.flags.writeable
        with pytest.raises(ValueError):
            buffer[0, 0] = 1
        expected = np.arange(buffer.size, dtype=np.int32).reshape(SHAPE)
        np.testing.assert_array_equal((tensor + 1).numpy(), expected + 1)
        # Nothing went inside a message: the put named the slot, the read took another.
        assert session.stats()["bytes_uploaded_by_socket"] == 0
        assert session.connection.segments.transfers == transfers + 2
        # A read-only view of the tensor is the buffer's memory itself.
        view = tensor.numpy(copy=False)
        assert view.__array_interface__["data"][0] == buffer.__array_interface__["data"][0]
        del view


@pytest.mark.timeout(60)
def test_the_tensor_outlives_its_buffer_and_the_buffer_keeps_its_tensor(one_worker):
    with connect(one_worker) as session:
        tensor, values = sealed(session, 1)
        gc.collect()
        np.testing.assert_array_equal(tensor.numpy(), values)  # the buffer is gone
        # A buffer whose tensor the caller dropped still holds it: its slot is lent to no
        # other upload, so its values never change.
        buffer = session.upload_buffer(SHAPE)
        buffer[...] = values
        session.asarray(buffer)  # (dropped at once)
        gc.collect()
        for seed in range(4):
            sealed(session, 10 + seed)
            session.asarray(np.random.default_rng(seed).random(SHAPE)).sum().numpy()
        np.testing.assert_array_equal(buffer, values)


@pytest.mark.timeout(90)
def test_no_slot_is_leaked_by_buffers_dropped_unsealed_or_sealed(one_worker):
    with connect(one_worker) as session:
        def cycles(count: int) -> None:
            for seed in range(count):
                unused = session.upload_buffer(SHAPE)
                unused[0, 0] = seed
                del unused  # (its slot goes back with the next slot request)
                tensor, values = sealed(session, seed)
                assert tensor[0, :3].numpy().tolist() == values[0, :3].tolist()
                del tensor
                gc.collect()

        cycles(3)
        session.sync()
        held = device_segments(one_worker)
        cycles(12)
        session.sync()
        assert device_segments(one_worker) == held
        assert session.slots_ahead.returning == []  # (given back as the next was asked for)


@pytest.mark.timeout(60)
def test_a_buffer_of_another_session_a_view_of_one_or_one_sealed_is_copied(one_worker):
    with connect(one_worker) as session, session.open(0) as other:
        buffer = session.upload_buffer(SHAPE)
        buffer[...] = 7.0
        copied = other.asarray(buffer)  # (another session's slot: copied, as any array)
        part = session.asarray(buffer[1:])  # a view: copied too
        assert buffer.flags.writeable  # neither sealed it
        buffer[...] = 8.0
        assert copied.sum().numpy() == 7.0 * buffer.size
        assert part.sum().numpy() == 7.0 * buffer[1:].size
        tensor = session.asarray(buffer)
        again = session.asarray(buffer)  # sealed already: copied into a slot of its own
        buffer_data = buffer.__array_interface__["data"][0]
        assert again.numpy(copy=False).__array_interface__["data"][0] != buffer_data
        assert tensor.sum().numpy() == again.sum().numpy() == 8.0 * buffer.size


@pytest.mark.timeout(60)
def test_where_no_slot_can_be_lent_a_buffer_is_an_ordinary_array(one_worker):
    with connect(one_worker, shared_memory=False) as no_shm, connect(one_worker) as session:
        for buffer in (no_shm.upload_buffer(SHAPE), session.upload_buffer(100)):
            assert buffer.base is None
            buffer[...] = 3
        buffer = no_shm.upload_buffer((4, 5), "int16")
        buffer[...] = 3
        assert no_shm.asarray(buffer).numpy().tolist() == [[3] * 5] * 4
        assert buffer.flags.writeable  # (copied: it stays the caller's)


def test_a_bad_shape_or_dtype_says_so(one_worker):
    with connect(one_worker, shared_memory=SharedMemory(threshold=0)) as session:
        with pytest.raises(ValueError, match="negative"):
            session.upload_buffer((3, -1))
        with pytest.raises(TypeError, match="cannot live on a device"):
            session.upload_buffer(3, object)
        with pytest.raises(TypeError):
            session.upload_buffer(2.5)
    with pytest.raises(fabric.FabricError):
        session.upload_buffer(3)  # closed


def test_a_buffer_that_outlives_its_session_is_read_only_and_mapped_until_it_goes(
        one_worker):
    worker = one_worker.workers[0].pid
    with connect(one_worker) as session:
        buffer, unused = session.upload_buffer(SHAPE), session.upload_buffer(SHAPE)
        session.asarray(buffer)
        assert unused.flags.writeable
    # (their slots are the device's again: no one may write there)
    assert not buffer.flags.writeable and not unused.flags.writeable
    assert mapped(os.getpid(), worker)
    del buffer, unused
    gc.collect()
    assert not mapped(os.getpid(), worker)
