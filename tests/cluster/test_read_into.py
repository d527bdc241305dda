"""Reads into an array the caller holds (``t.numpy(out=buffer)``: ``fabric.arrays.read_target``,
``fabric.transport.bulk_reads``), end to end on real processes: a large read of the tensor's own
layout and dtype is written there by the worker, with no segment and no new memory of this
process's; any other is read and copied in; ``out`` is checked before anything is sent; a read
given up keeps ``out`` alive for the worker's late write. The leak checks of ``test_shm_path``
apply here too."""

from __future__ import annotations

import gc
import os
import signal

import numpy as np
import pytest

import fabric
from fabric.core.errors import RemoteError, RequestTimeout
from fabric.core.shm import held_segments
from fabric.mesh import combining
from fabric.transport import bulk_reads

from polling import wait_for
from test_cross_memory import _state, connect, through_memory
from test_shm_path import EVERYTHING, no_segments_left, shm_cluster  # noqa: F401 (fixtures)

MiB = 1 << 20


def segments_made(session: fabric.Session) -> int:
    """The segments this process's pool holds (free or lent), and this process's own."""
    pool = session.connection.segments
    return len(pool.free) + len(pool.lent) + len(held_segments(os.getpid()))


@pytest.mark.timeout(90)
def test_a_loop_reading_into_one_buffer_is_written_there_with_no_segment(shm_cluster):
    with connect(shm_cluster) as session:
        a = np.random.default_rng(0).random((1024, 1024))  # 8 MiB
        uploaded = session.asarray(a)
        computed = uploaded * 2
        session.sync()
        assert through_memory(session)
        pool = session.connection.segments
        made, transfers, read = segments_made(session), pool.transfers, \
            session.stats()["bytes_read"]
        buffer = np.zeros_like(a)
        for tensor, expected in [(uploaded, a), (computed, a * 2), (uploaded, a)]:
            assert tensor.numpy(out=buffer) is buffer
            np.testing.assert_array_equal(buffer, expected)
        assert pool.transfers == transfers + 3  # (each written straight in by the worker)
        assert segments_made(session) == made  # (no slot, where a third read takes one)
        assert session.stats()["bytes_read"] == read + 3 * a.nbytes
        # ... where a read of the same size without out= takes a slot of this process's own
        # from its second one on
        tensor = session.asarray(a)
        tensor.numpy(), tensor.numpy()
        assert segments_made(session) > made


@pytest.mark.timeout(90)
def test_out_of_another_layout_or_dtype_is_filled_as_numpy_copyto_would(shm_cluster):
    with connect(shm_cluster) as session:
        a = np.random.default_rng(1).random((512, 2048))  # 8 MiB
        tensor = session.asarray(a)
        targets = [np.zeros(a.shape, np.float64, order="F"),  # another layout
                   np.zeros(a.shape, np.float32),  # a dtype same_kind casting takes
                   np.zeros((1024, 2048))[::2],  # a strided view
                   np.zeros(a.shape, a.dtype.newbyteorder())]  # the other byte order
        for out in targets:
            assert tensor.numpy(out=out) is out
            np.testing.assert_array_equal(out, a.astype(out.dtype))
        small = session.asarray(np.arange(6).reshape(2, 3))  # (the socket path)
        out = np.zeros((2, 3), np.int64)
        assert small.numpy(out=out) is out
        np.testing.assert_array_equal(out, np.arange(6).reshape(2, 3))


@pytest.mark.timeout(60)
def test_out_is_checked_before_anything_is_sent(shm_cluster):
    with connect(shm_cluster) as session:
        tensor = session.asarray(np.ones((4, 5)))
        session.sync()
        reads = session.stats()["reads"]
        cases = [(ValueError, "shape", np.zeros((5, 4))),
                 (ValueError, "read-only", np.broadcast_to(np.zeros(()), (4, 5))),
                 (TypeError, "same_kind", np.zeros((4, 5), np.int64)),
                 (TypeError, "numpy array", [[0.0] * 5] * 4)]
        for error, words, out in cases:
            with pytest.raises(error, match=words):
                tensor.numpy(out=out)
        with pytest.raises(ValueError, match="copy=False"):
            tensor.numpy(copy=False, out=np.zeros((4, 5)))
        assert session.stats()["reads"] == reads
        assert tensor.numpy().sum() == 20


@pytest.mark.timeout(60)
def test_a_failed_op_read_into_out_raises_and_leaves_out_as_it_was(shm_cluster):
    with connect(shm_cluster) as session:
        a = session.asarray(np.ones((1024, 1024)))
        failed = np.linalg.inv(session.asarray(np.zeros((1024, 1024))))  # (singular)
        out = np.full(a.shape, 7.0)
        with pytest.raises(RemoteError, match="[Ss]ingular"):
            failed.numpy(out=out)
        assert np.all(out == 7.0)
        assert a.numpy(out=out) is out and np.all(out == 1.0)


@pytest.mark.timeout(60)
def test_progress_reads_each_chunk_into_out(shm_cluster):
    with connect(shm_cluster) as session:
        a = np.random.default_rng(2).random(5 * MiB)  # 40 MiB: three chunks
        tensor = session.asarray(a)
        for out in (np.zeros_like(a), np.zeros(a.shape, np.float32)):
            seen = []
            assert tensor.numpy(out=out, progress=lambda done, total: seen.append(done)) \
                is out
            np.testing.assert_array_equal(out, a.astype(out.dtype))
            assert seen[0] == 0 and seen[-1] == a.nbytes and len(seen) == 4


