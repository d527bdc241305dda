"""The shared-memory path (``fabric.core.shm``, ``fabric.transport.bulk``,
``workers.shared_memory``): large arrays between a client and a worker on one host, end to end on
real processes, and the naming, sealing and pool rules on their own. Every test checks that no
segment of this process is left open, nor mapped by a worker, once its sessions closed."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

import fabric
from fabric.core.errors import FabricError, ProtocolError
from fabric.core.segment_pool import SegmentPool
from fabric.core.shm import (SEGMENT_ALIGN, Segment, SharedMemory, UnsealedSegment, boot_id,
                             held_segments, parse_name, segment_name)
from fabric.core.wire import decode_segment_ref
from fabric.transport.bulk import take_answers

from conftest import HEARTBEAT, children_of
from polling import wait_for

EVERYTHING = SharedMemory(threshold=0, cross_memory=False, start_slot=0)  # every array
# through slots of shared memory, however small (the worker reading and writing the client's
# own memory where no slot is ready: test_cross_memory.py; a first upload into the start slot
# its device lends ahead: test_start_slot.py)
NO_START = ("--start-slot", "0")  # a worker that keeps no segment ready for a start slot
DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]


def mapped(pid: int, owner: int) -> set[str]:
    """The segments of process ``owner`` that process ``pid`` maps."""
    prefix = f"/memfd:{segment_name(boot_id(), owner, 0)[:-1]}"
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {line.split()[-2][len("/memfd:"):] for line in maps if prefix in line}
    except FileNotFoundError:  # gone: it maps nothing
        return set()


def ahead_answered(session: fabric.Session) -> None:
    """Wait until every slot ``session`` asked its device for ahead was answered (a device
    answers one that no free segment fits once its pool's thread made it), the answers
    taken: the next upload of that size then finds its slot."""
    def answered() -> bool:
        take_answers(session, session.connection.segments)
        return not session.slots_ahead.asked
    wait_for(answered, 10, "the slots asked ahead")


@pytest.fixture(autouse=True)
def no_segments_left():
    """This process holds no segment after a test, and its children map none of them."""
    yield
    gc.collect()  # (read-only views of a test hold their slots until collected)
    assert held_segments(os.getpid()) == {}
    for child in children_of(os.getpid()):  # (a worker drops them as it closes the session)
        wait_for(lambda: not mapped(child, os.getpid()), 10, f"{child} to unmap our segments")


@pytest.fixture(scope="module")
def shm_cluster():
    with fabric.LocalCluster(workers=2, heartbeat=HEARTBEAT) as running:
        yield running


def connect(cluster, shared_memory=EVERYTHING, **options) -> fabric.Session:
    return fabric.connect(cluster.address, token=cluster.token, shared_memory=shared_memory,
                          **options)


def random_array(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Arbitrary bytes of ``dtype`` (every bit pattern, NaN payloads too; bools 0 or 1)."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    count = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer(rng.bytes(count), dtype).reshape(shape).copy()


def layouts_of(base: np.ndarray):
    """``base`` (2-d) in the layouts a user uploads: C and Fortran order, a strided view,
    transposed, byte swapped."""
    yield base
    yield np.asfortranarray(base)
    yield base[3:-14:2, ::-3]
    yield base.T
    if base.dtype.itemsize > 1:
        yield base.astype(base.dtype.newbyteorder())


def layouts(dtype: str):
    """The arrays of ``dtype`` a user uploads: ``layouts_of`` one, empty, 0-d."""
    yield from layouts_of(random_array(dtype, (64, 48)))
    yield random_array(dtype, (0, 5))
    yield random_array(dtype, ())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_layout_goes_up_and_down_byte_identical(shm_cluster, dtype):
    with connect(shm_cluster) as session:
        for array in layouts(dtype):
            tensor = session.asarray(array)
            back = tensor.numpy()
            assert back.dtype == array.dtype.newbyteorder("=") and back.shape == array.shape
            assert back.tobytes() == np.ascontiguousarray(array, back.dtype).tobytes()
            assert back.flags.writeable and back.flags.c_contiguous
            view = tensor.numpy(copy=False)
            assert not view.flags.writeable and view.tobytes() == back.tobytes()
            del view
        assert session.shares_memory is True
        # Nothing went up inside a message; every transfer took a slot.
        assert session.stats()["bytes_uploaded_by_socket"] == 0
        assert session.connection.segments.transfers == 3 * sum(1 for _ in layouts(dtype))


@pytest.mark.timeout(60)
def test_results_computed_on_the_device_come_back_through_shared_memory(shm_cluster):
    # (the default 1 MiB threshold)
    with connect(shm_cluster, SharedMemory(cross_memory=False)) as session:
        a = np.arange(300_000, dtype=np.float64).reshape(600, 500)
        t = session.asarray(a)
        small = session.asarray(a[:10])  # under the threshold: inside messages, as before
        assert session.stats()["bytes_uploaded_by_socket"] == small.size * 8
        np.testing.assert_array_equal((t * 2 + 1)[::2].numpy(), (a * 2 + 1)[::2])
        np.testing.assert_array_equal(small.numpy(), a[:10])
        assert session.connection.segments.transfers == 2  # the upload and the large read


@pytest.mark.timeout(60)
def test_the_device_reports_what_went_through_shared_memory(shm_cluster):
    """Its worker's heartbeats say how many arrays (and bytes) came in and went out through
    shared memory, and what its own pool holds: the broker's metrics and fabric top show it."""
    def device_1(moved_on: int = -1) -> dict | None:
        with shm_cluster.admin() as admin:
            row = next(row for row in admin.devices() if row["index"] == 1)
        return row if row["shm_out"] is not None and row["shm_out"] > moved_on else None
    before = wait_for(device_1, 10, "device 1's first report")
    with connect(shm_cluster, SharedMemory(cross_memory=False), device=1) as session:
        a = np.arange(300_000.0)  # over the 1 MiB threshold
        np.testing.assert_array_equal((session.asarray(a) + 1).numpy(), a + 1)
        view = (session.asarray(a) * 2).numpy(copy=False)  # a slot of the device's, lent
        np.testing.assert_array_equal(view, a * 2)
        after = wait_for(lambda: device_1(before["shm_out"] + 1), 10, "the reads reported")
        del view
    assert (after["shm_in"] - before["shm_in"], after["shm_in_bytes"] - before["shm_in_bytes"]) \
        == (2, 2 * a.nbytes)
    assert (after["shm_out"] - before["shm_out"],
            after["shm_out_bytes"] - before["shm_out_bytes"]) == (2, 2 * a.nbytes)
    assert after["pool_bytes"] >= a.nbytes  # (the slots it lent for the uploads and the view)


@pytest.mark.timeout(60)
def test_a_read_only_view_holds_its_slot_until_collected(shm_cluster):
    with connect(shm_cluster) as session:
        t = session.asarray(np.ones(300_000))
        pool = session.connection.segments
        view = t.numpy(copy=False)
        lent = len(pool.lent)
        column = view[::2]  # a view of the view keeps the slot too
        del view
        gc.collect()
        assert len(pool.lent) == lent and column.sum() == 150_000
        with pytest.raises(ValueError):
            column[0] = 2  # read-only: tensors never change
        del column
        gc.collect()
        assert len(pool.lent) == lent - 1


@pytest.mark.timeout(60)
def test_a_read_is_the_callers_own_array_until_collected(shm_cluster):
    with connect(shm_cluster) as session:
        a = np.random.default_rng(6).random(300_000)
        t = session.asarray(a)
        mine = t.numpy()
        mine[:] = 0  # written by its owner: nothing else sees it
        again = t.numpy()
        np.testing.assert_array_equal(again, a)
        pool = session.connection.segments
        assert len(pool.lent) == 2  # each read's slot is its array's
        del mine, again
        gc.collect()
        assert not pool.lent and t.numpy().sum() == a.sum()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("devices", [(0, 1), (0, 0)], ids=["two workers", "one worker"])
def test_a_move_between_workers_goes_through_shared_memory(cluster, devices):
    with connect(cluster, SharedMemory(cross_memory=False), device=devices[0]) as source, \
            source.open(devices[1]) as destination:
        a = np.asfortranarray(np.random.default_rng(7).random((700, 400)))
        t = source.asarray(a)
        pool = source.connection.segments
        held = pool.held  # (a session's first upload of a size takes this client's pool)
        moved = t.to(destination)
        assert pool.held == held  # the move went into the receiving device's own slot
        transfers = pool.transfers
        np.testing.assert_array_equal(moved.numpy(), a)
        pool.reclaim()  # (the upload's slot: its batch ran)
        assert pool.transfers == transfers + 1 and not pool.lent  # the read's slot came back
        assert destination.shares_memory and destination.stats()["resident_bytes"] == a.nbytes
        broken = np.linalg.inv(source.zeros((400, 400)))  # singular: fails on the device
        with pytest.raises(fabric.RemoteError):
            broken.to(destination).numpy()
        small = source.asarray(np.arange(10.0)).to(destination)  # under the threshold
        np.testing.assert_array_equal(small.numpy(), np.arange(10.0))
        with connect(cluster, shared_memory=False, device=devices[0]) as by_socket, \
                by_socket.open(devices[1]) as by_socket_destination:
            by_socket.asarray(a).to(by_socket_destination).sum().numpy()
            with cluster.admin() as admin:
                routed = {int(row["id"], 16): row["bytes"] for row in admin.sessions()}
        # The broker carried the bytes only where they went inside the TRANSFER (between two
        # workers, without shared memory).
        assert routed[destination.id] < a.nbytes
        assert (routed[by_socket_destination.id] > a.nbytes) == (devices[0] != devices[1])


@pytest.mark.timeout(90)
def test_a_move_between_two_devices_of_one_worker_goes_into_the_receivers_own_slot():
    with fabric.LocalCluster(workers=1, devices_per_worker=2, heartbeat=HEARTBEAT,
                             worker_args=NO_START) as cluster, \
            connect(cluster, SharedMemory(cross_memory=False, start_slot=0),
                    device=0) as source, source.open(1) as destination:
        a = np.random.default_rng(11).random((700, 400))
        uploaded = source.asarray(a)
        held = source.connection.segments.held  # (a first upload of a size: this client's)
        moved = uploaded.to(destination)
        assert source.connection.segments.held == held  # the move took none of this client's
        np.testing.assert_array_equal(moved.numpy(), a)
        # Each device lent from its own pool: device 0 one ahead of the next upload, device 1
        # the move's and one ahead of the next move.
        worker = cluster.workers[0].pid
        assert len([name for name in held_segments(worker)
                    if parse_name(name).pid == worker]) == 3


@pytest.mark.timeout(60)
def test_two_connections_of_one_process_never_share_a_segment(shm_cluster):
    with connect(shm_cluster) as first, connect(shm_cluster) as second:
        a, b = np.arange(300_000.0), -np.arange(300_000.0)
        views = [first.asarray(a).numpy(copy=False), second.asarray(b).numpy(copy=False)]
        np.testing.assert_array_equal(views[0], a)
        np.testing.assert_array_equal(views[1], b)
        pools = first.connection.segments, second.connection.segments
        assert not {s.name for s in pools[0].lent} & {s.name for s in pools[1].lent}


@pytest.mark.timeout(60)
def test_a_sharded_tensor_gathers_its_shards_through_shared_memory(shm_cluster):
    with connect(shm_cluster) as session:
        mesh = session.mesh([0, 1])
        a = np.random.default_rng(8).random((600, 500))
        sharded = mesh.asarray(a, axis=0)
        np.testing.assert_array_equal(sharded.numpy(), a)
        pool = session.connection.segments
        segments, transfers = {s.name for s in [*pool.free, *pool.lent]}, pool.transfers
        assert len(pool.free) >= 2  # the gather's slots came back
        for _ in range(2):  # ... and are reused: no segment is made
            np.testing.assert_array_equal(sharded.numpy(), a)
        assert {s.name for s in [*pool.free, *pool.lent]} == segments
        assert pool.transfers == transfers + 4


@pytest.mark.timeout(60)
def test_a_full_pool_falls_back_to_the_sockets_and_never_fails(shm_cluster):
    # Room for two 2 MiB segments: two read-only views hold both, so the reads that come
    # next must take the sockets, and they are served all the same (uploads go into the
    # device's own slots: they need none of this pool's).
    with connect(shm_cluster,
                 SharedMemory(threshold=0, limit=4 << 20, cross_memory=False)) as session:
        a = np.random.default_rng(1).random(200_000)
        t = session.asarray(a)
        held = [t.numpy(copy=False), (t + 1).numpy(copy=False)]
        pool = session.connection.segments
        transfers = pool.transfers
        assert pool.held == 4 << 20 and not pool.free
        np.testing.assert_array_equal((t + 0).numpy(), a)  # (a result: in none of its slots)
        assert pool.transfers == transfers
        # An upload, and its read, which shows the device's slot: none of this pool's.
        np.testing.assert_array_equal(session.asarray(a * 3).numpy(), a * 3)
        assert pool.transfers == transfers + 2 and pool.held <= pool.limit
        assert session.stats()["bytes_uploaded_by_socket"] == 0
        np.testing.assert_array_equal(held[1], a + 1)
        del held
        gc.collect()
        np.testing.assert_array_equal((t + 0).numpy(), a)  # slots come back and are reused
        assert pool.transfers == transfers + 3 and pool.held == 4 << 20


@pytest.mark.timeout(60)
def test_uploads_reuse_the_same_segments(shm_cluster):
    with connect(shm_cluster, SharedMemory(cross_memory=False, start_slot=0)) as session:
        a = np.random.default_rng(2).random(400_000)
        for i in range(5):
            t = session.asarray(a + i)
            assert t[-1].numpy() == a[-1] + i
            ahead_answered(session)
        pool = session.connection.segments
        # The first through this client's pool, the others into slots the device lent ahead:
        # the few its tensors keep and the ones they gave back, reused.
        assert (session.slots_ahead.missed, session.slots_ahead.used) == (1, 4)
        assert pool.transfers == 5 and pool.held == 4 << 20
        [device] = pool.peers.values()
        assert len(device.maps) <= 3


@pytest.mark.timeout(90)
def test_a_segment_its_owner_closed_is_unmapped_by_its_peer_too():
    # A mapping keeps a closed segment's memory: each side unmaps what the other closed.
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--shared-memory-idle", "0.5", *NO_START)) as cluster, \
            connect(cluster, SharedMemory(idle_seconds=0.5, cross_memory=False,
                                          start_slot=0)) as session:
        worker, me = cluster.workers[0].pid, os.getpid()
        session.asarray(np.ones(300_000)).numpy()  # (a first upload: this client's pool)
        ahead_answered(session)
        keep = session.asarray(np.ones(300_000))  # these two into slots lent ahead
        session.sync()
        ahead_answered(session)
        gone = session.asarray(np.zeros(300_000))
        session.sync()
        ahead = {entry.ref.name for entry in session.slots_ahead.arrived}  # (the next upload's,
        # mapped as its answer came)
        both = set(held_segments(worker)) & mapped(me, worker) - ahead
        assert len(both) == 2 and session.slots_ahead.used == 2  # the client wrote through them
        del gone
        session.sync()
        wait_for(lambda: len(both & set(held_segments(worker))) == 1, 10,
                 "the device to close one")
        [closed] = both - set(held_segments(worker))
        # (a result read back takes a slot of this client's: a read of ``keep`` would show
        # its device's slot, taking none)
        wait_for(lambda: (keep + 0).numpy().sum() == 300_000
                 and closed not in mapped(me, worker),
                 10, "this client to unmap the device's closed segment")
        # (held_segments also lists the device's segments this process maps: an mmap keeps
        # a descriptor of its own)
        [read] = [name for name in held_segments(me) if parse_name(name).pid == me]
        assert read in mapped(worker, me)  # the slot those reads went through
        big = session.asarray(np.ones(2_000_000))
        wait_for(lambda: big.numpy().sum() == 2_000_000 and read not in held_segments(me),
                 10, "this client to close its idle segment")
        wait_for(lambda: read not in mapped(worker, me), 10, "the worker to unmap it")


