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

Memory: the pool counts against the worker's ``--memory-budget`` (``DevicePool``): a free
segment as the device's, a slot offered and not yet used (or being made to be offered), and
the part of a slot that its tensor does not use, as its session's; and an offer is refused
past the session's ``--memory-limit`` (counting its tensors and pins, and the slots charged to
it) or the budget (closing the device's free segments first). The client then uploads through
its own pool, as when the device's pool is full.
"""

from __future__ import annotations

from typing import Any, Callable

from fabric.core.errors import ProtocolError
from fabric.core.protocol import Message, reply_to
from fabric.core.segment_pool import SegmentPool, Slot
from fabric.core.shm import SEGMENT_ALIGN, Segment
from fabric.core.wire import decode_segment_ref

from .device_session import DeviceSession
from .memory import Allowance
from .shared_memory import HostSharing, SessionSegments, segments_of

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

    def make_for(self, message: Message, segments: SessionSegments, nbytes: int) -> bool:
        """Make a segment for ``nbytes`` bytes on the maker thread, charged to ``segments``'s
        session from now on, to answer ``message`` with once made (``made``); False where
        the limit or the budget refuses it."""
        segment = self._reserve(nbytes, self.room)
        if segment is None:
            return False
        self.waiting[segment] = (message, segments, nbytes)
        self.charge(segment, segments, segment.size)
        self._make(segment)
        return True

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
            segments.lend(self, slot)
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
    ``give_back`` (offered to this session, unused) go back to the pool first."""
    body = message.body
    nbytes = body.get("nbytes")
    if type(nbytes) is not int or nbytes < 0:
        raise ProtocolError("A shm_slot request needs 'nbytes', an int of at least 0.")
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
    if executor.slots is None:  # (made in the device's thread, which owns it)
        executor.slots = DevicePool(executor.allowance, executor.sharing, executor.wake)
        executor.allowance.reclaim = executor.slots.release_free
    pool: DevicePool = executor.slots
    pool.reclaim()
    pool.settle()  # (what was given back is charged to the device again)
    limit, held = executor.memory_limit, session.resident + segments.charged
    least = -(-max(nbytes, 1) // SEGMENT_ALIGN) * SEGMENT_ALIGN  # (a new segment's size)
    pool.why = None
    slot = None
    if limit is None or held + least <= limit:
        if pool.free_fitting(nbytes, segments.process.key) is not None:
            slot = pool.acquire(nbytes, segments.process.key)
        elif pool.make_for(message, segments, nbytes):
            return []  # (answered once made: ``made``)
    if slot is not None and limit is not None and held + slot.segment.size > limit:
        pool.give_back(slot)  # (a free one larger than a new one would be)
        slot = None
    if slot is not None:
        segments.lend(pool, slot)
    pool.settle()
    if slot is None:
        return [reply_to(message, {"slot": None, "reason": pool.why or _why_not(
            executor, session, segments, least)})]
    return [reply_to(message, {"slot": slot.ref()})]


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
