"""Reading and writing another process's memory in one copy: cross-memory attach
(``process_vm_readv`` and ``process_vm_writev``, Linux 3.2), as Open MPI's and MPICH's
shared-memory transports move large messages.

Why: a first upload of a size has no warm slot of shared memory to go through, and a new
segment (``tmpfs``, in 4 KiB pages: ``shmem_enabled`` is ``never`` by default) faulted in at
1.4 GB/s here before the copy into it. A worker reading the client's array straight into new
memory of its own, on two threads, ran 3.5-3.9 GB/s here in 4 KiB pages, and 10-11 GB/s in
huge pages still the guest's. A first read of a size is written the same way into new memory
of the client's (``write``); later ones take the client's slots, which are reused warm,
where new memory would be faulted in each time. The kernel lets a process reach another's
memory only where it may ptrace it (the same user, or ``CAP_SYS_PTRACE``; Yama's
``ptrace_scope`` may forbid even that): ``workers.shared_memory`` tries it once per session,
and reaches only the process its client proved to be.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import glob
import math
import mmap
import os
import threading
from typing import Any

import numpy as np

from fabric.core.parallel_copy import ParallelCopy
from fabric.core.shm import LIBC, libc_error, populate


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


for _call in (LIBC.process_vm_readv, LIBC.process_vm_writev):
    _call.argtypes = (ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                      ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong)
    _call.restype = ctypes.c_ssize_t


class _MallInfo2(ctypes.Structure):  # (glibc's struct mallinfo2, 2.33+)
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_LIBC_MALLINFO = getattr(LIBC, "mallinfo2", None)  # (None: another C library)
if _LIBC_MALLINFO is not None:
    _LIBC_MALLINFO.restype = _MallInfo2
    _LIBC_MALLINFO.argtypes = ()
HEAP_SLACK = 1 << 20  # of the heap's top left over when an array is taken from it
HUGE_PAGE = 2 << 20  # pieces start on whole huge pages of the local side
FAULT_IN_BYTES = 4 << 20  # a read faults in this much of its memory, then copies into it
BALLOON_FEATURES = "/sys/bus/virtio/drivers/virtio_balloon/*/features"
REPORTING_ORDER = "/sys/module/page_reporting/parameters/page_reporting_order"
BUDDY_INFO = "/proc/buddyinfo"
PAGEBLOCK_ORDER = 9  # the default page_reporting_order: 2 MiB blocks of 4 KiB pages
_REPORTING_BIT = 5  # VIRTIO_BALLOON_F_REPORTING: the guest tells its host of free pages
_PROT_NONE, _MAP_FIXED, _MAP_NORESERVE = 0, 0x10, 0x4000


def read(pid: int, address: int, into: np.ndarray, copies: ParallelCopy | None = None) \
        -> None:
    """Fill ``into`` (C-contiguous, writable) with the bytes of process ``pid`` at
    ``address``, in pieces on ``copies``' threads where it is large enough (faulting in the
    pages of ``into`` is most of the work, and it takes every core it is given). OSError
    where they cannot be read: ``EPERM`` (no right to ptrace it), ``ESRCH`` (gone),
    ``EFAULT`` (not all of them mapped there)."""
    if not into.flags.c_contiguous or not into.flags.writeable:
        raise ValueError("cross_memory.read fills a C-contiguous, writable array")
    _in_pieces(_read_faulted_in, pid, into, address, copies)


def write(pid: int, address: int, data: np.ndarray, copies: ParallelCopy | None = None) \
        -> None:
    """Write ``data`` (C-contiguous) into process ``pid``'s memory at ``address``, as
    ``read`` does (OSError as it raises it)."""
    if not data.flags.c_contiguous:
        raise ValueError("cross_memory.write writes a C-contiguous array")
    _in_pieces(_write, pid, data, address, copies)


def _in_pieces(copy: Any, pid: int, local: np.ndarray, address: int,
               copies: ParallelCopy | None) -> None:
    flat = local.reshape(-1).view(np.uint8)
    if copies is None:
        copy(pid, flat, address)
        return
    copies.each(copy, [(pid, flat[start:start + length], address + start)
                       for start, length in copies.spans(local.nbytes, HUGE_PAGE)])


def _read_faulted_in(pid: int, local: np.ndarray, address: int) -> None:
    """Read into ``local`` ``FAULT_IN_BYTES`` at a time, each faulted in first
    (``fabric.core.shm.populate``; before Linux 5.14, the copy faults them in): 256 MiB into
    new memory on two threads ran 4.3-4.9 GB/s so, 3.3 GB/s faulted in by the copy."""
    for start in range(0, local.nbytes, FAULT_IN_BYTES):
        piece = local[start:start + FAULT_IN_BYTES]
        with contextlib.suppress(OSError):
            populate(piece.ctypes.data, piece.nbytes)
        _copy(LIBC.process_vm_readv, pid, piece, address + start)


def _write(pid: int, local: np.ndarray, address: int) -> None:
    _copy(LIBC.process_vm_writev, pid, local, address)


def _copy(call: Any, pid: int, local: np.ndarray, address: int) -> None:
    start, nbytes, done = local.ctypes.data, local.nbytes, 0
    while done < nbytes:  # (the kernel may copy fewer than asked: at most 2 GiB a call)
        here = _IoVec(start + done, nbytes - done)
        there = _IoVec(address + done, nbytes - done)
        got = call(pid, ctypes.byref(here), 1, ctypes.byref(there), 1, 0)
        if got < 0:
            raise libc_error()
        if got == 0:
            raise OSError(errno.EFAULT, os.strerror(errno.EFAULT))
        done += got


def new_memory(nbytes: int) -> mmap.mmap:
    """Memory of this process's own, for another to write into (``write``) or to read into
    (``read``): anonymous, in huge pages where they pay (``huge_pages_pay``), else in 4 KiB
    pages (``MADV_NOHUGEPAGE``)."""
    memory = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):  # (a kernel without transparent huge pages)
        memory.madvise(mmap.MADV_HUGEPAGE if huge_pages_pay() else mmap.MADV_NOHUGEPAGE)
    return memory


class WarmMemory:
    """``new_memory`` of ``size`` bytes, mapped now, its pages faulted in ahead of the read
    that will take it (``allocate``, on a pool's maker thread: ``SegmentPool.warm_ahead``).
    A worker writes 8 MiB into it in about 1 ms, where it faults new memory in at 2-3 GB/s.
    It may be taken while still being faulted in (``stopped`` then: the writer's faults do
    the rest, where two faulting threads would only contend). ``after``: seconds to wait
    before the first fault, so that it takes no core from a transfer that follows at once."""

    def __init__(self, size: int, after: float = 0.0) -> None:
        self.size = size
        self.after = after
        self.memory = new_memory(size)  # (held until the maker is done with it)
        self._stop = threading.Event()  # (set: ``stopped``)

    @property
    def stopped(self) -> bool:
        """Whether it was taken, or its pool closes (``stop``)."""
        return self._stop.is_set()

    def stop(self) -> None:
        """It was taken, or its pool closes: ``allocate`` ends at once if it has not begun
        faulting in, else at its next piece."""
        self._stop.set()

    def allocate(self) -> None:
        """Fault every page in, ``FAULT_IN_BYTES`` at a time (on a maker at the lowest
        priority: ``SegmentPool.warm_ahead``), until ``stopped``; OSError where no memory is
        left."""
        self._stop.wait(self.after)  # (taken meanwhile: the maker's next job need not wait)
        start = address(self.memory)
        for offset in range(0, self.size, FAULT_IN_BYTES):
            if self.stopped:
                raise OSError(errno.ECANCELED, "taken, or its pool closed")
            populate(start + offset, min(FAULT_IN_BYTES, self.size - offset))

    def close(self) -> None:
        """Unmap it (not taken: no array is over it)."""
        self.memory.close()


def new_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` over ``new_memory`` (which it keeps)."""
    count = math.prod(shape)
    return np.frombuffer(new_memory(count * dtype.itemsize), dtype, count).reshape(shape)


def array_to_read_into(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of ``shape`` and ``dtype`` for a transfer to be read into: in memory this
    process's heap kept from arrays freed before, whose pages are faulted in already, where
    the heap's top holds it (a fabric broker or worker keeps freed memory:
    ``fabric.launch.local.bulk_malloc_tunables``; 8 MiB filled in 0.44 ms there, 1.5 ms in
    new memory); else ``new_array``."""
    nbytes = math.prod(shape) * dtype.itemsize
    if _LIBC_MALLINFO is not None:
        before = _LIBC_MALLINFO()
        if before.keepcost >= nbytes + HEAP_SLACK:
            array = np.empty(shape, dtype)
            if _LIBC_MALLINFO().hblks == before.hblks:  # (not mapped afresh by malloc)
                return array
    return new_array(shape, dtype)


def heap_free() -> int | None:
    """The bytes free in this process's heap (glibc's ``mallinfo2``: what freed arrays left,
    held for the next); None in another C library."""
    return None if _LIBC_MALLINFO is None else _LIBC_MALLINFO().fordblks


def keep_in_heap(nbytes: int) -> None:
    """Fault in ``nbytes`` of this process's heap and free them: a process whose heap keeps
    freed memory (``array_to_read_into``) then has that much ready for its first transfers
    (elsewhere they go back to the kernel)."""
    np.empty(nbytes, np.uint8).fill(0)


@functools.cache
def huge_pages_pay() -> bool:
    """Whether new memory is faster to fault in as huge pages: not where this kernel runs
    in a virtual machine whose balloon hands freed memory back to its host
    (``freed_memory_reported``): each huge page freed goes back to the host, and its next
    first touch faults there too (about 0.45 GB/s on the machine measured, beside 6 GB/s for
    a huge page still the guest's, and 2 GB/s for 4 KiB pages, most of which stay in the
    guest: those of a 2 MiB block freed whole and reported go back too; later runs there
    found either size handed back once a process holds a few GiB: ``docs/operations.md``)."""
    return freed_memory_reported() is None


@functools.cache
def freed_memory_reported() -> int | None:
    """The order (blocks of 2**order pages) from which this VM's balloon hands free memory
    back to its host, whose next first touch then faults in at the host's rate
    (``reported_order`` of this machine's settings); None where freed memory stays here."""
    return reported_order(glob.glob(BALLOON_FEATURES), REPORTING_ORDER, BUDDY_INFO)


def freed_memory_note() -> str | None:
    """What ``freed_memory_reported`` means for first transfers, in a sentence (a worker logs
    it at start; ``bench/first_transfer.py`` prints it); None where freed memory stays here."""
    order = freed_memory_reported()
    if order is None:
        return None
    return (f"this VM hands free blocks of {mmap.PAGESIZE << order >> 10} KiB and more back "
            f"to its host (page_reporting_order {order}): a first transfer of a large array "
            "may fault its new memory in at the host's rate (docs/operations.md says how to "
            "keep freed memory here)")


def reported_order(feature_files: list[str], order_file: str, buddy_file: str) -> int | None:
    """The smallest free block, as an order of pages, that a balloon of ``feature_files``
    (``host_takes_free_pages``) hands back to its host: ``order_file``'s setting
    (``page_reporting_order``; the kernel's default where it cannot be read). None where no
    balloon reports free pages, or the setting is past the largest block the guest keeps
    free lists of (``buddy_file``, as ``/proc/buddyinfo``: a column per order), which
    reports nothing: an operator's way to keep freed memory in the guest."""
    if not host_takes_free_pages(feature_files):
        return None
    try:
        with open(order_file) as setting:
            order = int(setting.read())
    except (OSError, ValueError):
        return PAGEBLOCK_ORDER
    try:
        with open(buddy_file) as buddies:
            orders = len(buddies.readline().split()) - 4  # (after "Node 0, zone DMA")
    except OSError:
        return order
    return None if 0 < orders <= order else order


def host_takes_free_pages(feature_files: list[str]) -> bool:
    """Whether any of ``feature_files`` (virtio balloons' feature bits, as ``0`` and ``1``
    by bit number) offers free page reporting (``VIRTIO_BALLOON_F_REPORTING``)."""
    for path in feature_files:
        try:
            with open(path) as features:
                bits = features.read().strip()
        except OSError:
            continue
        if len(bits) > _REPORTING_BIT and bits[_REPORTING_BIT] == "1":
            return True
    return False


def address(memory: mmap.mmap) -> int:
    """Where ``memory`` lies in this process."""
    return np.frombuffer(memory, np.uint8).ctypes.data


def retire(memory: mmap.mmap) -> None:
    """``memory`` (``new_memory``) will not be read, but a writer may still come: its pages go
    back to the kernel now, and its addresses stay reserved, unusable (a late write fails
    with ``EFAULT`` rather than landing in memory used since), for as long as ``memory`` is
    referenced: hold it (it costs addresses, no memory)."""
    start = address(memory)
    if LIBC.mmap(start, len(memory), _PROT_NONE,
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED | _MAP_NORESERVE,
                  -1, 0) != start:
        raise OSError(ctypes.get_errno(), "could not retire a cross-memory target")
