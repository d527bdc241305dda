"""Shared memory on one host, for the bulk data path: segment names and the segments
themselves (their pools are ``fabric.core.segment_pool``'s).

Rule: a segment is a sealed memfd (``memfd_create``) named ``fabric-<boot>-<pid>-<n>``
(``segment_name``): the first 8 hex digits of the kernel's boot id, the pid of the process
that created it and owns it, and a counter. A peer maps it through the owner's
``/proc/<pid>/fd`` (``held_segments``: only a process of the same user may), and only once
it found the segment sealed against shrinking: a mapping of shared memory that someone
shrinks raises SIGBUS in whoever touches the lost pages, so an unsealed segment would let a
client kill its worker. Where a peer cannot trust the owner (a worker mapping a client's
segment), it also checks the segment's size against what the transfer needs, and that its
owner allocated it in full, before it maps it; mapping faults nothing in, and a transfer
faults in only its own slot's pages (``PeerSegments.map``). A memfd lives as long as a
descriptor or a mapping of it: nothing is ever left in ``/dev/shm``, and a process killed
with SIGKILL leaves only its peers' mappings, which they drop with its session or once they
see it gone (``PeerSegments``).

Each pool (``segment_pool.SegmentPool``) is its owner's alone. A device's pool lends its slots to
uploads and moves into the device: the client (or the sending worker) writes the array
there, and the tensor it becomes keeps the slot until it is collected (no second copy); the
pool's bound is the device's ``--shared-memory-limit``, and a segment lent to a client
process is lent again to that process alone (``acquire``'s ``key``), its pages given back as
the pool closes it, whoever maps it still: a client keeps its mappings, which must never show
another's data nor keep memory no one counts. A client's pool lends its slots to reads,
which the worker writes into and whose array keeps the slot until collected (a fresh large
array would cost more in page faults than the copy itself), and to uploads a full device
pool turned away, which the worker copies out (and ``MemoryBudget`` counts). A device's pool
faults a new segment in on a thread of its own (``fabric.core.segment_maker``), so that the
device's ops never wait for it. Names are plain functions; the only system calls are in
``Segment`` and ``held_segments``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import itertools
import mmap
import os
import re
import weakref
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from fabric.core.errors import ConfigError, ProtocolError
from fabric.core.parallel_copy import ParallelCopy

THRESHOLD_BYTES = 1 << 20  # arrays at least this large travel through shared memory
DEFAULT_POOL_BYTES = 2 << 30  # the most shared memory one client connection holds
IDLE_SECONDS = 30.0  # a segment unused this long is closed (the pool shrinks)
START_SLOT_BYTES = 16 << 20  # lent ahead of a connection's first upload (a start slot)
SEGMENT_ALIGN = 2 << 20  # segments come in multiples of a huge page
MAX_PINS = 1024  # arrays read from device slots one session may hold (``workers.pins``)
# A pid has at most 7 digits (Linux caps pid_max at 2**22) and a segment number at most 19:
# a name a peer sends is matched within those bounds, so that no digit string past what
# int() takes (4,300 digits) is ever converted (finding 10 of issue 41).
_NAME = re.compile(r"fabric-([0-9a-f]{8})-([0-9]{1,7})-([0-9]{1,19})\Z")
POPULATE_PIECE = 8 << 20  # bytes a segment made is faulted in at a time (``allocate``)
_MADV_POPULATE_READ, _MADV_POPULATE_WRITE = 22, 23  # Linux 5.14: fault every page in now
_SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL  # for ever
# Segment numbers (``next_name``). (next() on a count is atomic: threads share it.)
_NUMBERS = itertools.count()
_MEMFD_LINK = re.compile(r"/memfd:(fabric-[0-9a-f]{8}-[0-9]{1,7}-[0-9]{1,19}) \(deleted\)\Z")
# The C library, called through ctypes, which lets the GIL go for the call: Python's
# mmap.madvise holds it, and faulting a large segment in takes seconds on a loaded core,
# during which no other thread of the process (a worker's control thread) could run. Its
# memory calls are declared here (``fabric.core.cross_memory`` adds its cross-process copies).
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
LIBC.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long)
LIBC.mmap.restype = ctypes.c_void_p
LIBC.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


def libc_error() -> OSError:
    """The error of the C library call that just failed (its ``errno``)."""
    code = ctypes.get_errno()
    return OSError(code, os.strerror(code))


def populate(address: int, nbytes: int, advice: int = _MADV_POPULATE_WRITE) -> None:
    """Fault in, for writing, every page of this process's memory that the ``nbytes`` bytes at
    ``address`` touch, in one call, without holding the GIL (``MADV_POPULATE_WRITE``: their
    contents stay as they are; ``advice`` ``MADV_POPULATE_READ``: for reading, which breaks
    no copy on write); OSError where the kernel refuses (before Linux 5.14)."""
    start = address - address % mmap.PAGESIZE
    if LIBC.madvise(start, address + nbytes - start, advice):
        raise libc_error()


def map_in(address: int, nbytes: int) -> None:
    """Map the pages of shared memory that the ``nbytes`` bytes at ``address`` touch, which
    exist already (a peer's segment, which its owner allocated), into this process's page
    tables now (``populate``'s ``MADV_POPULATE_READ``: a shared mapping of shared memory
    keeps no dirty-page count, so they are mapped writable). Twice as fast as for writing,
    and a copy into them runs as fast after either: 16 MiB took 1.7-1.8 ms against 3.7-3.9,
    and an 8 MiB copy into them then 0.80 ms against 0.82 (medians of 8, fresh segments)."""
    populate(address, nbytes, _MADV_POPULATE_READ)


def fits(slot_bytes: int, nbytes: int) -> bool:
    """Whether a slot (or segment) of ``slot_bytes`` bytes is one to use for ``nbytes``: large
    enough, and at most twice as large (twice a huge page for a smaller array), so that small
    arrays do not tie up large slots."""
    return nbytes <= slot_bytes <= 2 * max(nbytes, SEGMENT_ALIGN)


def map_private(fd: int, offset: int, nbytes: int) -> np.ndarray:
    """``nbytes`` bytes of the shared memory open as ``fd`` at ``offset``, mapped copy on
    write (``MAP_PRIVATE``): a writable array of this process's own, whose pages stay the
    segment's until written (so the segment must not change while it lives: a device's
    pinned slot), mapped into the page tables now (``MADV_POPULATE_READ``, which breaks no
    copy on write: reading it then faults nothing). The mapping keeps no descriptor (close
    ``fd``), and goes once the array and every array made from it are collected. OSError
    where it cannot be mapped."""
    if not nbytes:  # (no mapping is empty)
        return np.empty(0, np.uint8)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    length = offset + nbytes - start
    address = LIBC.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE,
                        fd, start)
    if address in (None, _MAP_FAILED):
        raise libc_error()
    memory = (ctypes.c_char * length).from_address(address)
    weakref.finalize(memory, LIBC.munmap, address, length)
    values = np.frombuffer(memory, np.uint8, nbytes, offset - start)
    try:
        populate(values.ctypes.data, nbytes, _MADV_POPULATE_READ)
    except OSError:  # (before Linux 5.14: faulted in as it is read)
        pass
    return values


@dataclass(frozen=True)
class SharedMemory:
    """How a client uses shared memory with workers on its host (``fabric.connect``'s
    ``shared_memory=``): arrays of at least ``threshold`` bytes travel through it, in
    segments of at most ``limit`` bytes in all, closed after ``idle_seconds`` unused; the
    client copies an upload of 8 MiB or more into its slot with ``copy_threads`` threads at
    once (None: ``FABRIC_COPY_THREADS``, else the cores it may use, at most 4; 1: one
    ``np.copyto``, ``fabric.core.parallel_copy``). With ``cross_memory`` (the default), where
    no slot that fits is ready, the worker reads an upload straight out of the client's
    array, and writes a first read of a size straight into new memory of the client's,
    where the kernel lets it (it may ptrace the client: the same user), so a first transfer
    faults in no slot (``fabric.core.cross_memory``); False: every transfer takes a slot.
    ``start_slot``: the bytes of a slot the first session asks its device to lend ahead as it
    opens, mapped and faulted in here on the pool's thread, for its first upload that fits
    it (half as many bytes to as many) to be written into (one copy, no wait:
    ``fabric.transport.slots_ahead``); 0: none."""

    threshold: int = THRESHOLD_BYTES
    limit: int = DEFAULT_POOL_BYTES
    idle_seconds: float = IDLE_SECONDS
    copy_threads: int | None = None
    cross_memory: bool = True
    start_slot: int = START_SLOT_BYTES

    def __post_init__(self) -> None:
        if self.copy_threads is not None and (type(self.copy_threads) is not int
                                              or self.copy_threads < 1):
            raise ConfigError(f"SharedMemory(copy_threads={self.copy_threads!r}): give a "
                              "whole number of threads of at least 1, or None for the default.")
        if type(self.start_slot) is not int or self.start_slot < 0:
            raise ConfigError(f"SharedMemory(start_slot={self.start_slot!r}): give a whole "
                              "number of bytes of at least 0 (0: no slot ahead at the start).")


def boot_id() -> str:
    """The first 8 hex digits of this kernel's boot id ("" where there is none): two
    processes that share it share a kernel, which is where shared memory can be shared."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip().replace("-", "")[:8]
    except OSError:
        return ""