@pytest.mark.timeout(90)
def test_a_sharded_tensor_is_gathered_into_out(shm_cluster):
    with connect(shm_cluster) as session:
        mesh = session.mesh([0, 1])
        a = np.random.default_rng(3).random((1024, 1536))  # 12 MiB
        for axis in (0, 1, None):
            sharded = mesh.asarray(a, axis=axis)
            out = np.zeros_like(a)
            assert sharded.numpy(out=out) is out
            np.testing.assert_array_equal(out, a)
            np.testing.assert_array_equal(sharded.numpy(), a)
        total = mesh.asarray(a, axis=0).sum(axis=0)  # (combined on the client)
        out = np.zeros(a.shape[1])
        assert total.numpy(out=out) is out
        np.testing.assert_allclose(out, a.sum(axis=0))
        with pytest.raises(ValueError, match="shape"):
            sharded.numpy(out=np.zeros((3, 3)))


@pytest.mark.timeout(60)
def test_np_copyto_into_a_numpy_array_reads_there_and_into_a_tensor_updates_it(shm_cluster):
    with connect(shm_cluster) as session:
        a = np.random.default_rng(6).random((1024, 1024))
        tensor = session.asarray(a)
        session.sync()
        pool, transfers = session.connection.segments, session.connection.segments.transfers
        buffer = np.zeros_like(a)
        assert np.copyto(buffer, tensor) is None
        np.testing.assert_array_equal(buffer, a)
        assert pool.transfers == transfers + 1  # (written straight in: t.numpy(out=))
        rows = np.zeros((2, 1024))
        np.copyto(rows, tensor[0])  # (broadcast, as numpy's)
        np.testing.assert_array_equal(rows, [a[0], a[0]])
        mask = np.arange(1024) % 2 == 0
        kept = np.full((4, 1024), -1.0)
        np.copyto(kept, tensor[:4], where=mask)
        np.testing.assert_array_equal(kept, np.where(mask, a[:4], -1.0))
        np.copyto(kept, 7.0, where=session.asarray(mask))  # (a tensor mask: read)
        np.testing.assert_array_equal(kept, np.broadcast_to(np.where(mask, 7.0, -1.0), (4, 1024)))
        with pytest.raises(TypeError, match="same_kind"):
            np.copyto(np.zeros(a.shape, np.int64), tensor)
        truncated = np.zeros(a.shape, np.int64)
        np.copyto(truncated, tensor * 10, casting="unsafe")
        np.testing.assert_array_equal(truncated, (a * 10).astype(np.int64))
        target = session.zeros((4, 1024))
        row = target[1]  # (a view: the update reaches its base, as numpy's)
        np.copyto(target, a[:4])
        np.copyto(row, tensor[0] * 2)
        np.copyto(target, 5.0, where=mask)
        expected = a[:4].copy()
        expected[1] = a[0] * 2
        expected[:, mask] = 5.0
        np.testing.assert_array_equal(target.numpy(), expected)
        with pytest.raises(TypeError, match="same_kind"):
            np.copyto(session.zeros(3, dtype="int64"), tensor[0, :3])
        with pytest.raises(ValueError):
            np.copyto(target, np.ones(5))
        np.testing.assert_array_equal(target.numpy(), expected)  # (refused: unchanged)


@pytest.mark.timeout(60)
def test_a_closed_mesh_keeps_none_of_its_reductions_partials(shm_cluster):
    # (found through the test above: the partials kept for the same reduction again held
    # their values, read into slots of this process's pool, past the session's close)
    with connect(shm_cluster, shared_memory=EVERYTHING) as session:
        mesh = session.mesh([0, 1])
        a = np.random.default_rng(5).random((1024, 1536))
        np.testing.assert_allclose(mesh.asarray(a, axis=0).sum(axis=0).numpy(), a.sum(axis=0))
        ids = {each.id for each in mesh.sessions}
        assert any(name[0] in ids for key in combining._REDUCED for name in key[-1])
    assert not any(name[0] in ids for key in combining._REDUCED for name in key[-1])
    gc.collect()
    assert held_segments(os.getpid()) == {}


@pytest.mark.timeout(90)
def test_a_read_given_up_keeps_out_alive_for_the_late_write():
    with fabric.LocalCluster(workers=1, heartbeat=2.0) as cluster, \
            connect(cluster, timeout=10) as session:
        a = np.random.default_rng(4).random((1024, 1024))
        tensor = session.asarray(a)
        session.sync()
        assert through_memory(session)
        out = np.zeros_like(a)
        worker = cluster.workers[0]
        worker.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: _state(worker.pid) == "T", 5, "the worker to stop")
            session.timeout = 0.5
            with pytest.raises(RequestTimeout):
                tensor.numpy(out=out)
        finally:
            session.timeout = 10
            worker.send_signal(signal.SIGCONT)
        assert any(kept is out for kept in bulk_reads._RETIRED)  # (kept alive, for ...)
        wait_for(lambda: np.array_equal(out, a), 10, "the worker's late write into out")
        bulk_reads._RETIRED[:] = [kept for kept in bulk_reads._RETIRED if kept is not out]
        assert tensor.numpy(out=np.zeros_like(a)).sum() == a.sum()  # (the session goes on)
