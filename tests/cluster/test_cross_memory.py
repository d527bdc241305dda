"""The worker reading an upload straight out of its client's array, and writing a first
read of a size straight into new memory of the client's (``fabric.core.cross_memory``), where
no slot of shared memory is ready: real brokers and workers on loopback, and the module's
own rules."""

from __future__ import annotations

import gc
import mmap
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import fabric
from fabric.core import cross_memory
from fabric.core.errors import FabricError, RequestTimeout
from fabric.core.parallel_copy import ParallelCopy
from fabric.core.segment_pool import WARM_MOST, SegmentPool
from fabric.core.shm import SharedMemory
from fabric.core.wire import dtype_name
from fabric.transport import bulk, bulk_reads, probe
from fabric.workers.shared_memory import ClientProcess, _reads_memory

from polling import wait_for
from test_shm_ahead import _state
from test_shm_path import DTYPES, no_segments_left, random_array  # noqa: F401 (a fixture)
from test_shm_path import shm_cluster  # noqa: F401 (a fixture)

MiB = 1 << 20
F8 = dtype_name(np.dtype("float64"))


def connect(cluster, **options) -> fabric.Session:
    """A session whose arrays of 1 MiB or more take shared memory (the default), whose
    first upload is read out of this process's memory, not written into a start slot lent
    ahead (``test_start_slot``)."""
    options.setdefault("shared_memory", SharedMemory(start_slot=0))
    return fabric.connect(cluster.address, token=cluster.token, **options)


def owner(array: np.ndarray) -> object:
    """What holds ``array``'s memory, past its views."""
    while isinstance(array, np.ndarray):
        array = array.base
    return array.obj if isinstance(array, memoryview) else array


def through_memory(session: fabric.Session) -> bool:
    """Whether the worker may reach this process's memory, its probe answered."""
    bulk.pool_of(session)
    return session.probe is not None and session.probe.reads_memory


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_goes_up_and_down_through_the_clients_own_memory(shm_cluster, dtype):
    with connect(shm_cluster) as session:
        assert session.arange(4).sum().numpy() == 6
        assert through_memory(session)
        pool = session.connection.segments
        array = random_array(dtype, (1024, 1100))  # (1 MiB at least)
        tensor = session.asarray(array)
        uploaded = session.stream.counts["bytes_uploaded_by_shared_memory"]
        assert uploaded == array.nbytes and not pool.lent and not pool.free  # no slot
        back = tensor.numpy()
        assert back.tobytes() == array.tobytes() and back.dtype == array.dtype
        assert isinstance(owner(back), mmap.mmap) and back.flags.writeable  # its own
        # (memory the worker wrote into)
        assert pool.transfers == 2 and not pool.lent
        # the read had a slot of its size made ahead, on the pool's maker thread: a second
        # read of the size takes it (before it is made, new memory as the first did)
        wait_for(lambda: pool.reclaim() or pool.free, 20, "the slot made ahead")
        (made,) = pool.free
        again = tensor.numpy()
        assert again.tobytes() == array.tobytes() and not isinstance(owner(again), mmap.mmap)
        assert set(pool.lent) == {made} and not pool.free and not pool.making
        del again
        gc.collect()
        assert tensor.numpy().tobytes() == array.tobytes() and pool.transfers == 4
        assert set(pool.free) | set(pool.lent) == {made}  # (the next reuses it)
        assert session.stats()["bytes_uploaded_by_socket"] == 0


@pytest.mark.timeout(60)
def test_an_array_changed_after_its_upload_returned_leaves_the_tensor_as_it_was(shm_cluster):
    with connect(shm_cluster) as session:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        array = np.arange(MiB, dtype=np.float64)
        tensor = session.asarray(array)
        array[:] = -1  # (the worker read it before asarray returned)
        del array
        gc.collect()
        np.testing.assert_array_equal(tensor.numpy(), np.arange(MiB, dtype=np.float64))


@pytest.mark.timeout(60)
def test_arrays_the_device_does_not_keep_as_they_are_take_a_slot(shm_cluster):
    with connect(shm_cluster) as session:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        pool = session.connection.segments
        for array in (np.arange(400_000.0)[::2], np.arange(200_000.0).astype(">f8"),
                      np.asfortranarray(np.ones((600, 500)))):
            transfers = pool.transfers
            tensor = session.asarray(array)
            session.sync()
            assert pool.transfers == transfers + 1 and (pool.lent or pool.free or
                                                        session.in_device_slots)
            np.testing.assert_array_equal(tensor.numpy(), array)


