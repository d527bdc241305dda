"""A device's own pool of shared memory (``fabric.core.shm``), whose slots uploads and moves are
written into and their tensors keep, and the ``shm_slot`` requests it answers.

Rule: the device's thread alone decides and counts; the faulting in of a new segment runs on
the pool's maker thread (``fabric.core.segment_maker``), never on the device's, so a slot asked
for ahead never holds up the session's ops (256 MiB took the device 0.13 s). A request for a
slot that no free segment fits is answered once the segment is made (``made``: the maker wakes
the device's thread), and its bytes count from the start against everything an offered slot
counts against: the pool's ``--shared-memory-limit``, the worker's ``--memory-budget`` and the
session's ``--memory-limit`` (charged to the session), so that no limit is passed while a
segment is being made.

A session's start slot (``"start": True``: ``fabric.transport.slots_ahead``) is lent as any
other, but charged to the device until an upload takes it (the session's limit stays its
own to use); the device lends at most ``START_SLOTS`` that no upload has taken yet, so that
idle sessions hold a bounded amount of its memory. A free segment for the next one is kept
made (``ready_for_start``: from the device's start, and again once the device idles after a
start slot is asked for: ``idle``), never closed as idle (a session that opens on an idle
cluster finds it ready), only where the budget needs the room: one segment of the worker's
``--start-slot`` bytes per device, charged to it. Both only where the budget has room for
``READY_SHARE`` times as much.

Memory: the pool counts against the worker's ``--memory-budget`` (``DevicePool``): a free
segment as the device's, a slot offered and not yet used (or being made to be offered), and
the part of a slot that its tensor does not use, as its session's; and an offer is refused
past the session's ``--memory-limit`` (counting its tensors and pins, and the slots charged to
it) or the budget (closing the device's free segments first). The client then uploads through
its own pool, as when the device's pool is full.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from fabric.core.errors import ProtocolError
from fabric.core.protocol import Message, reply_to
from fabric.core.segment_pool import SegmentPool, Slot
from fabric.core.shm import SEGMENT_ALIGN, Segment
from fabric.core.wire import decode_segment_ref

from .device_session import DeviceSession
from .memory import Allowance
from .shared_memory import HostSharing, SessionSegments, segments_of

START_SLOTS = 4  # a device's start slots lent (or being made) and not yet taken, at most
READY_SHARE = 8  # a segment is kept ready where the budget has room for this many of it
READY_AFTER_IDLE_MS = 50  # the next start slot's segment is made once the device idled this
# long (made at once, it took the cores of the session just begun, faulting in 16 MiB as that
# session's first upload copied into its start slot)


class DevicePool(SegmentPool):
    """A device's own pool (``offer``), whose memory counts against the worker's budget
    through the device's ``allowance``: each segment is charged, beyond what its tensor
    holds (``_store`` charges that), to the session it is lent to or being made for
    (``charges``; a session's sum is its ``SessionSegments.charged``), or while free to the
    device. ``why``: the sentence saying why the last ``grow`` was refused. ``answers``: the
    replies to the requests whose segments were made (``made``), for the device to send."""

    def __init__(self, allowance: Allowance, sharing: HostSharing,
                 wake: Callable[[], None] | None = None) -> None:
        super().__init__(lambda _session: 0, sharing.pool_bytes, sharing.idle, wake=wake)
        self.allowance = allowance
        self.charges: dict[Segment, tuple[SessionSegments | None, int]] = {}
        self.why: str | None = None
        self.waiting: dict[Segment, tuple[Message, SessionSegments, int]] = {}
        self.answers: list[Message] = []
        # The segment made ahead for a start slot (``keep_ready``), not kept alive by this:
        # lent, then retired with a pin, it must close with its last array
        self.ready: weakref.ref[Segment] | None = None
        self.ready_wanted = False  # the next one, made once the device idles (``idle``)

    def keep_ready(self, nbytes: int) -> None:
        """Have a free segment for a start slot of ``nbytes`` bytes (none: 0) made ahead, on
        the maker thread, charged to the device from now on, where none that fits is free or
        being made, and the budget has room for ``READY_SHARE`` times as many bytes."""
        self.reclaim()
        if nbytes and self.spares(nbytes) and self.free_fitting(nbytes) is None \
                and not self.being_made(nbytes):
            ready = self._reserve(nbytes, self.room)
            if ready is not None:
                self.ready = weakref.ref(ready)
                self.charge(ready, None, ready.size)
                self._make(ready)

    def spares(self, nbytes: int) -> bool:
        """Whether the budget has room for ``READY_SHARE`` times ``nbytes`` more bytes: for
        a start slot, and the segment kept ready for the next, which yield to the work of
        a worker whose budget is tight."""
        budget = self.allowance.budget
        return budget.limit is None or budget.held() + READY_SHARE * nbytes <= budget.limit

    def reclaim(self) -> None:
        """``SegmentPool.reclaim``, the segment kept ready for a start slot never idle."""
        ready = self.ready and self.ready()
        if ready in self.free:
            self.free[ready] = self._clock()
        super().reclaim()

    def charge(self, segment: Segment, owner: SessionSegments | None, amount: int) -> None:
        """Charge ``amount`` bytes of ``segment`` to ``owner`` (None: the device), in place of
        what it was charged."""
        was, old = self.charges.pop(segment, (None, 0))
        if was is not None:
            was.charged -= old
        if amount:
            self.charges[segment] = (owner, amount)
            if owner is not None:
                owner.charged += amount
        self.allowance.held += amount - old

    def settle(self) -> None:
        """Charge the device for its free segments, and no one for those it closed."""
        for segment in [s for s in self.charges
                        if s not in self.free and s not in self.lent and s not in self.making]:
            self.charge(segment, None, 0)
        for segment in self.free:
            if self.charges.get(segment) != (None, segment.size):
                self.charge(segment, None, segment.size)

    def recount(self) -> None:
        """Charge the device afresh for what it holds, where its allowance forgot every
        session (``Executor.close_all``): what was charged to them, as it is."""
        self.allowance.held += sum(amount for _, amount in self.charges.values())

    def room(self, size: int) -> bool:
        """Whether the budget takes a new segment of ``size`` bytes (``acquire``'s ``grow``;
        the allowance closes the free segments first where it is short: ``release_free``)."""
        if self.allowance.fits(size):
            return True
        budget = self.allowance.budget
        self.why = (f"A slot of {size} bytes would pass this worker's {budget.limit}-byte "
                    f"--memory-budget ({budget.held()} bytes held): free tensors, upload "
                    "smaller arrays, or start the worker with a larger --memory-budget.")
        return False

    def release_free(self) -> bool:
        """Close every free segment (the budget needs the room); whether there was one."""
        free = list(self.free)
        for segment in free:
            self._remove(segment)
        self.settle()
        return bool(free)

    def make_for(self, message: Message, segments: SessionSegments, nbytes: int,
                 start: bool = False) -> bool:
        """Make a segment for ``nbytes`` bytes on the maker thread, charged to ``segments``'s
        session from now on (``start``: the session's start slot, to the device), to answer
        ``message`` with once made (``made``); False where the limit or the budget refuses
        it."""
        segment = self._reserve(nbytes, self.room)
        if segment is None:
            return False
        self.waiting[segment] = (message, segments, nbytes)
        if start:
            segments.start = segment.name
        self.charge(segment, None if start else segments, segment.size)
        self._make(segment)
        return True

    def lend_to(self, segments: SessionSegments, slot: Slot, start: bool = False) -> None:
        """Offer ``slot`` to ``segments``'s session: charged to it, or, its start slot (``start``,
        or the one being made for it), to the device until an upload takes it (a session's
        limit is its own to use)."""
        if start:
            segments.start = slot.segment.name
        segments.lend(self, slot)
        if segments.start == slot.segment.name:
            self.charge(slot.segment, None, slot.segment.size)

    def made(self, segment: Segment, failed: OSError | None) -> None:
        """``segment`` was made (or making it ``failed``): lent to the request waiting for
        it, and its answer queued; free where that session closed meanwhile."""
        waiting = self.waiting.pop(segment, None)
        super().made(segment, failed)
        if waiting is None:
            return
        message, segments, nbytes = waiting
        if failed is None and not segments.closed:
            del self.free[segment]
            self.lent[segment] = None
            self.keys[segment] = segments.process.key
            self.transfers += 1
            slot = Slot(segment, 0, nbytes)
            self.lend_to(segments, slot)
            self.answers.append(reply_to(message, {"slot": slot.ref()}))
        elif not segments.closed:
            self.answers.append(reply_to(message, {"slot": None, "reason": (
                f"The device could not allocate {segment.size} bytes of shared memory "
                f"({failed}): this upload goes through the client's own.")}))


def offer(executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer a ``shm_slot`` (an ``Executor`` request): a slot of ``nbytes`` bytes in the
    device's own pool for the client to write an upload into (``{"slot": ref}``), whose
    tensor then keeps it without a copy; ``{"slot": None, "reason": why}`` when the pool is
    full, or the slot would pass the session's memory limit or the worker's budget. A free
    segment that fits is offered at once; else one is made on the pool's maker thread, and
    the answer comes once it is (nothing is answered now). The slots it lists in
    ``give_back`` (offered to this session, unused) go back to the pool first. A start slot
    (``"start": True``) is refused where ``START_SLOTS`` are lent and not yet taken, or the
    budget is tight (``_why_no_start``)."""
    body = message.body
    nbytes = body.get("nbytes")
    if type(nbytes) is not int or nbytes < 0:
        raise ProtocolError("A shm_slot request needs 'nbytes', an int of at least 0.")
    start = body.get("start") is True
    if start and session.segments is None:  # (its probe was refused)
        return [reply_to(message, {"slot": None, "reason": "This session shares no memory "
                                   "with this worker."})]
    segments = segments_of(session)
    returned = body.get("give_back", [])
    names = [decode_segment_ref(ref).name for ref in returned] if type(returned) is list \
        else None
    if names is None or len(set(names)) < len(names) \
            or not segments.offered.keys() >= set(names):
        raise ProtocolError("A shm_slot request may give back only slots offered to its "
                            "session and not yet used, as a list of slots.")
    for name in names:
        segments.give_back(name)
    pool = _pool(executor)
    pool.reclaim()
    pool.settle()  # (what was given back is charged to the device again)
    limit, held = executor.memory_limit, session.resident + segments.charged
    least = -(-max(nbytes, 1) // SEGMENT_ALIGN) * SEGMENT_ALIGN  # (a new segment's size)
    pool.why = None if not start else _why_no_start(executor, pool, nbytes)
    if start and pool.why is None:  # (made for the next session once the device idles)
        pool.ready_wanted = bool(executor.sharing.start_slot)
    slot = None
    if pool.why is None and (limit is None or held + least <= limit):
        if pool.free_fitting(nbytes, segments.process.key) is not None:
            slot = pool.acquire(nbytes, segments.process.key)
        elif pool.make_for(message, segments, nbytes, start):
            return []  # (answered once made: ``made``)
    if slot is not None and limit is not None and held + slot.segment.size > limit:
        pool.give_back(slot)  # (a free one larger than a new one would be)
        slot = None
    if slot is not None:
        pool.lend_to(segments, slot, start)
    pool.settle()
    if slot is None:
        return [reply_to(message, {"slot": None, "reason": pool.why or _why_not(
            executor, session, segments, least)})]
    return [reply_to(message, {"slot": slot.ref()})]


def idle_wait_ms(executor: Any) -> int:
    """How long the device may wait for work before ``idle`` has something to do (-1: for
    ever)."""
    pool = executor.slots
    return READY_AFTER_IDLE_MS if pool is not None and pool.ready_wanted else -1


def idle(executor: Any) -> None:
    """The device waited ``idle_wait_ms`` for work: the segment for the next start slot,
    wanted since the last one was asked for, is made now."""
    pool = executor.slots
    if pool is not None and pool.ready_wanted:
        pool.ready_wanted = False
        pool.keep_ready(executor.sharing.start_slot)


def ready_for_start(executor: Any) -> None:
    """The device starts (on its thread, which owns its pool): where its worker shares
    memory, a segment for the first session's start slot is made ahead."""
    if executor.sharing.enabled and executor.sharing.start_slot:
        _pool(executor).keep_ready(executor.sharing.start_slot)


def _pool(executor: Any) -> DevicePool:
    """``executor``'s device pool, made at its first need (in the device's thread, which
    owns it)."""
    if executor.slots is None:
        executor.slots = DevicePool(executor.allowance, executor.sharing, executor.wake)
        executor.allowance.reclaim = executor.slots.release_free
    return executor.slots


def _why_no_start(executor: Any, pool: DevicePool, nbytes: int) -> str | None:
    """Why no start slot of ``nbytes`` bytes is lent now, if one may not be: ``START_SLOTS``
    of them lent to ``executor``'s sessions (or being made for them) that no upload has
    taken yet, or a tight budget (``DevicePool.spares``)."""
    making = {segment.name for segment in pool.waiting}
    lent = sum(1 for session in executor.sessions.values() if session.segments is not None
               and (session.segments.start in session.segments.offered
                    or session.segments.start in making))
    if lent >= START_SLOTS:
        return (f"This device has lent {START_SLOTS} start slots that no upload has taken "
                "yet: the first upload goes the way a later one does.")
    if not pool.spares(nbytes):
        return (f"This worker's --memory-budget has no room to spare for a start slot of "
                f"{nbytes} bytes: the first upload goes the way a later one does.")
    return None


def made(executor: Any) -> list[Message]:
    """The answers to the ``shm_slot`` requests whose segments the maker made since the last
    call (the device's thread calls this when the maker wakes it)."""
    pool: DevicePool | None = executor.slots
    if pool is None:
        return []
    pool.reclaim()
    pool.settle()
    answers, pool.answers = pool.answers, []
    return answers


def _why_not(executor: Any, session: DeviceSession, segments: SessionSegments,
             size: int) -> str:
    """Why no slot of ``size`` bytes was offered, where the budget did not refuse it."""
    limit = executor.memory_limit
    if limit is not None and session.resident + segments.charged + size > limit:
        return (f"A slot of {size} bytes would pass this session's {limit}-byte "
                f"--memory-limit: it holds {session.resident} bytes of tensors and "
                f"{segments.charged} of slots lent to it; free tensors or upload smaller "
                "arrays (this one goes through the client's own shared memory).")
    return ("The device's own shared memory is full (its --shared-memory-limit): this upload "
            "goes through the client's own.")


def trim(executor: Any) -> None:
    """Close the segments of the device's own pool left free past its idle time, and unmap those
    the sessions' clients closed (at each broker heartbeat, in the device's thread: an idle
    device gives its shared memory back, and keeps none of theirs)."""
    if executor.slots is not None:
        executor.slots.reclaim()
        executor.slots.settle()
    for session in executor.sessions.values():
        if session.segments is not None:
            session.segments.prune(executor.sharing.idle)