@pytest.mark.timeout(60)
def test_the_client_option_turns_it_off(shm_cluster):
    with connect(shm_cluster, shared_memory=False) as session:
        a = np.random.default_rng(3).random(300_000)
        np.testing.assert_array_equal(session.asarray(a).numpy(), a)
        assert session.connection.segments is None and session.shares_memory is None  # (unasked)
        assert session.stats()["bytes_uploaded_by_socket"] == a.nbytes
    with pytest.raises(TypeError, match="shared_memory= takes"):
        connect(shm_cluster, shared_memory="yes")


@pytest.mark.timeout(60)
def test_a_slot_of_another_process_is_refused_and_the_worker_goes_on(shm_cluster):
    with connect(shm_cluster) as session:
        t = session.asarray(np.arange(1000.0))
        stranger = segment_name(boot_id(), 1, 0)  # (init's pid: never this client's)
        with pytest.raises(ProtocolError, match="process that agreed"):
            session._call({"op": "read_into", "id": t.id, "dtype": "<f8", "shape": [1000],
                           "into": [stranger, 0, 8000]})
        back = t.numpy()  # (read through a slot of this client's pool)
        with pytest.raises(ProtocolError, match="does not fit"):
            pool = session.connection.segments
            name = [*pool.free, *pool.lent][0].name  # (the read's)
            session._call({"op": "read_into", "id": t.id, "dtype": "<f8", "shape": [1000],
                           "into": [name, 1 << 30, 8000]})
        assert t.sum().numpy() == back.sum() == 499500.0


