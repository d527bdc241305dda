"""Uploads through slots their device lent ahead (``fabric.transport.slots_ahead``,
``fabric.transport.bulk``, ``workers.device_pool.offer``): an upload never waits for its device,
and the device's own pool is bounded, shrinks and takes slots back, end to end on real processes;
the bounds and give-backs of what a session holds ahead, on their own. The leak checks of
``test_shm_path`` apply here too."""

from __future__ import annotations

import signal

import numpy as np
import pytest

import fabric
from fabric.core import protocol
from fabric.core.errors import FabricError
from fabric.core.protocol import Kind, Message
from fabric.core.shm import SharedMemory, held_segments, parse_name
from fabric.core.wire import decode_segment_ref
from fabric.transport.probe import PROBES_AT_OPEN
from fabric.transport.slots_ahead import IN_ALL, PER_SIZE, SlotsAhead
from fabric.workers.lane import jumps_the_queue

from conftest import HEARTBEAT
from polling import wait_for
from test_shm_path import (NO_START, ahead_answered, connect,
                           no_segments_left, random_array, shm_cluster)  # noqa: F401 (fixtures)

MiB = 1 << 20


def _state(pid: int) -> str:
    """A process's state letter (R, S, T for stopped, ...), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@pytest.mark.timeout(90)
def test_an_upload_returns_while_its_device_is_stopped():
    # A stopped worker answers nothing: any upload that waited for its device would time
    # out here. (Heartbeats long enough that the broker keeps the stopped worker.)
    with fabric.LocalCluster(workers=1, heartbeat=2.0) as cluster, \
            connect(cluster, timeout=10) as session:
        a, b, c = (random_array("float64", (300_000,), seed) for seed in range(3))
        first = session.asarray(a)
        session.sync()  # agreed to shared memory
        ahead_answered(session)  # and the slot asked for ahead has come
        worker = cluster.workers[0]
        worker.send_signal(signal.SIGSTOP)
        try:  # (the signal takes effect a little later: the stop is awaited, as a race lost
            # under load let the worker answer the sync below first)
            wait_for(lambda: _state(worker.pid) == "T", 5, "the worker to stop")
            waiting = session._send_request({"op": "sync"})  # unanswered while stopped
            second = session.asarray(b)  # into the slot lent ahead
            third = session.asarray(c)  # none has come since: through this client's pool
            assert session.stream.sent_through > third.id and not session.stream.batch
            assert session.connection.pending.take(waiting) is None
        finally:
            worker.send_signal(signal.SIGCONT)
        session._reply(waiting)
        assert (session.slots_ahead.missed, session.slots_ahead.used) == (2, 1)
        for tensor, array in ((first, a), (second, b), (third, c)):
            assert tensor.numpy().tobytes() == array.tobytes()
        assert session.stats()["bytes_uploaded_by_socket"] == 0


@pytest.mark.timeout(90)
def test_a_first_upload_to_a_busy_device_takes_the_sockets_and_later_ones_shared_memory():
    # The probe of shared memory is answered after the device's queued work: an upload
    # waits for it PROBE_SECONDS at most (it timed out with the session's timeout before).
    # Sessions send it as they open, PROBES_AT_OPEN at most per connection until answered
    # (each holds a segment's descriptor); a session past them probes at its first upload.
    with fabric.LocalCluster(workers=1, heartbeat=2.0) as cluster, \
            connect(cluster, timeout=10) as first_opened:
        probing = [first_opened] + [first_opened.open(0) for _ in range(PROBES_AT_OPEN - 1)]
        assert all(opened.probe is not None for opened in probing)
        session = first_opened.open(0)
        assert session.probe is None  # (past the bound: none sent at open)
        assert len(session.connection.segments.probes) == PROBES_AT_OPEN
        a, b = (random_array("float64", (300_000,), seed) for seed in range(2))
        worker = cluster.workers[0]
        worker.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: _state(worker.pid) == "T", 5, "the worker to stop")
            first = session.asarray(a)
            assert session.shares_memory is None  # not answered yet: the sockets took it
        finally:
            worker.send_signal(signal.SIGCONT)
        assert first.numpy().tobytes() == a.tobytes()
        second = session.asarray(b)  # the answer came meanwhile: without waiting
        assert session.shares_memory is True and second.numpy().tobytes() == b.tobytes()
        assert session.stats()["bytes_uploaded_by_socket"] == a.nbytes  # the first one only
        assert probing[1].asarray(a).numpy().tobytes() == a.tobytes()  # its answer taken:
        assert len(session.connection.segments.probes) == PROBES_AT_OPEN - 1  # closed
        assert probing[1].stats()["bytes_uploaded_by_socket"] == 0


@pytest.mark.timeout(90)
def test_a_loop_uploads_into_slots_lent_ahead_and_reuses_them(shm_cluster):
    with connect(shm_cluster) as session:
        a = np.random.default_rng(3).random(300_000)
        for i in range(20):
            t = session.asarray(a + i)
            assert (t * 2)[-1].numpy() == (a[-1] + i) * 2
            ahead_answered(session)  # (the slot asked for ahead has come)
        assert (session.slots_ahead.missed, session.slots_ahead.used) == (1, 19)
        pool = session.connection.segments
        [device] = pool.peers.values()
        assert len(device.maps) <= 3  # the few the loop's tensors keep and give back
        # The first upload's slot, and the reads' (none more where the first read found that
        # slot back already: it fits a small read too)
        assert pool.held in (4 << 20, (4 << 20) + (2 << 20))



@pytest.mark.timeout(90)
def test_a_smaller_array_takes_a_larger_lent_slot_and_keeps_its_own_shape(shm_cluster):
    with connect(shm_cluster) as session:
        session.asarray(random_array("float64", (300_000,))).numpy()  # lends 2.4 MB ahead
        ahead_answered(session)
        small = random_array("int16", (700, 900), seed=4)  # 1.26 MB: fits it
        fortran = np.asfortranarray(small)
        tensor = session.asarray(fortran)
        assert session.slots_ahead.used == 1
        assert tensor.shape == (700, 900) and tensor.dtype == np.int16
        back = tensor.numpy()
        assert back.shape == small.shape and back.dtype == small.dtype
        assert back.tobytes() == small.tobytes()
        del back  # (it shows the slot, pinned and charged as a copy while it lives)
        assert session.stats()["resident_bytes"] == small.nbytes  # the array's, not the slot's


@pytest.mark.timeout(90)
def test_moves_take_slots_their_receiver_lent_ahead(shm_cluster):
    with connect(shm_cluster, device=0) as source, source.open(1) as destination:
        a = np.random.default_rng(5).random(300_000)
        moved = []
        for i in range(4):
            moved.append(source.asarray(a + i).to(destination))
            ahead_answered(destination)
        # The first asked for its slot (a round trip) and for the next one ahead; each later
        # move took the one whose answer had come, and asked for the next.
        assert (destination.slots_ahead.missed, destination.slots_ahead.used) == (1, 3)
        small = random_array("int16", (700, 900), seed=6)  # 1.26 MB: fits a 2.4 MB slot
        moved.append(source.asarray(small).to(destination))
        assert destination.slots_ahead.used == 4
        for i, tensor in enumerate(moved[:4]):
            assert tensor.numpy().tobytes() == (a + i).tobytes()
        back = moved[4].numpy()
        assert back.shape == small.shape and back.dtype == small.dtype
        assert back.tobytes() == small.tobytes()
        del back  # (it shows the slot, pinned and charged as a copy while it lives)
        assert destination.stats()["resident_bytes"] == 4 * a.nbytes + small.nbytes


@pytest.mark.timeout(90)
def test_an_unused_lent_slot_of_another_size_goes_back_to_the_device():
    # Room for one 2 MiB segment on the device: the slot lent for 1.5 MiB arrays must go
    # back before one for 1.8 MiB arrays can be lent.
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--shared-memory-limit", str(2 * MiB))) as cluster, \
            connect(cluster, SharedMemory(threshold=0, idle_seconds=0,
                                          cross_memory=False)) as session:
        smaller, larger = np.ones(3 * MiB // 16), np.ones(int(1.8 * MiB) // 8)
        session.asarray(smaller).numpy()  # through this client's pool; one lent ahead
        ahead_answered(session)
        session.asarray(larger).numpy()  # does not fit it: this client's; gives it back
        ahead_answered(session)
        again = session.asarray(larger * 2)  # into the device's segment, lent again
        assert (session.slots_ahead.missed, session.slots_ahead.used) == (2, 1)
        np.testing.assert_array_equal(again.numpy(), larger * 2)


@pytest.mark.timeout(90)
def test_memory_limit_counts_an_upload_into_a_lent_slot():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--memory-limit", "3000000")) as cluster, \
            connect(cluster) as session:
        kept = session.asarray(np.ones(200_000))  # 1.6 MB, copied out
        kept.numpy()
        ahead_answered(session)
        too_much = session.asarray(np.ones(200_000))  # into the lent slot: 3.2 MB in all
        assert session.slots_ahead.used == 1
        with pytest.raises(fabric.RemoteError, match="memory"):
            too_much.numpy()
        np.testing.assert_array_equal(kept.numpy(), 1)  # the session goes on
        del kept, too_much
        np.testing.assert_array_equal(session.asarray(np.full(200_000, 2.0)).numpy(), 2)


@pytest.mark.timeout(90)
def test_answers_not_taken_are_forgotten_when_the_session_closes(shm_cluster):
    with connect(shm_cluster) as session, session.open(1) as other:
        other.asarray(np.ones(300_000))  # asks for a slot ahead, never taken
        asked = set(other.slots_ahead.asked)
        assert asked
        other.close()
        pending = session.connection.pending
        assert not asked & (pending._waiting | pending._replies.keys())
        np.testing.assert_array_equal(session.asarray(np.ones(300_000)).numpy(), 1)


@pytest.mark.timeout(60)
def test_a_malformed_give_back_is_refused_and_the_worker_goes_on(shm_cluster):
    with connect(shm_cluster) as session:
        session.asarray(np.ones(10)).numpy()
        for give_back in ("x", [["fabric-0123abcd-1-2", 0, 8]], [[1]]):
            with pytest.raises(fabric.ProtocolError):
                session._call({"op": "shm_slot", "nbytes": 8, "give_back": give_back})
        assert session.arange(4).sum().numpy() == 6


@pytest.mark.timeout(90)
def test_the_devices_own_pool_is_bounded_and_past_it_uploads_use_the_clients_slots():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--shared-memory-limit", str(4 << 20))) as cluster, \
            connect(cluster) as session:
        a = np.random.default_rng(9).random(200_000)  # 1.6 MB: one 2 MiB segment each
        kept = []
        for i in range(4):
            kept.append(session.asarray(a + i))
            session.sync()
            ahead_answered(session)  # (the slot asked for ahead has come)
        pool = session.connection.segments
        [device] = pool.peers.values()
        # The first upload and the last went through a slot of this client's pool (copied
        # out by the worker); the two between into the two segments the device could lend.
        assert (session.slots_ahead.missed, session.slots_ahead.used) == (2, 2)
        assert len(device.maps) == 2 and pool.held == 2 << 20
        for i, tensor in enumerate(kept):
            np.testing.assert_array_equal(tensor.numpy(), a + i)
        assert session.stats()["bytes_uploaded_by_socket"] == 0  # (nothing took the sockets)
        names = set(device.maps)
        del kept
        session.sync()  # the tensors are freed: their slots go back to the device's pool
        for factor in (2, 3):  # (the first asks for the slot the second is written into)
            again = session.asarray(a * factor)
            np.testing.assert_array_equal(again.numpy(), a * factor)
            ahead_answered(session)
        assert set(device.maps) == names and session.slots_ahead.used == 3


@pytest.mark.timeout(90)
def test_an_idle_devices_own_pool_closes_its_free_segments():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--shared-memory-idle", "0.5", *NO_START)) as cluster:
        worker = cluster.workers[0].pid  # (no segment kept for a start slot: test_start_slot)
        own = lambda: {name for name in held_segments(worker) if parse_name(name).pid == worker}
        with connect(cluster) as session:
            for _ in range(2):  # the second into the slot lent ahead, which asks another
                np.testing.assert_array_equal(session.asarray(np.ones(300_000)).numpy(), 1)
                ahead_answered(session)
            assert session.slots_ahead.used == 1 and len(own()) == 2
        # Closed: what it was lent goes back too, and the free segments close once idle.
        wait_for(lambda: not own(), 10, "the device's pool to shrink")
        with connect(cluster) as session:  # and it grows again on demand
            np.testing.assert_array_equal(session.asarray(np.ones(300_000)).numpy(), 1)


@pytest.mark.timeout(90)
def test_a_put_that_misnames_its_offered_slot_fails_alone_and_the_slot_comes_back():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,  # (room for two segments)
                             worker_args=("--shared-memory-limit", str(4 << 20))) as cluster, \
            connect(cluster) as session:
        session.asarray(np.ones(10)).numpy()  # agreed to shared memory (and lent one ahead)
        ref = session._call({"op": "shm_slot", "nbytes": 8000}).body["slot"]
        for shape in ([999], [1000]):  # wrong size, then the slot no longer offered
            tensor = session.stream.new_tensor(tuple(shape), np.dtype("float64"), None)
            session.stream.enqueue(["put", tensor.id, [], {
                "dtype": "<f8", "shape": shape, "shm": ref}], None, tensor)
            with pytest.raises(FabricError):
                tensor.numpy()
        assert session.arange(4).sum().numpy() == 6  # the session and its worker go on
        again = session._call({"op": "shm_slot", "nbytes": 8000}).body["slot"]
        assert again is not None and again[0] == ref[0]  # given back, and lent again


def _ref(n: int, nbytes: int):
    return decode_segment_ref([f"fabric-0123abcd-1-{n}", 0, nbytes])


def test_what_a_session_holds_ahead_is_bounded_per_size_and_in_all():
    now = [0.0]
    ahead = SlotsAhead(clock=lambda: now[0])
    for request in range(PER_SIZE):
        assert ahead.wanted(3 * MiB, 30)
        ahead.ask(request, 3 * MiB)
    assert not ahead.wanted(3 * MiB, 30) and not ahead.wanted(2 * MiB, 30)  # both fit 3 MiB
    for request in range(PER_SIZE):
        ahead.on_answer(request, _ref(request, 3 * MiB))
    assert ahead.take(5 * MiB) is None  # larger than any: none fits
    assert ahead.take(MiB // 2).name.endswith("-0")  # smaller, within twice: fits
    sizes = [(n + 2) * 10 * MiB for n in range(IN_ALL)]
    for request, nbytes in enumerate(sizes, start=10):
        if ahead.wanted(nbytes, 30):
            ahead.ask(request, nbytes)
    assert len(ahead.asked) + len(ahead.arrived) == IN_ALL
    body = ahead.request(sizes[0])  # the 3 MiB slot made room for the others
    assert body["give_back"] == [["fabric-0123abcd-1-1", 0, 3 * MiB]] and not ahead.returning


def test_a_lent_slot_unused_past_the_idle_period_goes_back():
    now = [0.0]
    ahead = SlotsAhead(clock=lambda: now[0])
    ahead.ask(1, 3 * MiB)
    ahead.on_answer(1, _ref(1, 3 * MiB))
    now[0] = 31.0
    assert ahead.wanted(3 * MiB, 30) and not ahead.arrived
    assert ahead.request(3 * MiB) == {"op": "shm_slot", "nbytes": 3 * MiB,
                                      "give_back": [["fabric-0123abcd-1-1", 0, 3 * MiB]]}


def _encoded(kind: Kind, body: dict, buffers=()):
    frames = [bytes(frame) for frame in protocol.encode(Message(kind, 7, 3, body, buffers))]
    return protocol.decode_header(frames[0]), frames


def test_only_a_lone_slot_request_jumps_its_sessions_queue_on_the_worker():
    # (a start slot's request follows its session's probe: it waits its turn)
    give_back = [[f"fabric-0123abcd-1-{n}", 0, 1 << 30] for n in range(IN_ALL)]
    assert jumps_the_queue(*_encoded(Kind.REQUEST, {"op": "shm_slot", "nbytes": 8,
                                                    "give_back": give_back}))
    for kind, body in ((Kind.REQUEST, {"op": "shm_slot", "nbytes": 8, "ops": [["sync"]]}),
                       (Kind.REQUEST, {"op": "shm_slot", "nbytes": 8, "start": True}),
                       (Kind.REQUEST, {"op": "read", "id": 4}), (Kind.SUBMIT, {"ops": []})):
        assert not jumps_the_queue(*_encoded(kind, body))