@pytest.mark.timeout(90)
def test_an_upload_to_a_busy_device_never_waits_for_it():
    # The upload waits for the worker's read: only where the device ran all it was sent, so
    # a stopped device sends it through a slot (the sockets timed out before).
    with fabric.LocalCluster(workers=1, heartbeat=2.0) as cluster, \
            connect(cluster, timeout=10) as session:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        worker = cluster.workers[0]
        worker.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: _state(worker.pid) == "T", 5, "the worker to stop")
            waiting = session._send_request({"op": "sync"})  # unanswered while stopped
            array = random_array("float64", (300_000,), 1)
            tensor = session.asarray(array)  # (returns: its bytes are in a slot)
        finally:
            worker.send_signal(signal.SIGCONT)
        session._reply(waiting)
        assert tensor.numpy().tobytes() == array.tobytes()


@pytest.mark.timeout(90)
def test_a_read_given_up_before_its_worker_wrote_is_retired_and_the_write_lands_nowhere():
    with fabric.LocalCluster(workers=1, heartbeat=2.0) as cluster, \
            connect(cluster, timeout=10) as session:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        tensor = session.asarray(np.arange(MiB, dtype=np.float64))
        session.sync()
        retired = len(bulk_reads._RETIRED)
        worker = cluster.workers[0]
        worker.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: _state(worker.pid) == "T", 5, "the worker to stop")
            read = session.start_read(tensor)
            with pytest.raises(RequestTimeout):
                read.result(timeout=0.5)
        finally:
            worker.send_signal(signal.SIGCONT)
        assert len(bulk_reads._RETIRED) == retired + 1  # its addresses stay reserved, unusable
        # the worker's late write failed (EFAULT), its answer dropped: the session goes on
        np.testing.assert_array_equal(tensor.numpy(), np.arange(MiB, dtype=np.float64))
        assert worker.poll() is None


def _put_from(session: fabric.Session, shape: list, address: int) -> fabric.Tensor:
    """A put naming ``address`` in this process's memory, sent by hand (as a hostile or
    broken client would)."""
    tensor = session.stream.new_tensor(tuple(shape) if type(shape) is list else (1,),
                                       np.dtype("float64"), None)
    session.stream.enqueue(["put", tensor.id, [], {"dtype": "<f8", "shape": shape,
                                                   "from": address}], None, tensor)
    session.flush()
    return tensor


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shape, address, error", [
    ([1024], 8, "could not be reached"),  # (not mapped in the client)
    ([1024], -5, "names the address"),
    ([1024], "here", "names the address"),
    ([-1], None, "shape"),
    ("1024", None, "shape"),
    ([1 << 40], None, "memory"),  # past every budget: refused before anything is allocated
])
def test_a_bad_put_from_the_clients_memory_fails_alone(shm_cluster, shape, address, error):
    with connect(shm_cluster) as session:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        kept = np.ones(8)
        tensor = _put_from(session, shape, kept.ctypes.data if address is None else address)
        with pytest.raises(FabricError, match=error):
            tensor.numpy()
        assert session.arange(4).sum().numpy() == 6  # the session and its worker go on