@pytest.mark.timeout(60)
def test_a_put_from_shared_memory_the_session_never_agreed_to_fails_alone(shm_cluster):
    with connect(shm_cluster, shared_memory=False) as session:
        tensor = session.stream.new_tensor((10,), np.dtype("float64"), None)
        name = segment_name(boot_id(), os.getpid(), 0)
        session.stream.enqueue(["put", tensor.id, [], {"dtype": "<f8", "shape": [10],
                                                       "shm": [name, 0, 80]}], None, tensor)
        with pytest.raises(FabricError, match="has not agreed to shared memory"):
            tensor.numpy()
        assert session.arange(4).sum().numpy() == 6  # the session and its worker go on


@contextlib.contextmanager
def worker_served_from_python(cluster: fabric.LocalCluster, **fields):
    """A worker run by ``serve()`` called from Python (as an embedding program would), with
    ``fields`` for its options record; ended on leaving."""
    call = (f"from fabric.workers.control_io import serve; serve({cluster.worker_address!r}, "
            f"token={cluster.worker_token!r}, name='from-python', heartbeat={HEARTBEAT}, "
            + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")")
    worker = subprocess.Popen([sys.executable, "-c", call])
    try:
        cluster.wait_for_devices(1)
        yield
    finally:
        worker.terminate()
        worker.wait(timeout=30)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("started_by", ["fabric worker", "serve()"])
