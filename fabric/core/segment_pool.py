"""The pools of reused, pre-faulted shared-memory segments (``fabric.core.shm``) that large
arrays travel through, and the slots they lend.

Rule: each pool (``SegmentPool``) is its owner's alone, used by one thread; what other threads
hand it (a slot given back by an array's finalizer, a segment its maker thread made ahead) waits
in a queue it takes in at its next look (``SegmentPool.reclaim``). See ``fabric.core.shm`` for
what device and client pools lend, and to whom.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections import deque
from typing import Any, Callable, NamedTuple

import numpy as np

from fabric.core.cross_memory import WarmMemory
from fabric.core.parallel_copy import ParallelCopy
from fabric.core.segment_maker import SegmentMaker
from fabric.core.shm import (DEFAULT_POOL_BYTES, IDLE_SECONDS, POPULATE_PIECE, SEGMENT_ALIGN,
                             PeerSegments, Segment, boot_id, fits, map_in, next_name)

WARM_BLOCKS = 2  # at most this many blocks of warm memory held or being made (``warm_ahead``)
WARM_MOST = 256 << 20  # the largest block of warm memory (a larger read faults its own in)
# (and the largest segment made ahead: ``make_ahead``)


class Slot(NamedTuple):
    """``nbytes`` bytes at ``offset`` in ``segment``: where one array travels."""

    segment: Segment
    offset: int
    nbytes: int

    def ref(self) -> list[Any]:
        """The slot as it travels: ``[segment name, offset, nbytes]`` (``fabric.core.wire``)."""
        return [self.segment.name, self.offset, self.nbytes]

    def array(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """The slot's bytes as an array of ``dtype`` and ``shape`` (C order)."""
        return self.segment.memory[self.offset:self.offset + self.nbytes].view(dtype) \
            .reshape(shape)


