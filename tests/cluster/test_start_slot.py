"""A session's start slot (``fabric.transport.slots_ahead``, ``workers.device_pool``): the
first session of a connection asks its device, right behind its probe, for a slot that its
first upload of that size is written into; the slot is mapped and faulted in on the client
pool's thread before the upload needs it; a device keeps a segment ready for the next one,
lends a bounded number, and yields them to a tight budget. End to end on real processes,
with the leak checks of ``test_shm_path``."""

from __future__ import annotations

import numpy as np
import pytest

import fabric
from fabric.core.errors import ConfigError
from fabric.core.shm import START_SLOT_BYTES, SharedMemory
from fabric.workers.device_pool import START_SLOTS

from conftest import HEARTBEAT
from polling import wait_for
from test_shm_attacks import own_segments, resident_in_mappings
from test_shm_path import NO_START, no_segments_left  # noqa: F401 (an autouse fixture)
from test_shm_views import in_device_slot

MiB = 1 << 20
FIRST = np.random.default_rng(5).random(START_SLOT_BYTES // 16)  # half the slot: it fits


def connect(cluster: fabric.LocalCluster, **options) -> fabric.Session:
    return fabric.connect(cluster.address, token=cluster.token, **options)


def answered(session: fabric.Session) -> bool:
    """Whether the start slot's answer came and was taken (each reply takes those come)."""
    session.sync()
    return not session.slots_ahead.asked


def arrived(session: fabric.Session) -> bool:
    """Whether the start slot came (``answered``, lending one)."""
    return answered(session) and bool(session.slots_ahead.arrived)


@pytest.mark.timeout(90)
def test_a_first_upload_is_written_into_the_start_slot_faulted_in_ahead():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster, \
            connect(cluster) as session:
        worker = cluster.workers[0].pid
        wait_for(lambda: arrived(session), 10, "the start slot")
        [slot] = [entry.ref for entry in session.slots_ahead.arrived]
        assert slot.nbytes == START_SLOT_BYTES and slot.owner.pid == worker
        # mapped here and faulted in, off the caller's thread, before any upload
        wait_for(lambda: resident_in_mappings(worker).get(slot.name) == START_SLOT_BYTES, 10,
                 "the start slot faulted in here")
        tensor = session.asarray(FIRST)
        assert session.slots_ahead.used == 1 and not session.slots_ahead.asked
        assert session.stats()["bytes_uploaded_by_shared_memory"] == FIRST.nbytes
        view = tensor.numpy(copy=False)  # the tensor is the slot itself
        assert in_device_slot(view, worker) and view.tobytes() == FIRST.tobytes()
        np.testing.assert_array_equal(tensor.numpy(), FIRST)
        # A second of the size is read out of this process's memory, and asks ahead for
        # the third's slot (a loop's)
        second = session.asarray(FIRST + 1)
        assert session.slots_ahead.asked and session.slots_ahead.used == 1
        np.testing.assert_array_equal(second.numpy(), FIRST + 1)
        del view


@pytest.mark.timeout(90)
def test_a_read_into_out_of_the_start_slot_is_copied_here_out_of_the_mapped_slot():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster, \
            connect(cluster) as session:
        wait_for(lambda: arrived(session), 10, "the start slot")
        tensor = session.asarray(FIRST)
        session.sync()
        assert session.slots_ahead.used == 1 and session.probe.reads_memory
        transfers = session.connection.segments.transfers
        out = np.zeros_like(FIRST)
        assert tensor.numpy(out=out) is out
        np.testing.assert_array_equal(out, FIRST)
        assert session.connection.segments.transfers == transfers + 1
        # the worker pinned the slot and wrote nothing (where it may write into this
        # process's memory, and would for a tensor in no slot); the unpin goes with what
        # follows
        assert len(session.unpinning) == 1
        out[0] = -1  # a copy: the tensor keeps its values
        assert (tensor[0] + 0).numpy() == FIRST[0]
        assert not session.unpinning and session.stats()["resident_bytes"] == FIRST.nbytes


@pytest.mark.timeout(90)
def test_only_a_connections_first_session_asks_and_an_upload_it_does_not_fit_leaves_it():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster, \
            connect(cluster) as session, session.open(0) as other:
        wait_for(lambda: arrived(session), 10, "the start slot")
        other.sync()
        assert not other.slots_ahead.arrived and not other.slots_ahead.asked
        small = np.arange(3 * MiB // 8, dtype=np.float64)  # 3 MiB: the slot is too large
        np.testing.assert_array_equal(session.asarray(small).numpy(), small)
        assert session.slots_ahead.used == 0 and len(session.slots_ahead.arrived) == 1


@pytest.mark.timeout(120)
def test_a_device_lends_a_bounded_number_and_keeps_one_ready_even_when_idle():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--shared-memory-idle", "0.5")) as cluster:
        worker = cluster.workers[0].pid
        # at its start, the device made a segment ready for the first start slot
        wait_for(lambda: sorted(own_segments(worker).values()) == [START_SLOT_BYTES], 10,
                 "the segment kept ready")
        sessions = [connect(cluster) for _ in range(START_SLOTS + 1)]
        try:
            for session in sessions:  # (one lent while the next is made comes once made)
                wait_for(lambda: answered(session), 10, "the start slot's answer")
            lent = [bool(session.slots_ahead.arrived) for session in sessions]
            assert lent == [True] * START_SLOTS + [False]
            assert not sessions[-1].slots_ahead.asked
            sessions[0].asarray(FIRST).numpy()  # one taken: the next connection gets one
            with connect(cluster) as late:
                wait_for(lambda: arrived(late), 10, "a start slot for the late session")
        finally:
            for session in sessions:
                session.close()
        # Closed: the lent slots come back, the free segments close once idle, and one stays
        # ready for the next session
        wait_for(lambda: sorted(own_segments(worker).values()) == [START_SLOT_BYTES], 20,
                 "the device's pool to shrink to the segment kept ready")


@pytest.mark.timeout(90)
def test_an_unused_start_slot_is_the_devices_not_the_sessions_limit():
    # 16 MiB lent, and 18 MiB of uploads it does not fit under a 20 MiB --memory-limit
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--memory-limit", str(20 * MiB))) as cluster, \
            connect(cluster) as session:
        wait_for(lambda: arrived(session), 10, "the start slot")
        part = np.ones(3 * MiB // 8)
        kept = [session.asarray(part * i) for i in range(6)]
        for i, tensor in enumerate(kept):
            np.testing.assert_array_equal(tensor.numpy(), part * i)
        assert START_SLOT_BYTES in [entry.ref.nbytes for entry in session.slots_ahead.arrived]


@pytest.mark.timeout(90)
def test_a_tight_budget_keeps_none_ready_and_lends_none():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--memory-budget", str(64 * MiB))) as cluster, \
            connect(cluster) as session:
        worker = cluster.workers[0].pid
        wait_for(lambda: answered(session), 10, "the start slot's answer")
        assert not session.slots_ahead.arrived
        assert not own_segments(worker)
        np.testing.assert_array_equal(session.asarray(FIRST).numpy(), FIRST)
        assert session.stats()["bytes_uploaded_by_socket"] == 0  # read out of memory


@pytest.mark.timeout(90)
def test_a_worker_that_shares_no_memory_answers_the_start_slot_without_an_error():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--no-shared-memory",)) as cluster, \
            connect(cluster) as session:
        wait_for(lambda: answered(session), 10, "the start slot's answer")
        assert not session.slots_ahead.arrived
        assert session.id not in session.connection.segments.slotless  # (no error came)
        np.testing.assert_array_equal(session.asarray(FIRST).numpy(), FIRST)
        assert session.stats()["bytes_uploaded_by_socket"] == FIRST.nbytes


@pytest.mark.timeout(90)
def test_start_slot_sizes_are_set_on_either_side_and_zero_turns_them_off():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--start-slot", str(4 * MiB))) as cluster:
        worker = cluster.workers[0].pid
        wait_for(lambda: sorted(own_segments(worker).values()) == [4 * MiB], 10,
                 "a 4 MiB segment kept ready")
        with connect(cluster, shared_memory=SharedMemory(start_slot=4 * MiB)) as session:
            wait_for(lambda: arrived(session), 10, "the start slot")
            [slot] = [entry.ref for entry in session.slots_ahead.arrived]
            assert slot.nbytes == 4 * MiB
        with connect(cluster, shared_memory=SharedMemory(start_slot=0)) as session:
            session.sync()
            assert not session.slots_ahead.arrived and not session.slots_ahead.asked
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT, worker_args=NO_START) as cluster:
        with connect(cluster, shared_memory=SharedMemory(start_slot=0)) as session:
            session.sync()  # (the device runs; it keeps no segment ready)
            assert not own_segments(cluster.workers[0].pid)
        with connect(cluster) as session:  # a start slot asked for is made then
            wait_for(lambda: arrived(session), 10, "the start slot")
    for bad in (-1, 1.5, "16"):
        with pytest.raises(ConfigError, match="start_slot"):
            SharedMemory(start_slot=bad)
