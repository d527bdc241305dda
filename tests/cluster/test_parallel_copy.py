"""Large copies into and out of shared-memory slots in pieces on a few threads
(``fabric.core.parallel_copy``): the cut on its own, and end to end on real processes whose
environment cuts every copy (``FABRIC_PARALLEL_COPY_BYTES=0``), so that uploads, reads, moves
and copies-out of every dtype and layout go through the pieces and come back byte
identical; no copying thread outlives its connection."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import fabric
from fabric.core.errors import ConfigError
from fabric.core.parallel_copy import (MIN_BYTES_ENV, PIECE_ALIGN, STREAMING_BYTES, THREADS_ENV,
                                       ParallelCopy, default_min_bytes, default_threads,
                                       piece_count, pieces)
from fabric.core.shm import SharedMemory

from conftest import HEARTBEAT
from test_shm_path import DTYPES, layouts_of, random_array

COPY_THREADS = 3  # (an odd count: pieces of unequal sizes)
EVERY_COPY_CUT = {THREADS_ENV: str(COPY_THREADS), MIN_BYTES_ENV: "0"}


def layouts(dtype: str):
    """The arrays of ``dtype`` a user uploads (``layouts_of`` one large enough to be cut into
    ``COPY_THREADS`` pieces of whole pages), one row, 0-d."""
    base = random_array(dtype, (256, 96))
    yield from layouts_of(base)
    yield base[:1]
    yield random_array(dtype, ())


def copying_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("fabric-copy")}


def threads_of(pid: int) -> int:
    """How many threads process ``pid`` runs."""
    return len(os.listdir(f"/proc/{pid}/task"))


# -- the cut, without processes --------------------------------------------------------

@pytest.mark.parametrize("count", [2, 3, 4])
def test_a_contiguous_copy_is_cut_into_page_aligned_pieces_that_cover_it_once(count):
    target, source = np.zeros(100_003), np.arange(100_003.0)
    cut = pieces(target, source, count)
    assert len(cut) == count
    starts = [piece.__array_interface__["data"][0] - target.__array_interface__["data"][0]
              for piece, _ in cut]
    assert all(start % PIECE_ALIGN == 0 for start in starts)
    assert sum(piece.size for piece, _ in cut) == target.size
    for piece, part in cut:
        np.copyto(piece, part)
    assert target.tobytes() == source.tobytes()


def test_a_copy_that_is_not_contiguous_is_cut_along_its_first_axis_or_not_at_all():
    source = np.asfortranarray(np.arange(60.0).reshape(5, 12))
    target = np.zeros((5, 12))
    assert [p.shape for p, _ in pieces(target, source, 2)] == [(3, 12), (2, 12)]
    assert len(pieces(target[:1], source[:1], 4)) == 1  # one row: nothing to cut
    assert len(pieces(np.zeros(()), np.ones(()), 4)) == 1  # 0-d
    assert len(pieces(np.zeros((4, 3)), np.ones(3), 4)) == 1  # a broadcast
    assert len(pieces(target, source, 1)) == 1


def test_a_copy_glibc_streams_is_cut_only_into_pieces_it_streams_too():
    assert piece_count(STREAMING_BYTES - 1, 4) == 4  # (the whole and its pieces: cached)
    assert piece_count(STREAMING_BYTES * 3 // 2, 4) == 1
    assert piece_count(STREAMING_BYTES * 2, 4) == 2
    assert piece_count(STREAMING_BYTES * 9, 4) == 4


def test_a_piece_no_thread_took_is_copied_by_the_caller_without_waiting():
    copies = ParallelCopy(2, 0)
    gate = threading.Event()
    try:
        target, source = np.zeros(300_000), np.arange(300_000.0)
        copies.copy(target, source)  # (its one thread started)
        busy = copies._pool.submit(gate.wait, 30)  # (and held)
        target[...] = 0
        copies.copy(target, source)
        assert target.tobytes() == source.tobytes() and not busy.done()
    finally:
        gate.set()
        copies.close()
    assert not copying_threads()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_layout_is_copied_byte_identical_in_pieces(dtype):
    copies = ParallelCopy(COPY_THREADS, 0)
    try:
        for array in layouts(dtype):
            native = array.dtype.newbyteorder("=")
            target = np.empty(array.shape, native)
            copies.copy(target, array)
            assert target.tobytes() == np.ascontiguousarray(array, native).tobytes()
        # Each but the one row (too few pages) and the 0-d array, in pieces:
        assert copies.cut == len(list(layouts(dtype))) - 2
        assert 1 <= len(copying_threads()) <= COPY_THREADS - 1
    finally:
        copies.close()
    assert not copying_threads()


def test_a_failing_piece_raises_once_every_piece_is_done_and_closing_joins_the_threads():
    copies = ParallelCopy(COPY_THREADS, 0)
    try:
        with pytest.raises(TypeError):  # float into int: no piece may cast it
            copies.copy(np.zeros(300_000, np.int64), np.ones(300_000))
        target = np.zeros(300_000)
        copies.copy(target, np.arange(300_000.0))  # the pool serves on
        assert (target == np.arange(300_000.0)).all() and copies.cut == 2
    finally:
        copies.close()
    assert not copying_threads()
    target = np.zeros(300_000)
    copies.copy(target, np.arange(300_000.0))  # started again after close, then closed
    copies.close()
    assert target[-1] == 299_999.0 and not copying_threads()


def test_small_and_overlapping_copies_are_one_copyto():
    copies = ParallelCopy(COPY_THREADS, 1 << 20)
    small = np.zeros(1000)
    copies.copy(small, np.ones(1000))
    values = np.arange(400_000.0)
    copies.copy(values[1:], values[:-1])  # overlapping: np.copyto's own answer
    assert small.sum() == 1000 and values[-1] == 399_998.0 and copies.cut == 0
    assert not copying_threads()


def test_the_settings_come_from_the_environment_and_bad_ones_say_what_to_do():
    assert default_threads({THREADS_ENV: "1"}) == 1
    assert 1 <= default_threads({}) <= min(4, len(os.sched_getaffinity(0)))
    assert default_min_bytes({MIN_BYTES_ENV: "0"}) == 0
    for bad in ("0", "two", "-3"):
        with pytest.raises(ConfigError, match=THREADS_ENV):
            default_threads({THREADS_ENV: bad})
    with pytest.raises(ConfigError, match=MIN_BYTES_ENV):
        default_min_bytes({MIN_BYTES_ENV: "-1"})
    for bad in (0, 2.5, "4"):
        with pytest.raises(ConfigError, match="copy_threads"):
            SharedMemory(copy_threads=bad)


# -- end to end -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cutting_cluster():
    """Two workers whose every copy through shared memory is cut (their environment is
    this process's)."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in EVERY_COPY_CUT.items():
            patch.setenv(name, value)
        with fabric.LocalCluster(workers=2, heartbeat=HEARTBEAT) as running:
            yield running


@pytest.fixture
def cut_here(monkeypatch):
    """This process's connections cut every copy too."""
    for name, value in EVERY_COPY_CUT.items():
        monkeypatch.setenv(name, value)


def connect(cluster, **options) -> fabric.Session:
    return fabric.connect(cluster.address, token=cluster.token,
                          shared_memory=SharedMemory(threshold=0, cross_memory=False), **options)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_and_layout_goes_up_down_and_across_in_pieces(cutting_cluster, cut_here,
                                                                  dtype):
    with connect(cutting_cluster) as session, session.open(1) as other:
        for array in layouts(dtype):
            native = array.dtype.newbyteorder("=")
            expected = np.ascontiguousarray(array, native).tobytes()
            tensor = session.asarray(array)
            back = tensor.numpy()  # (the worker writes it into this client's slot)
            assert back.dtype == native and back.shape == array.shape
            assert back.tobytes() == expected and back.flags.writeable
            moved = tensor.to(other)  # (worker 0 writes it into worker 1's slot)
            assert moved.numpy().tobytes() == expected
        copies = session.connection.segments.copies
        assert session.shares_memory is True and session.stats()["bytes_uploaded_by_socket"] == 0
        assert copies.threads == COPY_THREADS and copies.cut == len(list(layouts(dtype))) - 2
    assert not copying_threads()  # (the connection's ended with it)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("option, threads", [((), range(1, COPY_THREADS)),
                                             (("--copy-threads", "1"), range(0, 1))],
                         ids=["environment", "--copy-threads 1"])