@pytest.mark.timeout(60)
def test_a_worker_reaches_no_memory_of_a_client_that_did_not_offer_it(shm_cluster):
    with fabric.connect(shm_cluster.address, token=shm_cluster.token,
                        shared_memory=SharedMemory(threshold=0, cross_memory=False)) as session:
        assert session.arange(4).sum().numpy() == 6 and not through_memory(session)
        assert session.shares_memory
        kept = np.ones(1024)
        with pytest.raises(FabricError, match="probe said so"):
            _put_from(session, [1024], kept.ctypes.data).numpy()
        tensor = session.asarray(kept)
        with pytest.raises(FabricError, match="probe said so"):
            session._call({"op": "read_into", "id": tensor.id, "dtype": F8,
                           "shape": (1024,), "into_memory": [kept.ctypes.data, kept.nbytes]})
        np.testing.assert_array_equal(tensor.numpy(), kept)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target, error", [
    (lambda kept: [kept.ctypes.data, kept.nbytes // 2], "cannot take"),  # a smaller target
    (lambda kept: [8, kept.nbytes], "could not be reached"),
    (lambda kept: [kept.ctypes.data], "into_memory is"),
])
def test_a_bad_read_into_the_clients_memory_fails_alone(shm_cluster, target, error):
    with connect(shm_cluster) as session:
        assert session.arange(4).sum().numpy() == 6 and through_memory(session)
        kept = np.zeros(1024)
        tensor = session.arange(1024.0)
        with pytest.raises(FabricError, match=error):
            session._call({"op": "read_into", "id": tensor.id, "dtype": F8,
                           "shape": (1024,), "into_memory": target(kept)})
        assert not kept.any()  # nothing written past a target it refused
        np.testing.assert_array_equal(tensor.numpy(), np.arange(1024.0))


def test_reads_and_writes_go_in_pieces_and_fail_with_the_kernels_error():
    source = np.random.default_rng(3).random(3 * MiB)  # 24 MiB: cut into 2 MiB-aligned pieces
    copies = ParallelCopy(threads=3, min_bytes=0)
    try:
        into = cross_memory.new_array(source.shape, source.dtype)
        cross_memory.read(os.getpid(), source.ctypes.data, into, copies)
        assert into.tobytes() == source.tobytes()
        target = cross_memory.new_memory(source.nbytes)
        cross_memory.write(os.getpid(), cross_memory.address(target), source, copies)
        assert bytes(target) == source.tobytes()
        with pytest.raises(OSError) as failed:
            cross_memory.read(os.getpid(), 8, into)
        assert failed.value.errno == 14  # EFAULT
        with pytest.raises(ValueError):
            cross_memory.read(os.getpid(), source.ctypes.data, into[::2])
    finally:
        copies.close()


def test_retired_memory_takes_no_late_write():
    memory = cross_memory.new_memory(MiB)
    start = cross_memory.address(memory)
    cross_memory.retire(memory)
    with pytest.raises(OSError):  # (EFAULT: nothing lands there)
        cross_memory.write(os.getpid(), start, np.ones(16))


def test_huge_pages_are_not_used_where_the_host_takes_free_pages_back(tmp_path):
    reporting, plain, cut = tmp_path / "reporting", tmp_path / "plain", tmp_path / "cut"
    reporting.write_text("0110010" + "0" * 57 + "\n")  # bit 5: VIRTIO_BALLOON_F_REPORTING
    plain.write_text("0110000" + "0" * 57 + "\n")
    cut.write_text("011\n")
    assert cross_memory.host_takes_free_pages([str(plain), str(reporting)])
    assert not cross_memory.host_takes_free_pages([str(plain), str(cut)])
    assert not cross_memory.host_takes_free_pages([str(tmp_path / "absent")])
    assert not cross_memory.host_takes_free_pages([])


def test_freed_memory_is_reported_from_the_order_set_unless_past_the_largest_block(tmp_path):
    reporting, plain = tmp_path / "reporting", tmp_path / "plain"
    reporting.write_text("0110010" + "0" * 57 + "\n")  # bit 5: VIRTIO_BALLOON_F_REPORTING
    plain.write_text("0110000" + "0" * 57 + "\n")
    order, buddies = tmp_path / "page_reporting_order", tmp_path / "buddyinfo"
    buddies.write_text("Node 0, zone      DMA      0 0 0 0 0 0 0 0 1 1 3\n"  # orders 0 to 10
                       "Node 0, zone   Normal   2344 730 11104 9059 5841 3279 1947 935 543 40 "
                       "2980\n")

    def reported(features, setting, buddy_file=buddies):
        order.unlink(missing_ok=True)
        if setting is not None:
            order.write_text(setting)
        return cross_memory.reported_order([str(features)], str(order), str(buddy_file))

    assert reported(reporting, "9\n") == 9
    assert reported(reporting, "10\n") == 10  # the largest block the guest keeps
    assert reported(reporting, "11\n") is None  # past it: nothing is reported
    assert reported(reporting, "11\n", tmp_path / "absent") == 11  # (no orders to tell by)
    assert reported(reporting, None) == cross_memory.PAGEBLOCK_ORDER  # (the kernel's default)
    assert reported(reporting, "nine\n") == cross_memory.PAGEBLOCK_ORDER
    assert reported(plain, "9\n") is None  # (no balloon reports)