def test_a_worker_started_without_shared_memory_serves_through_the_sockets(started_by):
    """``fabric worker --no-shared-memory`` and ``serve(..., shared_memory=False)`` build the
    same options record, and the worker reads nothing else."""
    by_command = started_by == "fabric worker"
    with fabric.LocalCluster(workers=int(by_command), heartbeat=HEARTBEAT,
                             worker_args=("--no-shared-memory",)) as cluster, \
            (contextlib.nullcontext() if by_command
             else worker_served_from_python(cluster, shared_memory=False)), \
            connect(cluster) as session:
        a = np.random.default_rng(4).random((300, 200))
        np.testing.assert_array_equal(session.asarray(a).numpy(), a)
        assert session.shares_memory is False
        assert session.stats()["bytes_uploaded_by_socket"] == a.nbytes


@pytest.mark.timeout(90)
def test_memory_limit_counts_what_an_upload_copies_out_of_shared_memory():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--memory-limit", "1000000")) as cluster, \
            connect(cluster) as session:
        too_big = session.asarray(np.ones(200_000))  # 1.6 MB
        with pytest.raises(fabric.RemoteError, match="memory"):
            too_big.numpy()
        assert session.shares_memory is True
        np.testing.assert_array_equal(session.asarray(np.ones(1000)).numpy(), np.ones(1000))


