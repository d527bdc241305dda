"""Reads of tensors that live in a device's own slot (``fabric.transport.bulk_reads.take``,
``workers.pins``): no copy, the slot pinned on the worker while the array read lives, unpinned
with the session's next message, retired when the session ends; shown as a read-only view
(``t.numpy(copy=False)``) or mapped copy on write, the caller's own (``t.numpy()``). End to
end on real processes, and the worker's rules sans I/O. The leak checks of ``test_shm_path``
apply here too."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import fabric
from fabric.core.errors import ProtocolError
from fabric.core.protocol import Kind, Message
from fabric.core.segment_pool import SegmentPool
from fabric.core.shm import MAX_PINS, PeerSegments, boot_id, held_segments, parse_name
from fabric.core.wire import decode_segment_ref
from fabric.workers import device_pool, shared_memory
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor

from conftest import HEARTBEAT
from polling import wait_for
from test_shm_path import (NO_START, ahead_answered, connect,
                           no_segments_left, random_array, shm_cluster)  # noqa: F401 (fixtures)

MiB = 1 << 20


def segment_at(array: np.ndarray) -> str | None:
    """The name of the shared-memory segment this process maps ``array``'s memory from
    (None: private memory)."""
    return segment_mapped_at(array.__array_interface__["data"][0], "self")


def segment_mapped_at(address: int, pid: int | str) -> str | None:
    """The name of the shared-memory segment process ``pid`` maps at ``address``."""
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(bound, 16) for bound in fields[0].split("-"))
            if start <= address < end:
                name = fields[-2] if fields[-1] == "(deleted)" else fields[-1]
                return name[len("/memfd:"):] if name.startswith("/memfd:") else None
    return None


def in_device_slot(array: np.ndarray, worker: int) -> bool:
    """Whether ``array`` is memory of a segment of process ``worker`` (no copy here)."""
    name = segment_at(array)
    return name is not None and parse_name(name).pid == worker


def viewed(session: fabric.Session, array: np.ndarray) -> tuple[fabric.Tensor, np.ndarray]:
    """``array`` uploaded into a slot its device lent ahead, and a read-only view of it."""
    session.asarray(np.zeros_like(array)).numpy()  # (asks for a slot of this size ahead)
    session.sync()  # (its answer has come)
    tensor = session.asarray(array)
    return tensor, tensor.numpy(copy=False)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float32", "complex128"])
def test_a_view_is_the_devices_slot_read_only_and_identical(shm_cluster, dtype):
    with connect(shm_cluster) as session:
        a = random_array(dtype, (512, 1024))
        tensor, view = viewed(session, a)
        assert in_device_slot(view, shm_cluster.workers[0].pid)
        np.testing.assert_array_equal(view, a)
        assert view.dtype == a.dtype and view.shape == a.shape
        assert not view.flags.writeable
        with pytest.raises(ValueError):
            view[0] = view[1]
        mine = tensor.numpy()  # a copy is still the caller's own, writable
        assert mine.flags.writeable and not np.shares_memory(mine, view)
        computed = np.copy(tensor).numpy(copy=False)  # a result lies in no slot: copied
        np.testing.assert_array_equal(computed, a)
        assert not computed.flags.writeable
        assert not in_device_slot(computed, shm_cluster.workers[0].pid)
        del view


@pytest.mark.timeout(90)
def test_a_read_of_a_tensor_in_a_slot_maps_it_copy_on_write_as_the_callers_own(shm_cluster):
    worker = shm_cluster.workers[0].pid
    with connect(shm_cluster) as session:
        a = random_array("float64", (1024, 1024))
        tensor, view = viewed(session, a)
        mine = tensor.numpy()
        assert in_device_slot(mine, worker) and segment_at(mine) == segment_at(view)  # no copy
        assert mine.flags.writeable and mine.flags.c_contiguous and mine.base is not None
        np.testing.assert_array_equal(mine, a)
        mine[0] = -1  # its writes are its own: the tensor, the view and a new read keep theirs
        again = tensor.numpy()
        assert view[0, 0] == a[0, 0] == again[0, 0] == (tensor[0, 0] + 0).numpy()
        np.testing.assert_array_equal(mine[1:], a[1:])
        del tensor, view, again
        gc.collect()
        session.sync()  # (the unpins go with it)
        np.testing.assert_array_equal(mine[1:], a[1:])  # it outlives its tensor
        assert (mine[0] == -1).all()
        assert session.stats()["resident_bytes"] == a.nbytes  # its pin, charged as a copy
        del mine
        gc.collect()
        session.sync()
        assert session.stats()["resident_bytes"] == 0


@pytest.mark.timeout(90)
def test_a_view_outlives_its_tensor_and_its_slot_is_not_lent_again_meanwhile(shm_cluster):
    with connect(shm_cluster) as session:
        a = random_array("float64", (1024, 1024))
        tensor, view = viewed(session, a)
        resident = session.stats()["resident_bytes"]
        assert resident == 2 * a.nbytes  # the tensor, and its pinned slot (as a copy)
        del tensor
        others = [session.asarray(np.full_like(a, i)) for i in range(6)]  # sizes it fits
        session.sync()
        np.testing.assert_array_equal(view, a)
        assert all(segment_at(other.numpy(copy=False)) != segment_at(view) for other in others)
        assert session.stats()["resident_bytes"] == (len(others) + 1) * a.nbytes
        del view, others
        gc.collect()
        session.sync()  # (the unpin goes with it)
        assert session.stats()["resident_bytes"] == 0


@pytest.mark.timeout(90)
def test_a_pinned_slot_goes_back_to_the_devices_pool_once_its_view_is_collected():
    # Room for three 8 MiB segments in the device's pool.
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT, worker_args=(
            "--shared-memory-limit", str(24 * MiB), *NO_START)) as cluster, \
            connect(cluster) as session:
        worker = cluster.workers[0].pid
        a = np.random.default_rng(9).random((1024, 1024))
        tensor, view = viewed(session, a)  # into segment A, pinned
        pinned = segment_at(view)
        del tensor  # (freed: only the pin keeps A)
        ahead_answered(session)
        kept = []
        for i in range(3):  # into B and C, lent ahead; then none is left to lend
            kept.append(session.asarray(a + i))
            session.sync()
            ahead_answered(session)  # (the slot asked for ahead has come)
        assert (session.slots_ahead.used, session.slots_ahead.missed) == (3, 2)
        assert [in_device_slot(t.numpy(copy=False), worker) for t in kept] == [
            True, True, False]
        np.testing.assert_array_equal(view, a)
        del view
        gc.collect()
        session.sync()  # the unpin goes with it: A is free again, and lent ahead next
        kept.append(session.asarray(a + 3))  # (asks for A)
        session.sync()
        kept.append(session.asarray(a + 4))
        again = kept[-1].numpy(copy=False)
        assert segment_at(again) == pinned
        np.testing.assert_array_equal(again, a + 4)
        del again


@pytest.mark.timeout(90)
def test_a_view_outlives_its_session_which_retires_the_slot(shm_cluster):
    worker = shm_cluster.workers[0].pid
    session = connect(shm_cluster)
    other = session.open(0)  # (keeps the connection, and its mapping, open)
    a = random_array("int32", (1024, 1024))
    tensor, view = viewed(session, a)
    mine = tensor.numpy()  # (mapped copy on write: its own mapping)
    name = segment_at(view)
    session.close()
    wait_for(lambda: name not in held_segments(worker), 10, "the worker to retire the slot")
    np.testing.assert_array_equal(view, a)
    other.close()  # the connection closes: the view still keeps its mapping
    np.testing.assert_array_equal(view, a)
    # A new session's uploads of the size take other slots: the retired one is no one's.
    with connect(shm_cluster) as later:
        others = [later.asarray(np.full_like(a, i)) for i in range(3)]
        later.sync()
        np.testing.assert_array_equal(mine, a)
        mine[-1] = 7
        np.testing.assert_array_equal(mine[:-1], a[:-1])
        del others
    del tensor, view, mine
    gc.collect()
    assert name not in held_segments(os.getpid())


@pytest.mark.timeout(90)
def test_a_session_closed_after_its_views_died_gives_their_slots_back():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster:
        a = np.random.default_rng(2).random((1024, 1024))
        with connect(cluster) as first:
            tensor, view = viewed(first, a)  # into A; B lent ahead, unused
            pinned = segment_at(view)
            del tensor, view
            gc.collect()
        # The unpin went before the CLOSE: A went back to the pool with B, and the next two
        # uploads of the size are lent them; retired, A would be gone, and C made.
        with connect(cluster) as second:
            tensor, view = viewed(second, a)
            second.sync()  # (the next slot lent ahead has come)
            other = second.asarray(a + 1).numpy(copy=False)
            segments = {segment_at(view), segment_at(other)}
            assert pinned in segments and len(segments) == 2
            np.testing.assert_array_equal(view, a)
            del view, other


@pytest.mark.timeout(90)
def test_a_moved_tensor_is_viewed_in_the_receiving_devices_slot(cluster):
    with connect(cluster, device=0) as source, source.open(1) as destination:
        a = random_array("float64", (700, 400))
        moved = source.asarray(a).to(destination)
        view = moved.numpy(copy=False)
        receiver = cluster.workers[1].pid
        assert in_device_slot(view, receiver)
        np.testing.assert_array_equal(view, a)
        del moved
        destination.sync()
        np.testing.assert_array_equal(view, a)
        del view


@pytest.mark.timeout(90)
def test_a_killed_clients_pins_are_retired_once_its_session_ends():
    script = (
        "import fabric, numpy, os, sys\n"
        "s = fabric.connect(sys.argv[1], token=os.environ['FABRIC_TOKEN'],\n"
        "                   shared_memory=fabric.SharedMemory(cross_memory=False))\n"
        "s.asarray(numpy.zeros(1 << 20)).numpy(); s.sync()\n"
        "t = s.asarray(numpy.ones(1 << 20))\n"
        "view = t.numpy(copy=False)\n"
        "del t\n"
        "s.sync()\n"
        "print(view.__array_interface__['data'][0], flush=True)\n"
        "sys.stdin.read()\n")
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             broker_args=("--lease", "0.5")) as cluster, \
            connect(cluster) as watcher:
        client = subprocess.Popen([sys.executable, "-c", script, cluster.address],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "FABRIC_TOKEN": cluster.token})
        try:
            pinned = segment_mapped_at(int(client.stdout.readline()), client.pid)
            worker = cluster.workers[0].pid
            assert parse_name(pinned).pid == worker  # the view is the device's slot
            assert watcher.stats()["device_resident_bytes"] == 8 * MiB  # the pin
            client.kill()
            client.wait()
            wait_for(lambda: watcher.stats()["device_resident_bytes"] == 0, 10,
                     "the dead client's session to end")
            # Its pinned slot was retired, not lent again: the worker holds it no more.
            wait_for(lambda: pinned not in held_segments(worker), 10,
                     "the pinned slot to be retired")
        finally:
            if client.poll() is None:
                client.kill()
            client.communicate(timeout=5)


@pytest.mark.timeout(90)
def test_unpins_of_slots_not_pinned_or_of_another_sessions_are_refused(shm_cluster):
    with connect(shm_cluster) as session, session.open(0) as intruder:
        a = random_array("float64", (1024, 256))
        tensor, view = viewed(session, a)
        name = segment_at(view)
        for slots in ("x", [], [1], [name]):  # malformed; another session's
            with pytest.raises(ProtocolError):
                intruder._call({"op": "unpin", "slots": slots})
        with pytest.raises(ProtocolError, match="nothing was unpinned"):
            session._call({"op": "unpin", "slots": [name, name]})  # one view, unpinned twice
        with pytest.raises(ProtocolError):
            session._call({"op": "unpin", "slots": ["fabric-0123abcd-1-2"]})
        del tensor
        session.sync()
        np.testing.assert_array_equal(view, a)  # still pinned: every refusal changed nothing
        assert session.stats()["resident_bytes"] == a.nbytes
        assert intruder.arange(4).sum().numpy() == 6  # the worker serves on
        del view


@pytest.mark.timeout(90)
def test_a_view_needs_no_slot_of_the_clients_pool(shm_cluster):
    with connect(shm_cluster,
                 fabric.SharedMemory(threshold=0, limit=4 * MiB, cross_memory=False)) as session:
        a = random_array("float64", (1024, 1024))  # 8 MiB: more than this client's pool
        tensor, view = viewed(session, a)
        assert in_device_slot(view, shm_cluster.workers[0].pid)
        np.testing.assert_array_equal(view, a)
        tensor[0, 0] = 5  # the device writes the update into a copy (a slot is read-only)
        changed = tensor.numpy(copy=False)  # in no slot: read as any (here by the sockets)
        assert not in_device_slot(changed, shm_cluster.workers[0].pid)
        assert changed[0, 0] == 5 and not changed.flags.writeable
        np.testing.assert_array_equal(changed[1:], a[1:])
        np.testing.assert_array_equal(view, a)  # the view still shows what it showed
        del view


@pytest.mark.timeout(90)
def test_past_the_memory_limit_a_view_is_a_copy():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--memory-limit", str(12 * MiB))) as cluster, \
            connect(cluster) as session:
        a = random_array("float64", (1024, 1024))  # 8 MiB: pinning it too would hold 16
        tensor, view = viewed(session, a)  # (asked without a slot: the bytes come instead)
        assert not in_device_slot(view, cluster.workers[0].pid)
        np.testing.assert_array_equal(view, a)
        assert not view.flags.writeable
        mine = tensor.numpy()  # so is a read: its own copy
        assert not in_device_slot(mine, cluster.workers[0].pid) and mine.flags.writeable
        np.testing.assert_array_equal(mine, a)
        assert session.stats()["resident_bytes"] == a.nbytes
        del tensor, view, mine


# -- the worker's rules, sans I/O -------------------------------------------------------------

SESSION = 0x71E


def request(executor: Executor, **body) -> Message:
    replies = executor.handle(Message(Kind.REQUEST, SESSION, 9, body))
    if not replies:  # (a slot its pool makes: answered once made)
        replies = wait_for(lambda: device_pool.made(executor) or None, 10, "the slot made")
    [reply] = replies
    assert reply.kind == Kind.REPLY
    return reply


@pytest.fixture
def agreed(monkeypatch):
    """An executor with a session that agreed to shared memory with this process, and this
    process's pool (as its client's: the worker takes itself for another process)."""
    monkeypatch.setattr(shared_memory, "_worker_pid", lambda: 1)
    executor = Executor(NumpyDevice(0))
    executor.handle(Message(Kind.OPEN, SESSION, 1, {"device": 0}))
    client = SegmentPool(lambda _session: 0)
    probe = client.probe_segment(7)
    assert request(executor, op="shm_probe", boot=boot_id(), segment=probe.name,
                   token=7).body == {"shared_memory": True, "reads_memory": False}
    probe.close()
    yield executor, client
    executor.handle(Message(Kind.CLOSE, SESSION, 2))
    client.close()
    if executor.slots is not None:  # (made by the first shm_slot)
        executor.slots.close()


def put_in_lent_slot(executor: Executor, tensor_id: int, array: np.ndarray) -> str:
    """``array`` written into a slot the device lends, and put there; the slot's name."""
    ref = request(executor, op="shm_slot", nbytes=array.nbytes).body["slot"]
    peer = PeerSegments(os.getpid())
    slot = decode_segment_ref(ref)
    peer.map(slot.name).memory[:array.nbytes] = array.view(np.uint8).reshape(-1)
    peer.close()
    executor.handle(Message(Kind.SUBMIT, SESSION, 0, {"ops": [["put", tensor_id, [], {
        "dtype": array.dtype.str, "shape": list(array.shape), "shm": ref}]]}))
    return slot.name