@pytest.mark.parametrize("reported, pays", [(9, False), (None, True)])
def test_huge_pages_pay_where_freed_memory_stays_here(monkeypatch, reported, pays):
    monkeypatch.setattr(cross_memory, "freed_memory_reported", lambda: reported)
    assert cross_memory.huge_pages_pay.__wrapped__() is pays


def test_a_worker_says_at_start_whether_freed_memory_goes_back_to_a_host(shm_cluster):
    # (The same machine as this test's: the workers read the same settings.)
    said = "back to its host" in shm_cluster.log_tail("worker-0", 100_000)
    assert said == (cross_memory.freed_memory_reported() is not None)


def test_a_probes_heap_that_does_not_hold_its_token_reads_as_unreachable(shm_cluster):
    # A client naming memory that is not its token (or none) gets no cross-memory path.
    process = ClientProcess(os.getpid())
    try:
        token = np.array([1234], np.uint64)
        assert _reads_memory(process, {"heap": token.ctypes.data, "token": 1234})
        assert not _reads_memory(process, {"heap": token.ctypes.data, "token": 99})
        assert not _reads_memory(process, {"heap": 8, "token": 1234})
        assert not _reads_memory(process, {"heap": "x", "token": 1234})
        assert not _reads_memory(process, {"token": 1234})
    finally:
        process.close()