@pytest.mark.timeout(90)
def test_a_worker_killed_during_an_upload_fails_the_session_and_leaves_nothing(cluster):
    session = connect(cluster, device=1, timeout=30)
    try:
        session.asarray(np.ones(10)).numpy()  # agreed, and the session is known to work
        big = np.random.default_rng(5).random(8 << 20)  # 64 MiB
        session.asarray(big)  # sent: the worker copies it out while it dies
        cluster.workers[1].send_signal(signal.SIGKILL)
        with pytest.raises(FabricError) as lost:
            session.sync()
        assert isinstance(lost.value, fabric.SessionLost)
        assert session.connection.segments.held > 0  # this client's: freed at close
    finally:
        session.close()
    assert held_segments(os.getpid()) == {}


@pytest.mark.timeout(90)
def test_a_restarted_workers_old_segments_are_unmapped_by_a_client_that_goes_on(cluster):
    a = np.random.default_rng(10).random(300_000)
    with connect(cluster, device=0, timeout=30) as session:
        with session.open(1) as lost:
            lost.asarray(a).numpy()  # (a first upload: through this client's pool)
            ahead_answered(lost)
            lost.asarray(a)  # into a slot of worker 1's own pool lent ahead, mapped here
            dead = cluster.workers[1].pid
            assert dead in session.connection.segments.peers
            cluster.workers[1].send_signal(signal.SIGKILL)
            cluster.workers[1].wait(5)
            with pytest.raises(fabric.SessionLost):
                lost.sync()
        cluster.start_worker(1)
        again = wait_for(lambda: _open_or_none(session, 1), 30, "worker 1 back")
        with again:
            for _ in range(2):  # the second into a slot of the new worker's, mapped here
                np.testing.assert_array_equal(again.asarray(a).numpy(), a)
                ahead_answered(again)
        peers = session.connection.segments.peers
        assert dead not in peers and cluster.workers[1].pid in peers


