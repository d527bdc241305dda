"""A worker's side of the shared-memory path (``fabric.core.shm``): the probe that agrees to it,
the device's own pool whose slots uploads and moves are written into and their tensors keep,
uploads copied out of a client's segment, and reads and moves written into one.

Rule: a session uses shared memory only after its probe succeeded here (the client's boot id
is this worker's, and the worker mapped the segment the client named and found the token the
client wrote there), and then only segments of the process that probed (their names carry
its pid), the device's own slots offered to that session (``offer``), and for a moved tensor
a slot of another process of the client's user. A worker maps others' segments only when
sealed (``fabric.core.shm``); each mapping is kept while its owner holds the segment (mapping
afresh would fault every page in again) and dropped with the session (a client killed with
SIGKILL leaves nothing once the broker closes its sessions). ``--no-shared-memory``
(``ENABLED``) answers every probe no.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any

import numpy as np

from fabric.core.errors import ProtocolError
from fabric.core.parallel_copy import ParallelCopy
from fabric.core.protocol import Message, reply_to
from fabric.core.shm import (DEFAULT_POOL_BYTES, IDLE_SECONDS, PeerSegments, Segment, SegmentPool,
                             Slot, SlotMemory, boot_id, held_segments)
from fabric.core.wire import SegmentRef, decode_segment_ref, device_dtype

from .device_session import DeviceSession
from .pins import SessionPins

ENABLED = True  # whether this worker agrees to shared memory (``fabric worker`` sets it)
POOL_BYTES = DEFAULT_POOL_BYTES  # each device's own pool (``fabric worker`` sets it)
IDLE = IDLE_SECONDS  # how long a free segment of it is kept (``fabric worker`` sets it)
# The copies into and out of shared memory, in pieces at once (``fabric.core.parallel_copy``;
# ``fabric worker`` sets it from --copy-threads or the environment; ``workers.control_io`` joins
# its threads as it closes).
COPIES = ParallelCopy(threads=1, min_bytes=0)  # (until then: one thread, no setting read)


class SessionSegments:
    """The shared memory of one session: its client's segments, as this worker maps them,
    the slots of the device's own pool offered to its uploads and not yet used, and those
    its client's read-only views pin (``workers.pins``)."""

    def __init__(self, pid: int) -> None:
        self.client = PeerSegments(pid)
        self.peers: dict[int, PeerSegments] = {}  # other processes' segments moves go to
        self.offered: dict[str, tuple[SegmentPool, Slot]] = {}
        self.pins = SessionPins()
        self.pruned = time.monotonic()  # when closed segments were last unmapped (``prune``)

    def slot(self, ref: Any) -> np.ndarray:
        """The bytes of the client's slot ``ref`` (``fabric.core.wire.decode_segment_ref``);
        ProtocolError for a slot of another process, or past its segment's end."""
        slot = decode_segment_ref(ref)
        if slot.owner.pid != self.client.pid or slot.owner.boot != boot_id():
            raise ProtocolError("A shared-memory slot must be in a segment of the process that "
                                "agreed to shared memory for this session.")
        return _slot_bytes(self.client.map(slot.name), slot)

    def target(self, ref: Any) -> np.ndarray:
        """The bytes of slot ``ref`` for a tensor moved to another session to be written
        into: the client's (``slot``), or one that another process of the client's user on
        this host lent it (a device's own: the moved tensor keeps it there). ProtocolError
        for any other: this worker writes only where its client itself could."""
        slot = decode_segment_ref(ref)
        if slot.owner.pid == self.client.pid:
            return self.slot(ref)
        if slot.owner.boot != boot_id() or _user_of(slot.owner.pid) != _user_of(
                self.client.pid):
            raise ProtocolError("A tensor may be moved only into a slot of its client or of "
                                "another process of the same user on this host.")
        if slot.owner.pid not in self.peers:
            self.peers[slot.owner.pid] = PeerSegments(slot.owner.pid)
        return _slot_bytes(self.peers[slot.owner.pid].map(slot.name), slot)

    def prune(self) -> None:
        """Unmap the segments their owners closed, at most once every ``IDLE`` seconds (a
        look at each owner's open files)."""
        now = time.monotonic()
        if now - self.pruned > IDLE:
            self.pruned = now
            for peer in (self.client, *self.peers.values()):
                peer.prune()

    def close(self) -> None:
        """Unmap the client's segments and the others', give the unused offered slots back,
        and retire the pinned ones."""
        self.client.close()
        for peer in self.peers.values():
            peer.close()
        for pool, slot in self.offered.values():
            pool.give_back_from_any_thread(slot)
        self.offered.clear()
        self.pins.retire()