_HEAP_PROBE = """
import mmap, numpy as np
from fabric.core import cross_memory
cross_memory.keep_in_heap(32 << 20)
array = cross_memory.array_to_read_into((1 << 20,), np.dtype("float64"))  # 8 MiB
owner = array
while isinstance(owner, np.ndarray):
    owner = owner.base
print("new memory" if isinstance(getattr(owner, "obj", owner), mmap.mmap) else "heap")
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tunables, where", [(True, "heap"), (False, "new memory")])
def test_a_transfer_is_read_into_memory_the_heap_kept_only_where_it_keeps_it(tunables, where):
    # A worker's heap keeps freed memory (its malloc settings), faulted in: a first transfer
    # lands there. A process whose malloc hands freed memory back reads into new memory.
    from fabric.launch.local import bulk_malloc_tunables

    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = ":".join(bulk_malloc_tunables())
    ran = subprocess.run([sys.executable, "-c", _HEAP_PROBE], env=env, capture_output=True,
                         text=True, timeout=50)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == where


@pytest.mark.timeout(60)
def test_first_reads_land_in_memory_faulted_in_ahead_at_open_and_after_an_upload(shm_cluster):
    with connect(shm_cluster) as session:
        pool = session.connection.segments  # (made at open, to warm memory ahead)
        wait_for(lambda: pool.reclaim() or pool.warm, 20, "the memory warmed at open")
        (at_open,) = pool.warm
        assert at_open.size == probe.WARM_AT_OPEN == pool.held
        assert through_memory(session)
        back = session.arange(1_000_000, dtype="float64").numpy()  # (made on the device)
        assert np.array_equal(back, np.arange(1_000_000.0)) and back.flags.writeable
        assert owner(back) is at_open.memory and not pool.warm  # taken
        assert pool.held == ahead(pool) >= back.nbytes  # (and a slot of its size made ahead)
        array = np.random.default_rng(0).random(3_000_000)
        assert session.stream.batch  # (the frees of the tensors above: they let the upload
        # be read out of this process's memory, which warms 24 MB ahead on the maker thread)
        tensor = session.asarray(array)
        assert session.stats()["bytes_uploaded_by_shared_memory"] == array.nbytes \
            and not pool.lent  # (no slot: the 8 MB one made ahead does not fit)
        wait_for(lambda: pool.reclaim() or pool.warm, 20, "the memory warmed for a read")
        (block,) = pool.warm
        assert block.size >= array.nbytes and pool.held == block.size + ahead(pool)
        back = (tensor * 2.0).numpy()  # (a result of the same size, read back once)
        assert back.tobytes() == (array * 2.0).tobytes() and owner(back) is block.memory
        assert not pool.warm and pool.held == ahead(pool)
        wait_for(lambda: pool.reclaim() or not pool.making, 20, "the slots made ahead")
        session.asarray(array)  # a size read before takes the slots: nothing warmed
        assert not pool.warm and not pool.making


def test_a_slot_made_ahead_is_bounded_and_taken_by_the_next_acquire_that_fits():
    pool = SegmentPool(lambda _session: 0, limit=64 * MiB, idle_seconds=30)
    try:
        pool.make_ahead(WARM_MOST + 1)  # (past the largest: a read that large makes its own)
        pool.make_ahead(100 * MiB)  # (past the limit)
        assert not pool.making and pool.held == 0
        pool.make_ahead(8 * MiB)
        pool.make_ahead(6 * MiB)  # (the 8 MiB one fits it: no second)
        (segment,) = pool.making
        assert pool.being_made(6 * MiB) and not pool.being_made(20 * MiB)
        assert pool.held == 8 * MiB
        wait_for(lambda: pool.reclaim() or pool.free, 20, "the segment made ahead")
        assert set(pool.free) == {segment} and not pool.being_made(6 * MiB)
        pool.make_ahead(8 * MiB)  # (a free one fits)
        assert not pool.making
        slot = pool.acquire(7 * MiB)
        assert slot.segment is segment and pool.held == 8 * MiB and not pool.free
        pool.give_back(slot)
    finally:
        pool.close()


def test_a_block_taken_while_it_waits_to_start_lets_the_maker_go_on_at_once():
    pool = SegmentPool(lambda _session: 0, limit=64 * MiB, idle_seconds=30)
    try:
        pool.warm_ahead(8 * MiB, after=60.0)
        assert pool.take_warm(8 * MiB) is not None  # (taken before its fault-in began)
        pool.make_ahead(8 * MiB)
        wait_for(lambda: pool.reclaim() or pool.free, 10, "the segment queued after it")
    finally:
        pool.close()


def ahead(pool: SegmentPool) -> int:
    """The bytes of the segments ``pool`` made ahead of reads, or is making (free, unused)."""
    return sum(segment.size for segment in [*pool.free, *pool.making]
               if not isinstance(segment, cross_memory.WarmMemory))


def test_warm_memory_is_bounded_taken_where_it_fits_and_closed_when_idle():
    now = [0.0]
    pool = SegmentPool(lambda _session: 0, limit=64 * MiB, idle_seconds=30,
                       clock=lambda: now[0])
    try:
        pool.limit = 1 << 40
        pool.warm_ahead(WARM_MOST + 1)  # (past the largest block: a read faults its own in)
        assert not pool.making and pool.held == 0
        pool.limit = 64 * MiB
        pool.warm_ahead(8 * MiB)
        pool.warm_ahead(6 * MiB)  # (8 MiB fits it: no second block)
        (block,) = pool.making
        assert pool.held == 8 * MiB and block.size == 8 * MiB
        taken = pool.take_warm(6 * MiB)  # taken while being faulted in: the taker's now,
        assert taken is block.memory and block.stopped  # its fault-in stopped
        assert pool.held == 0 and not pool.making and not pool.warm
        assert pool.take_warm(6 * MiB) is None  # (none left)
        pool.warm_ahead(1 * MiB)
        pool.warm_ahead(30 * MiB)
        pool.warm_ahead(20 * MiB)  # past WARM_BLOCKS: not made
        pool.warm_ahead(64 * MiB)  # past the limit either way
        assert pool.held == 31 * MiB
        wait_for(lambda: pool.reclaim() or len(pool.warm) == 2, 20, "both blocks made")
        assert pool.take_warm(100 * MiB) is None and pool.take_warm(12 * MiB) is None  # fits
        now[0] = 31.0  # idle past idle_seconds: both closed
        pool.reclaim()
        assert pool.held == 0 and not pool.warm
        taken[:] = b"x" * len(taken)  # (still the taker's, writable)
        pool.warm_ahead(32 * MiB)
        (making,) = pool.making
    finally:
        pool.close()
    assert making.stopped  # (its pool closed: the maker faults in no more of it)
    stopped = cross_memory.WarmMemory(8 * MiB)
    stopped.stop()
    with pytest.raises(OSError, match="taken, or its pool closed"):
        stopped.allocate()
    stopped.close()
