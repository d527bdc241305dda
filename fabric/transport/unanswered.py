"""What a client of a broker pair sent and has no answer for yet, sans I/O: what it sends
again to the broker that takes over once each session is resumed (``fabric.core.resume``).

Rule: a batch (a SUBMIT, or a REQUEST carrying one) is kept until its device's CREDIT counts
it run (``done``); a request (a CLOSE too) until its reply is taken or given up on. Sent
again, a batch goes only when the device ran fewer than its ``seq`` (as RESUMED says), and a
request is marked ``again`` so that a device that answered it answers from its record.
Bounded: what the device ran and what is answered is dropped as the session sends more (the
window of batches in flight, ``fabric.core.flow.SUBMIT_WINDOW``, bounds the rest).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from fabric.core.protocol import Kind, Message
from fabric.core.resume import batch_seq

_KEPT = frozenset({Kind.SUBMIT, Kind.REQUEST, Kind.CLOSE})
_SWEEP_PAST = 64  # messages of one session kept before the answered ones are swept out


class Unanswered:
    """Each session's messages sent without an answer yet, in the order sent."""

    def __init__(self, done: Callable[[int], int], waits_for: Callable[[int], bool]) -> None:
        self._done = done  # session -> batches its device has run (CREDIT)
        self._waits_for = waits_for  # request id -> whether its reply is still awaited
        self._sent: dict[int, deque[Message]] = {}

    def sent(self, message: Message) -> None:
        """``message`` went to the broker."""
        if message.kind not in _KEPT or not message.session:
            return
        kept = self._sent.setdefault(message.session, deque())
        kept.append(message)
        if len(kept) > _SWEEP_PAST:
            done = self._done(message.session)
            self._sent[message.session] = deque(m for m in kept if self._open(m, done))

    def forget(self, session: int) -> None:
        """A session closed or was lost: nothing of it goes again."""
        self._sent.pop(session, None)

    def held(self, session: int) -> int:
        """How many messages of ``session`` are kept."""
        return len(self._sent.get(session, ()))

    def _open(self, message: Message, done: int) -> bool:
        """Whether ``message`` still lacks its answer, its device having run ``done``."""
        seq = batch_seq(message.body)
        if message.kind is Kind.SUBMIT:
            return seq is None or seq > done
        return self._waits_for(message.request)

    def again(self, session: int, submits: int) -> list[Message]:
        """What ``session`` sends again to a device that has run ``submits`` of its batches:
        the batches past them, and the requests still awaited (marked ``again``), in order."""
        resend = []
        for message in self._sent.pop(session, ()):
            if not self._open(message, submits):
                continue
            if message.kind is Kind.REQUEST:
                message = message._replace(body={**message.body, "again": True})
            resend.append(message)
        return resend