def test_an_upload_the_worker_copies_out_of_the_clients_slot_is_cut_too(cut_here, option,
                                                                         threads):
    # (the worker's copying threads: as its environment says, or its option, which wins;
    # its environment is this process's, which cuts every copy)
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--shared-memory-limit", "0", *option)) as copying, \
            connect(copying) as session:
        worker = copying.workers[0].pid
        session.sync()
        before = threads_of(worker)
        for dtype in ("bool", "int16", "float64", "complex128"):
            for array in layouts(dtype):
                native = array.dtype.newbyteorder("=")
                tensor = session.asarray(array)  # (into this client's slot: copied out)
                assert tensor.numpy().tobytes() == \
                    np.ascontiguousarray(array, native).tobytes()
        assert session.connection.segments.copies.cut >= 4 * 4
        # The worker cut its copies: its copying threads started (one per piece but its
        # own, at most; a thread that is idle again takes the next piece); or, with one
        # thread, copied on its own.
        assert threads_of(worker) - before in threads
    assert not copying_threads()


@pytest.mark.timeout(60)
def test_one_copy_thread_copies_as_before(cutting_cluster, cut_here):
    with fabric.connect(cutting_cluster.address, token=cutting_cluster.token,
                        shared_memory=SharedMemory(threshold=0, copy_threads=1)) as session:
        a = np.random.default_rng(3).random((512, 64))
        np.testing.assert_array_equal(session.asarray(a).numpy(), a)
        assert session.connection.segments.copies.cut == 0 and not copying_threads()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("option, environment, says", [
    (("--copy-threads", "0"), {}, "'--copy-threads': 0 is not in the range"),
    ((), {THREADS_ENV: "two"}, f"{THREADS_ENV}='two' is not a whole number of at least 1"),
    ((), {MIN_BYTES_ENV: "-1"}, f"{MIN_BYTES_ENV}='-1' is not a whole number of at least 0"),
])
def test_a_worker_refuses_bad_copy_settings_as_a_usage_error(option, environment, says):
    done = subprocess.run(
        [sys.executable, "-m", "fabric", "worker", "--broker", "tcp://127.0.0.1:9",
         "--worker-token", "t", *option], env={**os.environ, **environment},
        capture_output=True, text=True, timeout=45)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