class SegmentPool:
    """One owner's segments: lent out, one transfer each, and given back for the next.

    ``acquire`` lends a free segment that fits (at most twice the size asked), or makes one
    while the pool holds under ``limit`` bytes (closing idle ones to make room), or gives
    None: the caller then takes the socket path, so a full pool never fails a transfer. A
    segment lent to an upload comes back once its session's device has run the batch that
    carried it (``lend_until``, checked by ``done``); one lent to a read comes back when the
    caller says (``give_back``); one whose transfer was abandoned is closed (``discard``),
    since a peer may still write into it. Segments idle for ``idle_seconds`` are closed.
    ``_make`` faults a segment in on a thread of the pool's (``fabric.core.segment_maker``;
    ``wake`` is called from it after each), its bytes counted in ``held`` from the start, so
    that the limit holds while it is made (a device's pool: ``workers.device_pool``).
    ``copies`` copies large arrays into slots with ``copy_threads`` threads (its threads, and
    the makers', end with the pool). The maker also makes segments ahead of a size's next
    read, and the slots a peer lent this process as their answers come (``fault_in``),
    first. Another maker thread, at the lowest priority, makes what is ahead of a need that
    may not come: the segments ahead of a size's next read (``make_ahead``), free once made,
    and warm memory ahead of a read into this process's own memory (``warm_ahead``,
    ``take_warm``), counted in ``held`` until taken, and closed as idle segments are.
    """

    def __init__(self, done: Callable[[int], int], limit: int = DEFAULT_POOL_BYTES,
                 idle_seconds: float = IDLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic,
                 copy_threads: int | None = None,
                 wake: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.copies = ParallelCopy(copy_threads)
        self.idle_seconds = idle_seconds
        self._done = done  # session -> batches its device has run
        self._clock = clock
        self._prefix = (boot_id(), os.getpid())
        self.free: dict[Segment, float] = {}  # -> when it was given back
        self.lent: dict[Segment, tuple[int, int] | None] = {}  # -> (session, batch) or None
        self.keys: dict[Segment, Any] = {}  # -> the borrower it is lent to alone (``acquire``)
        self.held = 0  # bytes of every segment, free, lent or being made
        self.making: dict[Segment | WarmMemory, threading.Event] = {}  # being faulted in:
        # -> set once made
        self.warm: dict[WarmMemory, float] = {}  # faulted in ahead, not taken: -> since when
        # Its makers (started at their first job), by whether theirs is work ahead of a need
        # that may not come (at the lowest priority: segments and warm memory made ahead)
        self._makers: dict[bool, SegmentMaker] = {}
        self._wake = wake  # called by the maker's thread after each segment
        self.transfers = 0  # transfers through shared memory so far (own slots or a device's)
        self._returned: deque[tuple[Slot, bool]] = deque()  # from other threads: (slot, retire)
        self.peers: dict[int, PeerSegments] = {}  # pid -> its segments mapped here
        self._pruned = clock()  # when the peers' closed segments were last unmapped
        self.slotless: set[int] = set()  # sessions whose device lends no slots of its own
        self.probes: set[Segment] = set()  # probe segments not yet closed (``probe_segment``)
        self._thread = threading.get_ident()

    def acquire(self, nbytes: int, key: Any = None,
                grow: Callable[[int], bool] | None = None) -> Slot | None:
        """A slot of ``nbytes`` bytes, lent until given back; None when the pool is full.

        A free segment that fits, or else a new one, made now. ``key`` (a borrower that maps
        the segment itself, whose old mapping would show what the segment holds next): the
        segment is lent again to that borrower alone, a free one lent to another is never
        taken (it is closed first when room is needed), and once closed free, its pages go
        at once (``Segment.empty``), whoever still maps it. ``grow``: asked before a new
        segment of that many bytes is made; False, and none is (None is answered)."""
        self.reclaim()
        segment = self.free_fitting(nbytes, key)
        if segment is not None:
            del self.free[segment]
        else:
            segment = self._reserve(nbytes, grow)
            if segment is None:
                return None
            try:
                segment.allocate(self.copies)  # (on the caller's thread: on every core)
            except OSError:  # no memory left for it
                self.held -= segment.size
                segment.close()
                return None
        self.lent[segment] = None
        if key is not None:
            self.keys[segment] = key
        self.transfers += 1
        return Slot(segment, 0, nbytes)

    def make_ahead(self, nbytes: int) -> None:
        """Make a segment that fits ``nbytes`` bytes on the maker's thread, for a later
        ``acquire`` to find free (a read of that size came: the next ones take a slot);
        not where one that fits is free or being made, it would be larger than
        ``WARM_MOST``, or the limit refuses it (as ``acquire``'s would)."""
        self.reclaim()
        if nbytes > WARM_MOST or self.free_fitting(nbytes) is not None \
                or self.being_made(nbytes):
            return
        segment = self._reserve(nbytes, None)
        if segment is not None:
            self._make(segment, ahead=True)

    def being_made(self, nbytes: int) -> bool:
        """Whether a segment that fits ``nbytes`` is being made ahead (``make_ahead``)."""
        return any(isinstance(segment, Segment) and fits(segment.size, nbytes)
                   for segment in self.making)

    def _make(self, segment: Segment | WarmMemory, ahead: bool = False) -> None:
        """Fault ``segment`` (reserved) in on a maker's thread: ``ahead`` of a need that may
        not come, on the one at the lowest priority (a first move right after a first read
        of 256 MiB took 120-130 ms where the segment made ahead of the next read took a core
        from it, 86-91 ms where it yielded)."""
        self.making[segment] = self._maker(ahead).submit(segment)

    def fault_in(self, values: np.ndarray) -> None:
        """Fault ``values`` (memory of a peer's segment, mapped here) into this process's page
        tables on the maker's thread (``MappingFaultIn``), for a transfer to come: before
        the segments and warm memory it makes ahead (an upload may be about to take it)."""
        self._maker().submit(MappingFaultIn(values), first=True)

    def start(self) -> None:
        """Start its copy threads and its maker's thread now (a connection's, as its first
        session opens), not in a first transfer (a thread started there cost it 1-5 ms)."""
        self.copies.start()
        self._maker().start()

    def _maker(self, ahead: bool = False) -> SegmentMaker:
        """The maker of what is made ahead of a need that may not come, or of the rest."""
        if ahead not in self._makers:
            self._makers[ahead] = SegmentMaker(self._wake, lowest_priority=ahead)
        return self._makers[ahead]

    def free_fitting(self, nbytes: int, key: Any = None) -> Segment | None:
        """The smallest free segment that fits ``nbytes`` bytes and may be lent to ``key``
        (``acquire``), if any."""
        fitting = [s for s in self.free if fits(s.size, nbytes)
                   and self.keys.get(s, key) == key]
        return min(fitting, key=lambda s: s.size) if fitting else None

    def _reserve(self, nbytes: int, grow: Callable[[int], bool] | None) -> Segment | None:
        """A new segment for ``nbytes`` bytes, sealed, not yet allocated, its bytes counted
        in ``held``; None where the limit (closing idle free segments first) or ``grow``
        refuses it, or no memory is left."""
        size = -(-max(nbytes, 1) // SEGMENT_ALIGN) * SEGMENT_ALIGN
        for idle in sorted(self.free, key=self.free.get):  # the longest idle first
            if self.held + size <= self.limit:
                break
            self._remove(idle)
        if self.held + size > self.limit or grow is not None and not grow(size):
            return None
        try:
            segment = Segment.sealed(next_name(*self._prefix), size)
        except OSError:
            return None
        self.held += size
        return segment

    def made(self, segment: Segment | WarmMemory, failed: OSError | None) -> None:
        """``segment``, made on the maker's thread (``_make``), is free now (or warm); or where
        making it ``failed``, closed, its bytes given back; warm memory taken meanwhile is its
        taker's. (A device's pool lends it to the request that waits for it:
        ``workers.device_pool``.)"""
        if self.making.pop(segment, None) is None:
            return
        if failed is not None:
            self.held -= segment.size
            segment.close()
        elif isinstance(segment, WarmMemory):
            self.warm[segment] = self._clock()
        else:
            self.free[segment] = self._clock()

    def warm_ahead(self, nbytes: int, after: float = 0.0) -> None:
        """Fault in memory of ``nbytes`` bytes ahead, on the maker's thread, ``after`` seconds
        from now, for a read into this process's own memory to take (``take_warm``); not where
        such memory is warm or being made already, ``WARM_BLOCKS`` are, it would be larger
        than ``WARM_MOST``, or the pool's ``limit`` would not hold it."""
        self.reclaim()
        blocks = self._warm_blocks()
        size = -(-max(nbytes, 1) // mmap.PAGESIZE) * mmap.PAGESIZE
        if len(blocks) >= WARM_BLOCKS or any(fits(block.size, nbytes) for block in blocks) \
                or size > WARM_MOST or self.held + size > self.limit:
            return
        try:
            block = WarmMemory(size, after)
        except OSError:  # (no addresses left: then the read makes new memory, or fails)
            return
        self.held += size
        self._make(block, ahead=True)

    def take_warm(self, nbytes: int) -> mmap.mmap | None:
        """Memory of at least ``nbytes`` bytes faulted in ahead (``warm_ahead``), or still
        being faulted in, that fits (``fits``), the caller's from now on; None where none
        does."""
        self.reclaim()
        blocks = [block for block in self._warm_blocks() if fits(block.size, nbytes)]
        if not blocks:
            return None
        block = min(blocks, key=lambda block: (block not in self.warm, block.size))
        if self.warm.pop(block, None) is None:
            del self.making[block]  # (``made`` then passes it by)
            block.stop()
        self.held -= block.size
        return block.memory

    def _warm_blocks(self) -> list[WarmMemory]:
        """The warm memory made (first) and being made."""
        return [*self.warm, *(block for block in self.making if isinstance(block, WarmMemory))]

    def probe_segment(self, token: int) -> Segment:
        """A one-page segment holding ``token`` (its first 8 bytes), for a peer to prove it
        maps this process's shared memory; in ``probes`` until the caller closes it
        (``close_probe``)."""
        segment = Segment.create(next_name(*self._prefix),
                                 mmap.PAGESIZE)
        segment.memory[:8].view(np.uint64)[0] = token
        self.probes.add(segment)
        return segment

    def close_probe(self, segment: Segment) -> None:
        """Close ``probe_segment``'s ``segment``: its peer answered, or will not."""
        self.probes.discard(segment)
        segment.close()

    def peer(self, pid: int) -> PeerSegments:
        """Process ``pid``'s segments, as this process maps them (a new peer's first: the
        mappings of peers that are gone, such as a worker that was restarted, are dropped)."""
        if pid not in self.peers:
            self._prune_peers()
            self.peers[pid] = PeerSegments(pid)
        return self.peers[pid]

    def _prune_peers(self) -> None:
        self._pruned = self._clock()
        for pid, peer in list(self.peers.items()):
            peer.prune()
            if not peer.maps:
                del self.peers[pid]

    def lend_until(self, slot: Slot, session: int, batch: int) -> None:
        """``slot`` comes back once ``session``'s device has run its batch number ``batch``."""
        self.lent[slot.segment] = (session, batch)

    def give_back(self, slot: Slot) -> None:
        """``slot`` is free for the next transfer."""
        if self.lent.pop(slot.segment, False) is not False:
            self.free[slot.segment] = self._clock()

    def give_back_from_any_thread(self, slot: Slot, retire: bool = False) -> None:
        """``give_back`` (or with ``retire``, ``discard``), called by an array's finalizer or
        a closing session: at once in the thread that owns the pool, else at its next lend
        (the pool is that thread's alone)."""
        if threading.get_ident() != self._thread:
            self._returned.append((slot, retire))
        elif retire:
            self.discard(slot)
        else:
            self.give_back(slot)

    def discard(self, slot: Slot) -> None:
        """Close ``slot``'s segment: its transfer was abandoned and a peer may still use it."""
        if self.lent.pop(slot.segment, False) is not False:
            self.held -= slot.segment.size
            self.keys.pop(slot.segment, None)
            slot.segment.close()

    def discard_session(self, session: int) -> None:
        """Close the segments lent to ``session``'s uploads (it closed, or was lost), and
        forget whether its device lends slots."""
        self.slotless.discard(session)
        for segment, lender in list(self.lent.items()):
            if lender is not None and lender[0] == session:
                self.discard(Slot(segment, 0, 0))

    def reclaim(self) -> None:
        """Take in the segments made ahead (``made``), take back the slots given back from
        other threads and those whose upload ran;
        close the segments idle past ``idle_seconds``, and once as often unmap the peers'
        segments they closed (``acquire`` does this first)."""
        for maker in self._makers.values():
            while maker.done:
                self.made(*maker.done.popleft())
        while self._returned:
            slot, retire = self._returned.popleft()
            if retire:
                self.discard(slot)
            else:
                self.give_back(slot)
        now = self._clock()
        for segment, lender in list(self.lent.items()):
            if lender is not None and self._done(lender[0]) >= lender[1]:
                del self.lent[segment]
                self.free[segment] = now
        for segment, since in list(self.free.items()):
            if now - since > self.idle_seconds:
                self._remove(segment)
        for block, since in list(self.warm.items()):
            if now - since > self.idle_seconds:
                del self.warm[block]
                self.held -= block.size
                block.close()
        if now - self._pruned > self.idle_seconds:  # (peers close theirs as idle)
            self._prune_peers()

    def _remove(self, segment: Segment) -> None:
        del self.free[segment]
        self.held -= segment.size
        if self.keys.pop(segment, None) is not None:  # (its borrower may keep its mapping)
            segment.empty()
        segment.close()

    def close(self) -> None:
        """Close every segment (arrays still over them keep their memory until collected),
        and end the copying and making threads."""
        self.copies.close()
        for block in self.making:
            if isinstance(block, WarmMemory):
                block.stop()  # (the maker waits for none)
        for maker in self._makers.values():
            maker.close()
        self._makers.clear()  # (dropped: the jobs they did not run hold mappings)
        for segment in [*self.free, *self.lent, *self.making, *self.warm, *self.probes]:
            segment.close()
        for peer in self.peers.values():
            peer.close()
        self.free.clear()
        self.lent.clear()
        self.making.clear()
        self.warm.clear()
        self.probes.clear()
        self.keys.clear()
        self.held = 0


class MappingFaultIn:
    """A maker's job (``SegmentPool.fault_in``): ``values``, memory of a peer's segment mapped
    here (a slot its device lent ahead), faulted into this process's page tables, so that the
    upload that takes the slot copies at a warm copy's speed (8 MiB: 0.3 ms, where faulting
    in on the way cost 2 ms more). Holding ``values`` keeps the mapping until it ran (not
    after: a mapping with an array over it is not unmapped as its segment closes); an
    upload that takes the slot meanwhile faults in what is left itself."""

    def __init__(self, values: np.ndarray) -> None:
        self.values: np.ndarray | None = values

    def allocate(self) -> None:
        """Fault every page in, in pieces (each holds the memory map lock an ``mmap`` on
        another thread waits for); OSError where the kernel refuses (before Linux 5.14)."""
        values, self.values = self.values, None
        start, nbytes = values.ctypes.data, values.nbytes
        for offset in range(0, nbytes, POPULATE_PIECE):
            map_in(start + offset, min(POPULATE_PIECE, nbytes - offset))


class SlotMemory:
    """A slot's values shown to numpy through an object that is collected only when the last
    array using them is (its finalizer gives the slot back to its pool). ``lent``: the pool
    and slot, where the values are a tensor that keeps a slot of its device's own pool (a
    read-only view of it may pin the slot: ``workers.pins``)."""

    def __init__(self, values: np.ndarray, writable: bool,
                 lent: tuple[SegmentPool, Slot] | None = None) -> None:
        self.values = values  # keeps the memory alive as long as any array uses it
        self.lent = lent
        interface: dict[str, Any] = dict(values.__array_interface__)
        interface["data"] = (interface["data"][0], not writable)
        self.__array_interface__ = interface