def view_of(executor: Executor, client: SegmentPool, tensor_id: int,
            array: np.ndarray) -> dict:
    into = client.acquire(array.nbytes)
    try:
        return request(executor, op="read_into", id=tensor_id, dtype=array.dtype.str,
                       shape=list(array.shape), into=into.ref(), view=True).body
    finally:
        client.give_back(into)


def test_a_pinned_slot_goes_back_to_the_pool_once_unpinned_and_its_tensor_freed(agreed):
    executor, client = agreed
    array = np.arange(MiB // 8, dtype=np.float64)
    name = put_in_lent_slot(executor, 1, array)
    first, second = view_of(executor, client, 1, array), view_of(executor, client, 1, array)
    assert first["pinned"] == second["pinned"] == [name, 0, array.nbytes]
    executor.handle(Message(Kind.SUBMIT, SESSION, 0, {"ops": [1]}))  # the tensor freed
    pool = executor.slots
    assert name in {segment.name for segment in pool.lent}
    lent = request(executor, op="shm_slot", nbytes=array.nbytes).body["slot"]
    assert lent[0] != name  # a pinned slot is never lent again
    request(executor, op="unpin", slots=[name])
    assert name in {segment.name for segment in pool.lent}  # one view left
    request(executor, op="unpin", slots=[name])
    assert name in {segment.name for segment in pool.free}
    assert executor.sessions[SESSION].resident == 0


def test_a_view_of_part_of_a_slot_names_that_part(agreed):
    executor, client = agreed
    array = np.arange(MiB // 8, dtype=np.float64)
    name = put_in_lent_slot(executor, 1, array)
    executor.handle(Message(Kind.SUBMIT, SESSION, 0, {"ops": [
        ["getitem", 2, [1], {"index": [[10, 20, None]]}]]}))
    body = view_of(executor, client, 2, array[10:20])
    assert body["pinned"] == [name, 80, 80]


def test_a_session_holds_at_most_max_pins_views(agreed):
    executor, client = agreed
    array = np.arange(MiB // 8, dtype=np.float64)
    name = put_in_lent_slot(executor, 1, array)
    for _ in range(MAX_PINS):
        assert "pinned" in view_of(executor, client, 1, array)
    assert "pinned" not in view_of(executor, client, 1, array)  # written into its slot
    with pytest.raises(ProtocolError):
        request(executor, op="unpin", slots=[name] * (MAX_PINS + 1))
    request(executor, op="unpin", slots=[name] * MAX_PINS)
    assert "pinned" in view_of(executor, client, 1, array)


def test_a_closed_session_retires_its_pinned_slots(agreed):
    executor, client = agreed
    array = np.arange(MiB // 8, dtype=np.float64)
    name = put_in_lent_slot(executor, 1, array)
    view_of(executor, client, 1, array)
    executor.handle(Message(Kind.CLOSE, SESSION, 2))
    gc.collect()
    pool = executor.slots
    assert name not in {segment.name for segment in [*pool.free, *pool.lent]}
    assert name not in held_segments(os.getpid())


def test_a_view_asked_without_a_slot_of_a_tensor_in_none_is_answered_unpinned(agreed):
    executor, _ = agreed
    executor.handle(Message(Kind.SUBMIT, SESSION, 0, {"ops": [
        ["put", 1, [], {"dtype": "<f8", "shape": [4], "buffer": 0}]]},
        (np.arange(4.0).tobytes(),)))
    reply = request(executor, op="read_into", id=1, dtype="<f8", shape=[4], view=True)
    assert reply.body == {"pinned": None} and not reply.buffers  # (the client reads again)
