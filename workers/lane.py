"""One device's lane, sans I/O: what a device thread does with what the broker sends it.

Rule: every decision a device thread takes about a message lives here, and every session's
state lives in the device's ``Executor`` alone (the client's largest message included): the
lane decodes a message, runs it, turns a failure that is a bug into an error reply instead of
ending the device, closes the sessions a broker heartbeat no longer lists, and keeps the
message-size policy: a REPLY or TRANSFER bigger than the way ahead takes is replaced by the
same message carrying ``MessageTooLarge`` (a frame too big would cost the connection). The
device thread (``workers.control_io``) owns the sockets: it feeds messages in and sends what
comes out. A failure that is a bug is logged with its traceback at most once an interval
(``RateLimitedLog``), its repeats counted: a client can send the message that fails as often
as it likes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

from fabric.core import protocol
from fabric.core.errors import FabricError, MessageTooLarge, RemoteError
from fabric.core.flow import largest_frame, size_and_limit_text
from fabric.core.log_limit import RateLimitedLog
from fabric.core.protocol import Header, Kind, Message
from fabric.core.resume import HeldSession

from . import device_pool
from .executor import Executor

log = logging.getLogger("fabric.worker")

# The kinds a device runs (the others on a lane: heartbeats, and errors to log). Tested as
# sets on every message: on Python 3.11 each ``Kind.X`` goes through the enum class's
# __getattr__ hook, five times the cost of a plain attribute.
DEVICE_KINDS = frozenset({Kind.OPEN, Kind.CLOSE, Kind.SUBMIT, Kind.REQUEST, Kind.TRANSFER})
_TRANSFERS = frozenset({Kind.TRANSFER})
_REQUESTS = frozenset({Kind.REQUEST})
_LONE_REQUEST = 512  # bytes: a shm_slot request's body, however many slots it gives back
# What may carry a frame too big, and whether the way ahead ends at the session's client
# (whose limit may be lower than the broker's).
_SIZED_REPLIES = {Kind.REPLY: True, Kind.TRANSFER: False}


def message_body(header: Header, frames: Sequence[Any]) -> dict[str, Any]:
    """A message's msgpack body, or an empty map when it has none or a malformed one."""
    try:
        return protocol.decode(frames, header).body
    except FabricError:
        return {}


def jumps_the_queue(header: Header, frames: Sequence[Any]) -> bool:
    """Whether a message runs as soon as the device reads it, ahead of its session's
    waiting ones: a lone ``shm_slot`` request (no ops batched in it), whose answer depends
    on none of them, so that the slot an upload asks for ahead comes after the op running
    now, not after all the device's queued work (``fabric.transport.slots_ahead``); not a
    session's start slot, asked right behind its probe, which must run first. Only a small
    REQUEST is looked into."""
    if header.kind not in _REQUESTS or len(frames) != 2 or len(frames[1]) > _LONE_REQUEST:
        return False
    body = message_body(header, frames)
    return body.get("op") == "shm_slot" and "ops" not in body and "start" not in body