class SegmentName(NamedTuple):
    """What a segment's name says: the boot it was made in, its owner's pid, its number."""

    boot: str
    pid: int
    number: int


def segment_name(boot: str, pid: int, number: int) -> str:
    """The name of segment ``number`` of process ``pid`` in boot ``boot``."""
    return f"fabric-{boot}-{pid}-{number}"


def next_name(boot: str, pid: int) -> str:
    """The name of process ``pid``'s next segment in boot ``boot`` (one count for the whole
    process: a worker's devices each have a pool, and a peer finds a segment by its name
    alone)."""
    return segment_name(boot, pid, next(_NUMBERS))


def parse_name(name: Any) -> SegmentName | None:
    """What ``name`` says, or None when it is not a fabric segment's name."""
    match = _NAME.match(name) if type(name) is str else None
    return None if match is None else SegmentName(match[1], int(match[2]), int(match[3]))


def held_segments(pid: int) -> dict[str, str]:
    """The fabric segments process ``pid`` holds open (its own, and those it maps: an mmap
    keeps a descriptor): name -> a path that opens it (``/proc/<pid>/fd/<n>``). OSError
    where that process is gone or not this user's."""
    folder = f"/proc/{pid}/fd"
    held = {}
    for fd in os.listdir(folder):
        try:
            match = _MEMFD_LINK.match(os.readlink(f"{folder}/{fd}"))
        except OSError:  # closed meanwhile
            continue
        if match is not None:
            held[match[1]] = f"{folder}/{fd}"
    return held