def _slot_bytes(segment: Segment, slot: SegmentRef) -> np.ndarray:
    """The bytes of ``slot`` in ``segment``; ProtocolError where it reaches past the end."""
    if slot.offset + slot.nbytes > segment.size:
        raise ProtocolError(f"A slot of {slot.nbytes} bytes at {slot.offset} does not fit "
                            f"in segment {slot.name} ({segment.size} bytes).")
    return segment.memory[slot.offset:slot.offset + slot.nbytes]


def _user_of(pid: int) -> int | None:
    """The user process ``pid`` runs as (None where it is gone)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def probe(_executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer a ``shm_probe`` (an ``Executor`` request): whether this session may use shared
    memory, and why not."""
    body = message.body
    reason = _refusal(body)
    if reason is not None:
        return [reply_to(message, {"shared_memory": False, "reason": reason})]
    session.segments = SessionSegments(decode_segment_ref([body["segment"], 0, 8]).owner.pid)
    return [reply_to(message, {"shared_memory": True})]


def _refusal(body: dict[str, Any]) -> str | None:
    """Why the probe in ``body`` fails here, or None when it succeeds."""
    if not ENABLED:
        return "this worker was started with --no-shared-memory"
    if body.get("boot") != boot_id() or not boot_id():
        return "the client runs under another kernel (another host or virtual machine)"
    probed = decode_segment_ref([body.get("segment"), 0, 8])
    try:
        segment = Segment.open(probed.name, held_segments(probed.owner.pid)[probed.name])
    except (OSError, KeyError):
        return ("this worker cannot map the client's shared memory (another pid namespace, "
                "another user, or a segment not sealed against shrinking)")
    try:
        token = int(segment.memory[:8].view(np.uint64)[0]) if segment.size >= 8 else None
    finally:
        segment.close()
    if token != body.get("token"):
        return "the probe's segment does not hold the client's token"
    return None


def closed(session: DeviceSession) -> None:
    """``session`` closed (its client closed it, or the broker found the client gone): its
    mappings go."""
    if session.segments is not None:
        session.segments.close()


def segments_of(session: DeviceSession) -> SessionSegments:
    """The session's client segments; ProtocolError if it never agreed to shared memory."""
    if session.segments is None:
        raise ProtocolError("This session has not agreed to shared memory (shm_probe) with "
                            "this worker: send arrays in the message instead.")
    return session.segments


