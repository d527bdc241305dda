"""A worker's side of the shared-memory path (``fabric.shm``): the probe that agrees to it,
uploads copied out of a client's segment, and reads written into one.

Rule: a session uses shared memory only after its probe succeeded here (the client's boot id
is this worker's, and the worker mapped the segment the client named and found the token the
client wrote there), and then only segments of the process that probed: their names carry
its pid. A worker maps a client's segments (only sealed ones: ``fabric.shm``) and never
creates one; each mapping is kept while the client holds the segment (mapping afresh would
fault every page in again) and dropped with the session (a client killed with SIGKILL leaves
nothing once the broker closes its sessions). ``--no-shared-memory`` (``ENABLED``) answers
every probe no.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fabric.errors import ProtocolError
from fabric.protocol import Message, reply_to
from fabric.shm import Segment, UnsealedSegment, boot_id, held_segments
from fabric.wire import decode_segment_ref, device_dtype

from .device_session import DeviceSession

ENABLED = True  # whether this worker agrees to shared memory (``fabric worker`` sets it)


class SessionSegments:
    """The segments of one session's client, as this worker maps them."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.maps: dict[str, Segment] = {}

    def slot(self, ref: Any) -> np.ndarray:
        """The bytes of slot ``ref`` (``fabric.wire.decode_segment_ref``); ProtocolError for
        a slot of another process, or past its segment's end."""
        slot = decode_segment_ref(ref)
        if slot.owner.pid != self.pid or slot.owner.boot != boot_id():
            raise ProtocolError("A shared-memory slot must be in a segment of the process that "
                                "agreed to shared memory for this session.")
        segment = self.maps.get(slot.name)
        if segment is None:
            segment = self.maps[slot.name] = self._map(slot.name)
        if slot.offset + slot.nbytes > segment.size:
            raise ProtocolError(f"A slot of {slot.nbytes} bytes at {slot.offset} does not fit "
                                f"in segment {slot.name} ({segment.size} bytes).")
        return segment.memory[slot.offset:slot.offset + slot.nbytes]

    def _map(self, name: str) -> Segment:
        try:
            held = held_segments(self.pid)
        except OSError:
            raise ProtocolError(f"The process that owns shared-memory segment {name} is "
                                "gone.") from None
        # A client's pool closes idle segments; their names never come back, so their
        # mappings are only memory held here.
        for gone in self.maps.keys() - held.keys():
            self.maps.pop(gone).close()
        if name not in held:
            raise ProtocolError(f"Shared-memory segment {name} does not exist: its client "
                                "closed it before this worker read it.")
        try:
            return Segment.open(name, held[name])
        except UnsealedSegment:
            raise ProtocolError(f"Shared-memory segment {name} is not sealed against "
                                "shrinking (F_SEAL_SHRINK): make segments with fabric's "
                                "SegmentPool, which seals them.") from None
        except OSError as exc:
            raise ProtocolError(f"Shared-memory segment {name} cannot be mapped here: "
                                f"{exc.strerror}.") from None


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
        for segment in session.segments.maps.values():
            segment.close()
        session.segments.maps.clear()


def segments_of(session: DeviceSession) -> SessionSegments:
    """The session's client segments; ProtocolError if it never agreed to shared memory."""
    if session.segments is None:
        raise ProtocolError("This session has not agreed to shared memory (shm_probe) with "
                            "this worker: send arrays in the message instead.")
    return session.segments


def uploaded(session: DeviceSession, params: dict[str, Any]) -> np.ndarray:
    """The array a ``put`` (or a TRANSFER) placed in shared memory, as a view of the client's
    slot (which the client reuses once the put ran: the caller copies it)."""
    dtype = device_dtype(params["dtype"])
    session.slots_used = True  # (its client waits for the CREDIT of this batch to reuse it)
    return segments_of(session).slot(params["shm"]).view(dtype).reshape(params["shape"])


def carry_in_slot(session: DeviceSession, ref: Any, array: np.ndarray,
                  body: dict[str, Any]) -> None:
    """Write ``array`` into the client's slot ``ref`` (a ``send`` op's ``into``: a tensor
    moved to another session through shared memory) and name the slot in the TRANSFER's
    ``body``; or, where the slot is not one, put the error there for the tensor to carry."""
    try:
        target = segments_of(session).slot(ref)
        if target.nbytes != array.nbytes:
            raise ProtocolError(f"A slot of {target.nbytes} bytes cannot hold the tensor's "
                                f"{array.nbytes}.")
    except ProtocolError as exc:
        body["error"] = exc.to_wire()
        return
    np.copyto(target.view(array.dtype).reshape(array.shape), array)
    body["shm"] = ref


def read_into(executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer a ``read_into`` (an ``Executor`` request): the read's bytes (as
    ``Executor._read`` answers) written into the client's slot instead of carried; an error
    reply as it is."""
    replies = executor._read(session, message)
    if len(replies) != 1 or len(replies[0].buffers) != 1:
        return replies
    data = replies[0].buffers[0]
    target = segments_of(session).slot(message.body.get("into"))
    if target.nbytes != data.nbytes:
        raise ProtocolError(f"A read_into slot of {target.nbytes} bytes cannot hold the "
                            f"tensor's {data.nbytes}.")
    np.copyto(target, data)
    return [replies[0]._replace(buffers=())]