def _open_or_none(session: fabric.Session, device: int) -> fabric.Session | None:
    try:
        return session.open(device, timeout=2)
    except FabricError:
        return None


@pytest.mark.timeout(90)
def test_a_killed_clients_segments_are_unmapped_once_its_session_ends():
    script = (
        "import fabric, numpy, os, sys\n"
        "s = fabric.connect(sys.argv[1], token=os.environ['FABRIC_TOKEN'],\n"
        "                   shared_memory=fabric.SharedMemory(threshold=0, cross_memory=False))\n"
        "keep = s.asarray(numpy.ones(100)).numpy(copy=False)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n")
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             broker_args=("--lease", "0.5")) as cluster:
        client = subprocess.Popen([sys.executable, "-c", script, cluster.address],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "FABRIC_TOKEN": cluster.token})
        try:
            assert client.stdout.readline().strip() == "ready"
            worker = cluster.workers[0].pid
            assert held_segments(client.pid)  # its view's slot, at least
            assert mapped(worker, client.pid)  # (the upload's)
            client.kill()
            client.wait()
            assert mapped(worker, client.pid)  # SIGKILL: nothing ran at its end
            # The broker ends the vanished client's session; its worker then unmaps.
            wait_for(lambda: not mapped(worker, client.pid), 10, "the dead client's segments")
        finally:
            if client.poll() is None:
                client.kill()
            client.communicate(timeout=5)