def offer(executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer a ``shm_slot`` (an ``Executor`` request): a slot of ``nbytes`` bytes in the
    device's own pool for the client to write an upload into (``{"slot": ref}``), whose
    tensor then keeps it without a copy; ``{"slot": None}`` when the pool is full. The slots
    it lists in ``give_back`` (offered to this session, unused) go back to the pool first."""
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
        pool, slot = segments.offered.pop(name)
        pool.give_back_from_any_thread(slot)
    if executor.slots is None:  # (made in the device's thread, which owns it)
        executor.slots = SegmentPool(lambda _session: 0, POOL_BYTES, IDLE)
    slot = executor.slots.acquire(nbytes)
    if slot is None:
        return [reply_to(message, {"slot": None})]
    segments.offered[slot.segment.name] = (executor.slots, slot)
    return [reply_to(message, {"slot": slot.ref()})]


def trim(executor: Any) -> None:
    """Close the segments of the device's own pool left free past ``IDLE``, and unmap those
    the sessions' clients closed (at each broker heartbeat, in the device's thread: an idle
    device gives its shared memory back, and keeps none of theirs)."""
    if executor.slots is not None:
        executor.slots.reclaim()
    for session in executor.sessions.values():
        if session.segments is not None:
            session.segments.prune()


def uploaded(session: DeviceSession, params: dict[str, Any]) -> np.ndarray:
    """The array a ``put`` (or a TRANSFER) placed in shared memory: the device's own slot
    offered for it (the put names its start and the array's bytes, which may be fewer than
    the slot's), which the array keeps until it is collected; or a view of the client's
    slot (which the client reuses once the put ran: ``owned`` copies it)."""
    dtype = device_dtype(params["dtype"])
    segments = segments_of(session)
    ref = decode_segment_ref(params["shm"])
    if ref.name in segments.offered:
        pool, slot = segments.offered.pop(ref.name)
        try:
            if ref.offset != slot.offset or ref.nbytes > slot.nbytes:
                raise ProtocolError("A put must name the start of the slot it was offered, "
                                    "and at most the slot's bytes.")
            values = slot._replace(nbytes=ref.nbytes).array(dtype, params["shape"])
        except BaseException:
            pool.give_back_from_any_thread(slot)
            raise
        holder = SlotMemory(values, writable=False, lent=(pool, slot))
        weakref.finalize(holder, pool.give_back_from_any_thread, slot)
        return np.asarray(holder)
    session.slots_used = True  # (its client waits for the CREDIT of this batch to reuse it)
    return segments.slot(params["shm"]).view(dtype).reshape(params["shape"])


def owned(array: np.ndarray) -> np.ndarray:
    """``uploaded``'s array as the tensor's own: a slot it keeps as it is, a view of the
    client's copied."""
    if isinstance(array.base, SlotMemory):
        return array
    copied = np.empty_like(array)
    COPIES.copy(copied, array)
    return copied


def carry_in_slot(session: DeviceSession, ref: Any, array: np.ndarray,
                  body: dict[str, Any]) -> None:
    """Write ``array`` into slot ``ref`` (a ``send`` op's ``into``: a tensor moved to
    another session through shared memory; ``SessionSegments.target``) and name the slot in
    the TRANSFER's ``body``; or, where the slot is not one, put the error there for the
    tensor to carry."""
    try:
        target = segments_of(session).target(ref)
        if target.nbytes != array.nbytes:
            raise ProtocolError(f"A slot of {target.nbytes} bytes cannot hold the tensor's "
                                f"{array.nbytes}.")
    except ProtocolError as exc:
        body["error"] = exc.to_wire()
        return
    COPIES.copy(target.view(array.dtype).reshape(array.shape), array)
    body["shm"] = ref


def read_into(executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer a ``read_into`` (an ``Executor`` request): the read's bytes (as
    ``Executor._read`` answers) written into the client's slot instead of carried; an error
    reply as it is. With ``"view": True`` (``t.numpy(copy=False)``), a tensor that lies in
    a slot of the device's own pool is not written: that slot is pinned and named
    (``{"pinned": slot}``), for the client to map; for any other, a request that names no
    slot ``"into"`` is answered ``{"pinned": None}``."""
    replies = executor._read(session, message)
    if len(replies) != 1 or len(replies[0].buffers) != 1:
        return replies
    if message.body.get("view") is True:
        pinned = segments_of(session).pins.pin(executor, session,
                                               session.tensors.get(message.body.get("id")))
        if pinned is not None or "into" not in message.body:  # (None: the client, which
            # lent no slot, counted on a pin; it reads again)
            return [replies[0]._replace(body={**replies[0].body, "pinned": pinned},
                                        buffers=())]
    data = replies[0].buffers[0]
    target = segments_of(session).slot(message.body.get("into"))
    if target.nbytes != data.nbytes:
        raise ProtocolError(f"A read_into slot of {target.nbytes} bytes cannot hold the "
                            f"tensor's {data.nbytes}.")
    COPIES.copy(target, data)
    return [replies[0]._replace(buffers=())]


def unpin(executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer an ``unpin`` (an ``Executor`` request, ``{"slots": [name, ...]}``): the client's
    read-only views of those pinned slots are gone (``workers.pins``)."""
    segments_of(session).pins.unpin(executor, session, message.body.get("slots"))
    return [reply_to(message, {"ok": True})]