def _sealed(fd: int) -> bool:
    """Whether the file open as ``fd`` is shared memory that can never shrink (a peer's
    mapping of one that could would die of SIGBUS)."""
    try:
        return bool(fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK)
    except OSError:  # not shared memory at all
        return False


class UnsealedSegment(OSError):
    """A segment its owner could shrink under a peer's mapping (which would kill the peer
    with SIGBUS), so it is not mapped."""


class WrongSizeSegment(OSError):
    """A segment not of the size its transfer needs, or not allocated in full by its owner
    (a sparse one: whoever touches its holes allocates them), so it is not mapped."""


class Segment:
    """One shared-memory segment, mapped: made by its owner (``create``, which keeps its
    descriptor open for peers to open it by) or mapped by a peer (``open``); ``memory`` is
    its bytes as a numpy array."""

    def __init__(self, name: str, fd: int, owned: bool) -> None:
        self.name = name
        self.fd: int | None = fd if owned else None
        try:
            self.size = os.fstat(fd).st_size
            self.map = mmap.mmap(fd, self.size) if self.size else None
        except BaseException:
            os.close(fd)
            raise
        if not owned:
            os.close(fd)  # (the mapping keeps the memory)
        self.memory = (np.frombuffer(self.map, np.uint8) if self.map is not None
                       else np.empty(0, np.uint8))

    @classmethod
    def create(cls, name: str, size: int) -> "Segment":
        """A new segment of ``size`` bytes, sealed at that size, its pages allocated and
        faulted in now (``sealed``, then ``allocate``)."""
        segment = cls.sealed(name, size)
        try:
            segment.allocate()
        except BaseException:
            segment.close()
            raise
        return segment

    @classmethod
    def sealed(cls, name: str, size: int) -> "Segment":
        """A new segment of ``size`` bytes, sealed at that size and mapped, none of its pages
        allocated yet (``allocate``: until then no peer is told its name, since a peer
        refuses a segment not allocated in full)."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:  # (F_SEAL_GROW still lets ``allocate`` allocate within the size)
            os.ftruncate(fd, size)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SIZE_SEALS)
        except BaseException:
            os.close(fd)
            raise
        return cls(name, fd, owned=True)

    def allocate(self, copies: ParallelCopy | None = None) -> None:
        """Allocate every page now (no memory left fails here, never as a SIGBUS on a
        write) and fault them in (a write into fresh shared memory runs at a tenth of a
        write into warm pages); huge pages where the kernel gives them to shared memory
        (``MADV_HUGEPAGE``, which takes effect where
        /sys/kernel/mm/transparent_hugepage/shmem_enabled is ``advise``, ``within_size``
        or ``always``; elsewhere 4 KiB pages). With ``copies``, in pieces on its threads
        (the kernel allocates and zeroes pages on every core it is given: a client's pool
        making a segment on the caller's thread). OSError where no memory is left."""
        if self.map is None:
            return
        try:  # (cheap to ask)
            self.map.madvise(mmap.MADV_HUGEPAGE)
        except OSError:
            pass
        if copies is None:
            self._allocate(0, self.size)
        else:
            copies.each(self._allocate, copies.spans(self.size, SEGMENT_ALIGN))

    def _allocate(self, offset: int, nbytes: int) -> None:
        try:  # (a populate allocates as it faults, ENOMEM where no memory is left; in pieces:
            # it holds the process's memory map lock, which an mmap in another thread,
            # mapping a peer's segment for a transfer, waits for; no fallocate first: it
            # holds the file's lock, and pieces on several threads took turns)
            for start in range(offset, offset + nbytes, POPULATE_PIECE):
                self.populate(start, min(POPULATE_PIECE, offset + nbytes - start))
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            os.posix_fallocate(self.fd, offset, nbytes)  # an older kernel: allocate, then
            self.memory[offset:offset + nbytes:mmap.PAGESIZE] = 0  # touch every page

    def populate(self, offset: int = 0, nbytes: int | None = None,
                 allocated: bool = False) -> None:
        """Fault the pages of ``nbytes`` bytes at ``offset`` (by default all of it) into this
        process's page tables now, in one call, without holding the GIL; where they are
        ``allocated`` already (a peer's segment), only mapped (``map_in``). OSError where the
        kernel refuses (before Linux 5.14)."""
        end = self.size if nbytes is None else min(offset + nbytes, self.size)
        if self.map is not None and end > offset:
            (map_in if allocated else populate)(self.memory.ctypes.data + offset, end - offset)

    @classmethod
    def open(cls, name: str, path: str, sizes: tuple[int, int] | None = None) -> "Segment":
        """Map another process's segment ``name``, opened at ``path`` (``held_segments``):
        UnsealedSegment unless it can never shrink; with ``sizes`` (least, most),
        WrongSizeSegment, before it is mapped, unless its size is within them and its owner
        allocated all of it; OSError if it is gone. Nothing is faulted in (``populate``)."""
        fd = os.open(path, os.O_RDWR)
        try:
            if not _sealed(fd):
                raise UnsealedSegment(f"{name} is not sealed against shrinking")
            if sizes is not None:
                found = os.fstat(fd)
                if not sizes[0] <= found.st_size <= sizes[1] \
                        or found.st_blocks * 512 < found.st_size:
                    raise WrongSizeSegment(
                        f"{name} is {found.st_size} bytes ({found.st_blocks * 512} of them "
                        f"allocated), where {sizes[0]} to {sizes[1]} bytes, all allocated, "
                        "were needed")
        except BaseException:
            os.close(fd)
            raise
        return cls(name, fd, owned=False)

    def empty(self) -> None:
        """Give its pages back to the system now, whoever maps it (a peer's mapping reads
        zeros after, each page it touches its own): a segment's memory is charged to the
        process that made it, and a peer's old mapping must not keep it, uncounted."""
        if self.map is not None:
            try:
                self.map.madvise(mmap.MADV_REMOVE)
            except (OSError, ValueError):  # (closed meanwhile: its pages went with it)
                pass

    def close(self) -> None:
        """No peer can open it any more; unmapped, unless arrays over the memory still live
        (they keep it until collected)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.memory = np.empty(0, np.uint8)
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:
                pass


class PeerSegments:
    """The segments of one peer process (``pid``) that this process maps, by name: each is
    mapped once (mapping afresh would fault every page in again) and dropped once the peer
    closed it. ``map`` raises ProtocolError for one it cannot map, saying why.

    ``proved``, where the peer is not trusted (a worker's client): whether ``pid`` is still
    the process that proved itself (a pid is reused once its process ends), asked after
    each segment is opened; and each segment is checked against its first transfer before
    it is mapped (``Segment.open``'s ``sizes``)."""

    def __init__(self, pid: int, proved: Callable[[], bool] | None = None) -> None:
        self.pid = pid
        self.proved = proved
        self.maps: dict[str, Segment] = {}

    def map(self, name: str, offset: int = 0, nbytes: int | None = None,
            populate: bool = True) -> Segment:
        """Segment ``name`` of the peer, mapped, for a transfer of ``nbytes`` bytes at
        ``offset`` (None: no transfer yet), whose pages a new mapping faults in (unless not
        ``populate``: the caller has them faulted in elsewhere)."""
        segment = self.maps.get(name)
        if segment is None:
            segment = self._open(name, None if nbytes is None else offset + nbytes)
            if self.proved is not None and not self.proved():
                segment.close()
                raise ProtocolError(f"The process that owns shared-memory segment {name} "
                                    "is not the one that agreed to shared memory (it "
                                    "ended): open a new session.")
            self.maps[name] = segment
            if nbytes is not None and populate:
                try:  # (a first transfer through a fresh mapping ran at 2.4 GB/s here, 2.8
                    segment.populate(offset, nbytes, allocated=True)  # with its pages mapped)
                except OSError:  # an older kernel: faulted in as they are used
                    pass
        return segment

    def private(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        """``nbytes`` bytes at ``offset`` of the peer's segment ``name``, mapped anew copy on
        write (``map_private``), not kept here (``map``'s mapping is neither made nor used);
        ProtocolError where it cannot be, saying why."""
        path = self._path(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise ProtocolError(f"Shared-memory segment {name} cannot be opened here: "
                                f"{exc.strerror}.") from None
        try:  # (the descriptor that ``path`` names may have been closed, and its number reused)
            link = _MEMFD_LINK.match(os.readlink(f"/proc/self/fd/{fd}"))
            if link is None or link[1] != name:
                raise ProtocolError(f"Shared-memory segment {name} was closed by its owner.")
            if not _sealed(fd) or offset + nbytes > os.fstat(fd).st_size:
                raise ProtocolError(f"Shared-memory segment {name} is not sealed against "
                                    f"shrinking, or has no {nbytes} bytes at {offset}.")
            return map_private(fd, offset, nbytes)
        except OSError as exc:
            raise ProtocolError(f"Shared-memory segment {name} cannot be mapped here: "
                                f"{exc.strerror}.") from None
        finally:
            os.close(fd)

    def _path(self, name: str) -> str:
        """A path that opens the peer's segment ``name`` (``held_segments``; the segments it
        closed are unmapped here); ProtocolError where it holds none of that name."""
        try:
            held = held_segments(self.pid)
        except OSError:
            raise ProtocolError(f"The process that owns shared-memory segment {name} is "
                                "gone, or not this user's.") from None
        self.prune(held)
        if name not in held:
            raise ProtocolError(f"Shared-memory segment {name} does not exist: its owner "
                                "closed it before it was used.")
        return held[name]

    def _open(self, name: str, need: int | None) -> Segment:
        path = self._path(name)
        sizes = None if self.proved is None or need is None \
            else (need, 2 * max(need, SEGMENT_ALIGN))
        try:
            return Segment.open(name, path, sizes)
        except UnsealedSegment:
            raise ProtocolError(f"Shared-memory segment {name} is not sealed against "
                                "shrinking (F_SEAL_SHRINK): make segments with fabric's "
                                "SegmentPool, which seals them.") from None
        except WrongSizeSegment as exc:
            raise ProtocolError(f"Shared-memory segment {exc}: make segments with fabric's "
                                "SegmentPool, which allocates them at the size of what "
                                "travels through them (at most twice as large).") from None
        except OSError as exc:
            raise ProtocolError(f"Shared-memory segment {name} cannot be mapped here: "
                                f"{exc.strerror}.") from None

    def prune(self, held: dict[str, str] | None = None) -> None:
        """Unmap the segments the peer closed (``held``: what it holds, if known): a pool
        closes idle segments, whose names never come back, and a mapping here would keep
        their memory from going back to the system."""
        if held is None:
            try:
                held = held_segments(self.pid)
            except OSError:  # gone: it holds nothing
                held = {}
        for gone in self.maps.keys() - held.keys():
            self.maps.pop(gone).close()

    def close(self) -> None:
        """Unmap every segment."""
        for segment in self.maps.values():
            segment.close()
        self.maps.clear()