@pytest.mark.timeout(60)
def test_a_segment_shrunk_after_its_put_was_sent_fails_that_put_and_the_worker_goes_on(
        shm_cluster):
    # The attack: a client names a segment of its own that it can shrink, and shrinks it
    # between sending the put and the worker's copy; a worker that mapped it would die of
    # SIGBUS there. Twice: the first try must not leave a mapping the second one reaches.
    name = segment_name(boot_id(), os.getpid(), 999_999)
    hostile = os.memfd_create(name)  # (not sealed)
    try:
        with connect(shm_cluster) as attacker, connect(shm_cluster) as bystander:
            kept = bystander.asarray(np.arange(1000.0))
            attacker.asarray(np.ones(10)).numpy()  # agreed to shared memory
            for _ in range(2):
                os.ftruncate(hostile, SEGMENT_ALIGN)
                tensor = attacker.stream.new_tensor((1000,), np.dtype("float64"), None)
                attacker.stream.enqueue(["put", tensor.id, [], {
                    "dtype": "<f8", "shape": [1000], "shm": [name, 0, 8000]}], None, tensor)
                attacker.flush()
                os.ftruncate(hostile, 0)
                with pytest.raises(ProtocolError, match="not sealed against shrinking"):
                    tensor.numpy()
            assert attacker.arange(4).sum().numpy() == 6  # the session and its worker go on
            assert kept.sum().numpy() == 499500.0  # and so does everyone else
    finally:
        os.close(hostile)


SYSTEM_PYTHON = "/usr/bin/python3"  # (one that another user may run)


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
                    reason="starts a process of another user: needs root and a system python")