class Lane:
    """The messages of one device (``index``) and its replies.

    ``broker_limit`` is the largest message the broker takes (``attach`` updates it);
    ``session_device(session)`` tells which device of this worker holds a session, if any.
    """

    def __init__(self, index: int, executor: Executor, broker_limit: int,
                 session_device: Callable[[int], int | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.index = index
        self.executor = executor
        self.broker_limit = broker_limit
        self.session_device = session_device
        self._clock = clock  # read only when a message fails with a bug
        self._failures = RateLimitedLog()  # their tracebacks, one an interval

    def attach(self, broker_limit: int) -> Message:
        """Registered with a broker that takes ``broker_limit`` bytes: the HEARTBEAT that
        makes this lane known to it."""
        self.broker_limit = broker_limit
        return Message(Kind.HEARTBEAT)

    def reset(self) -> None:
        """The broker that knew the sessions is gone: forget them."""
        self.executor.close_all()

    def held(self) -> list[HeldSession]:
        """The sessions this device holds, as a REGISTER reports them to the broker that
        takes over (``fabric.core.resume``); read from the control thread (the copy of the
        table is one C call, which the device thread cannot split)."""
        return [HeldSession(session_id, self.index, session.owner, session.secret_digest,
                              session.submits)
                for session_id, session in list(self.executor.sessions.items())
                if session.secret_digest]

    def handle(self, frames: Sequence[Any], header: Header | None = None) -> list[Message]:
        """Run one message of ``DEVICE_KINDS`` (``header``: its first frame's, if already
        read); the replies to send."""
        try:
            return self.executor.handle(protocol.decode(frames, header))
        except Exception as exc:  # (the header was read when the message came: it decodes)
            if not isinstance(exc, FabricError):  # a bug, which must not end the device
                self._log_failure(exc)
                exc = RemoteError(f"Device {self.index} failed on this message "
                                  f"({type(exc).__name__}: {exc}); it goes on serving.")
            header = protocol.decode_header(frames[0])
            return [protocol.error_message(exc, session=header.session,
                                           request=header.request)]

    def _log_failure(self, exc: Exception) -> None:
        """Log a bug met on a message: the first of an interval with its traceback, the
        next ones counted for the summary line (``flush_log``)."""
        line = self._failures.note(logging.ERROR, f"device {self.index} failed on a message",
                                   "a session's client", self._clock(),
                                   f"{type(exc).__name__}: {exc}")
        if line is not None:
            log.log(*line, exc_info=exc)

    def flush_log(self) -> None:
        """Log the summary of failures held back, once their interval is over."""
        for line in self._failures.due(self._clock()):
            log.log(*line)

    def reconcile(self, header: Header, frames: Sequence[Any]) -> None:
        """A broker heartbeat on the lane: close every session it does not list. The broker
        forgot it (its CLOSE may have been lost), so nothing will ever close it otherwise.
        (And a time to give back the device's idle shared memory, and to log the summary of
        failures held back.)"""
        self.flush_log()
        device_pool.trim(self.executor)
        listed = message_body(header, frames).get("sessions")
        if not isinstance(listed, list):
            return
        known = set(listed)
        for session in [s for s in self.executor.sessions if s not in known]:
            log.debug("session %#x is gone from the broker: closing it here", session)
            self.executor.handle(Message(Kind.CLOSE, session))

    def made(self) -> list[Message]:
        """The answers to the slot requests whose segments were made since the last call
        (the device's pool made them on its own thread, which woke this one)."""
        return device_pool.made(self.executor)

    def stays_on_worker(self, reply: Message) -> bool:
        """Whether ``reply`` is a TRANSFER to a session of this worker, which may go to its
        device in memory instead of through the broker."""
        return reply.kind in _TRANSFERS and self.session_device(reply.session) is not None

    def frames(self, reply: Message) -> list[Any]:
        """A reply's frames, or in place of a REPLY or TRANSFER bigger than the way ahead
        takes, the frames of the same message carrying ``MessageTooLarge``."""
        frames = protocol.encode(reply)
        to_client = _SIZED_REPLIES.get(reply.kind)
        if to_client is None or not reply.buffers:
            return frames
        limit = self.broker_limit
        if to_client:
            session = self.executor.sessions.get(reply.session)
            if session is not None and session.reply_limit is not None:
                limit = min(session.reply_limit, limit)
        size = largest_frame(frames)
        if size <= limit:
            return frames
        size_words, limit_words = size_and_limit_text(size, limit)
        if to_client:
            error = MessageTooLarge(
                f"The array read is {size_words}, more than the {limit_words} the "
                "way to the client takes in one message: read it in slices "
                "(t[:n].numpy()), or raise --max-message-bytes on the broker and workers "
                "and max_message_bytes= on the client.", size=size, limit=limit)
            return protocol.encode(protocol.reply_to(reply, {"error": error.to_wire()}))
        error = MessageTooLarge(
            f"The tensor moved with .to() is {size_words}, more than the "
            f"{limit_words} the broker takes in one message: move it in slices, or "
            "raise --max-message-bytes on the broker and workers.", size=size, limit=limit)
        return protocol.encode(Message(Kind.TRANSFER, reply.session, reply.request,
                                       {"ticket": reply.body.get("ticket"),
                                        "error": error.to_wire()}))