@pytest.mark.timeout(60)
def test_a_tensor_is_never_moved_into_another_users_segment(shm_cluster):
    script = ("import fcntl, os, sys\n"
              "fd = os.memfd_create(f'fabric-{sys.argv[1]}-{os.getpid()}-0', "
              "os.MFD_ALLOW_SEALING)\n"
              "os.ftruncate(fd, 8 << 20)\n"
              "fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)\n"
              "print('ready', flush=True)\n"
              "sys.stdin.read()\n")
    other = subprocess.Popen([SYSTEM_PYTHON, "-c", script, boot_id()], user=65534, cwd="/",
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "ready"
        with connect(shm_cluster, device=0) as source, source.open(1) as destination:
            t = source.asarray(np.ones(300_000))
            # t.to(destination) as the client makes it, but into the other user's segment
            moved = destination.stream.new_tensor(t.shape, t.dtype, None)
            destination._call({"op": "expect", "id": moved.id, "ticket": 7})
            source.stream.enqueue(["send", 0, [t.id], {
                "session": destination.id, "ticket": 7,
                "into": [segment_name(boot_id(), other.pid, 0), 0, t.size * 8]}])
            source.flush()
            destination._call({"op": "await", "id": moved.id})
            with pytest.raises(ProtocolError, match="same user"):
                moved.numpy()
            assert t.sum().numpy() == 300_000  # the worker goes on
    finally:
        other.kill()
        other.communicate(timeout=5)


# -- the rules on their own ---------------------------------------------------------------


def test_names_say_their_boot_and_owner():
    name = segment_name("0123abcd", 4242, 7)
    assert name == "fabric-0123abcd-4242-7"
    assert parse_name(name) == ("0123abcd", 4242, 7)
    for other in ["fabric-0123abcd-4242", "fabric-xyz-1-2", "psm_123", "fabric-0123abcd-1-2/x",
                  None, 5]:
        assert parse_name(other) is None


def test_segments_are_sealed_at_their_size_and_a_peer_maps_only_sealed_ones():
    pool = SegmentPool(lambda session: 0)
    unsealed = os.memfd_create(segment_name(boot_id(), os.getpid(), 999_999))
    try:
        slot = pool.acquire(10)
        with pytest.raises(PermissionError):  # not even its owner can shrink it
            os.ftruncate(slot.segment.fd, 0)
        held = held_segments(os.getpid())
        assert set(held) == {slot.segment.name, segment_name(boot_id(), os.getpid(), 999_999)}
        peer = Segment.open(slot.segment.name, held[slot.segment.name])
        assert peer.size == slot.segment.size == SEGMENT_ALIGN
        peer.close()
        os.ftruncate(unsealed, SEGMENT_ALIGN)
        with pytest.raises(UnsealedSegment):
            Segment.open(segment_name(boot_id(), os.getpid(), 999_999),
                         held[segment_name(boot_id(), os.getpid(), 999_999)])
    finally:
        os.close(unsealed)
        pool.close()


@pytest.mark.parametrize("ref", [None, ["fabric-0123abcd-1-2", 0], ["x", 0, 8],
                                 ["fabric-0123abcd-1-2", -1, 8], ["fabric-0123abcd-1-2", 0, 1.5]])
def test_a_malformed_slot_is_a_protocol_error(ref):
    with pytest.raises(ProtocolError, match="slot must be"):
        decode_segment_ref(ref)


def test_the_pool_reuses_fits_bounds_and_shrinks():
    now, done = [0.0], {7: 0}
    pool = SegmentPool(done.get, limit=3 * SEGMENT_ALIGN, idle_seconds=30,
                       clock=lambda: now[0])
    try:
        upload = pool.acquire(SEGMENT_ALIGN + 1)  # two units
        pool.lend_until(upload, 7, 1)  # back once session 7's device ran its batch 1
        read = pool.acquire(10)
        assert pool.held == 3 * SEGMENT_ALIGN and pool.acquire(10) is None  # full: sockets
        done[7] = 1
        again = pool.acquire(SEGMENT_ALIGN)  # the upload's, reused: it fits
        assert again.segment is upload.segment and pool.held == 3 * SEGMENT_ALIGN
        pool.give_back(read)
        pool.give_back(again)
        now[0] = 31.0  # both idle past idle_seconds: closed when the next is lent
        small = pool.acquire(1)
        assert pool.held == SEGMENT_ALIGN and small.segment not in (read.segment, again.segment)
        assert read.segment.name not in held_segments(os.getpid())
        pool.discard(small)  # abandoned: closed at once, never reused
        assert pool.held == 0 and held_segments(os.getpid()) == {}
    finally:
        pool.close()


@pytest.mark.timeout(60)
def test_an_array_dropped_in_another_thread_gives_its_slot_back_later(shm_cluster):
    with connect(shm_cluster) as session:
        t = session.asarray(np.ones(300_000))
        session.sync()  # the device ran the upload: the read below reuses its segment
        arrays = [t.numpy()]
        pool = session.connection.segments
        assert len(pool.lent) == 1 and pool.held == 4 << 20
        dropper = threading.Thread(target=arrays.clear)
        dropper.start()
        dropper.join()
        assert len(pool.lent) == 1  # queued: the pool is its connection's thread's alone
        np.testing.assert_array_equal(t.numpy(), np.ones(300_000))  # the next lend takes it
        assert pool.held == 4 << 20 and pool.transfers == 3  # one segment, reused
