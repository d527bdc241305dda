"""Tensors moved worker to worker (``t.to(session)``), many at once.

Rule: a move takes three steps, each a request or a flush: the receiving device agrees to take
a new tensor with a one-time ticket only this client knows (``expect``), the sending device
sends it with that ticket (a ``send`` op, flushed), and the receiving device waits for it
(``await``), so that later ops there may use it. Where the move's TRANSFER is small (its bytes
by memory or through a slot, or few: ``fabric.core.flow.EARLY_TRANSFER_BYTES``) the three go
at once, one wait where there were two (the receiving device keeps a TRANSFER that overtook
its ``expect``: ``workers.session_moves``); a larger one is sent once the ``expect`` was
answered. A move the receiving device could not take as it came (asked for ``again``) is sent
once more, its bytes in the TRANSFER. ``move_all`` takes each step for every move before
waiting on any device, so the moves of a reshard overlap across devices, where one move after
another cost its round trips apiece. Shared memory between devices of this host:
``bulk.slot_for_move`` (a slot the receiving device lent ahead, as for uploads: no fourth
round trip where its answer has come), or the receiving worker reads the tensor where it lies
in the sending worker (``workers.lent_memory``), which keeps it until told (``release``).
"""

from __future__ import annotations

import secrets
from contextlib import ExitStack, suppress
from typing import Any, Sequence

from fabric.arrays.origins import issued_at
from fabric.arrays.tensor import Tensor
from fabric.core.flow import EARLY_TRANSFER_BYTES
from fabric.core.protocol import Message
from fabric.transport import bulk

Session = Any  # (fabric.client.session.Session, which imports this module: named, not imported)


def move_all(pairs: Sequence[tuple[Tensor, Session]]) -> list[Tensor]:
    """``source.to(target)`` for each ``(source, target)``: the source itself where it is
    the target's already, else a new tensor of the target made worker to worker; the first
    error of a device, once every device has answered."""
    moves = [(source, target) for source, target in pairs if source.session is not target]
    if not moves:
        return [source for source, _ in pairs]
    moved = iter(_move(moves))
    return [source if source.session is target else next(moved) for source, target in pairs]


class _Move:
    """One move's parts: the tensor moved and the session it goes to, the tensor it becomes
    there, its ticket, its ``expect`` request, and how its bytes go (the ``send`` op's
    params: a slot, by memory, or in the TRANSFER)."""

    __slots__ = ("source", "target", "tensor", "ticket", "expect", "way")

    def __init__(self, source: Tensor, target: Session, tensor: Tensor, ticket: int,
                 expect: int) -> None:
        self.source, self.target, self.tensor = source, target, tensor
        self.ticket, self.expect = ticket, expect
        self.way: dict[str, Any] = {}

    def small(self) -> bool:
        """Whether its TRANSFER is small enough to wait on the receiving device for its
        ticket (``fabric.core.flow.EARLY_TRANSFER_BYTES``), so it need not wait for the
        ``expect``'s answer: a slot's or a lend's, or of few bytes."""
        return bool(self.way) or \
            self.source.size * self.source.dtype.itemsize <= EARLY_TRANSFER_BYTES


def _move(moves: Sequence[tuple[Tensor, Session]]) -> list[Tensor]:
    origin = issued_at()
    parts: list[_Move] = []
    errors: list[Exception] = []
    for source, target in moves:
        tensor = target.stream.new_tensor(source.shape, source.dtype, origin)
        ticket = secrets.randbits(63)
        try:
            parts.append(_Move(source, target, tensor, ticket, target._send_request(
                {"op": "expect", "id": tensor.id, "ticket": ticket})))
        except Exception:  # (a closed session: those asked already still answer)
            _replies([(part.target, part.expect) for part in parts], errors)
            raise
    with ExitStack() as lent:
        for part in parts:
            slot = bulk.slot_for_move(part.target, part.source, part.tensor)  # (None: the
            # bytes go in the TRANSFER)
            if slot == "by_memory":
                part.way = {"by_memory": True}
            else:
                lent.enter_context(bulk.lent(part.target.connection.segments, slot))
                part.way = {"into": slot.ref()} if slot else {}
        by_memory = [part for part in parts if "by_memory" in part.way]
        at_once = [part for part in parts if part.small()]
        later = [part for part in parts if not part.small()]
        awaits = _sent(at_once)
        agreed = _replies([(part.target, part.expect) for part in later], errors)
        awaits += _sent([part for part, reply in zip(later, agreed) if _ok(reply)])
        _replies([(part.target, part.expect) for part in at_once], errors)
        answered = _awaited(awaits, errors)
        again = [part for part, reply in answered.items() if "again" in reply.body]
        for part in again:  # (the receiving device could not take it so: its bytes, now)
            part.way = {}
            part.target.stream.counts["moves_sent_again"] += 1
        answered.update(_awaited(_sent(again), errors))
        _released([part for part in by_memory if part in answered])
    if errors:
        raise errors[0]
    return [part.tensor for part in parts]


def _sent(parts: list[_Move]) -> list[tuple[_Move, int]]:
    """Each move's ``send`` op, queued on its source's session, those sessions flushed, and
    its ``await`` sent to its target's: the moves with their ``await`` requests."""
    senders: dict[int, Any] = {}
    for part in parts:
        part.source.session.stream.enqueue(["send", 0, [part.source.id], {
            "session": part.target.id, "ticket": part.ticket, **part.way}])
        senders[id(part.source.session)] = part.source.session
    for sender in senders.values():
        sender.flush()
    return [(part, part.target._send_request({"op": "await", "id": part.tensor.id}))
            for part in parts]


def _awaited(awaits: list[tuple[_Move, int]], errors: list[Exception]) -> dict[_Move, Message]:
    """The moves whose receiving device answered its ``await`` (it took the tensor, failed
    to, or asks for it ``again``), with that answer; the errors go into ``errors``."""
    replies = _replies([(part.target, request) for part, request in awaits], errors)
    return {part: reply for (part, _), reply in zip(awaits, replies) if reply is not None}


def _released(parts: list[_Move]) -> None:
    """The moves read by memory whose receiving device answered (it read the tensor, or
    failed to) are done with (``workers.lent_memory``): each sending device may let its
    lend go (a ``release`` op, sent at once), and a size moved again is asked for ahead.
    Where no answer came (a timeout), the lend stays until its time runs out: the receiver
    may read it yet."""
    senders: dict[int, Any] = {}
    for part in parts:
        source = part.source
        # (a session lost or closed: its worker lets the lend go once its time ran out)
        with suppress(Exception):
            source.session.stream.enqueue(["release", 0, [], {"ticket": part.ticket}])
            senders[id(source.session)] = source.session
            bulk.after_memory_read(part.target, source.size * source.dtype.itemsize)
    for sender in senders.values():
        with suppress(Exception):
            sender.flush()


def _replies(requests: list[tuple[Session, int]], errors: list[Exception]
             ) -> list[Message | None]:
    """Each request's reply, waited for in turn (none is left unclaimed); None where none
    came (a lost session, a timeout). Every error, of those and of the replies, goes into
    ``errors``, in order."""
    replies: list[Message | None] = []
    for session, request in requests:
        try:
            reply = session._reply(request)
        except Exception as exc:  # (the others still answer)
            errors.append(exc)
            replies.append(None)
            continue
        if "error" in reply.body:
            errors.append(session._remote_error(reply.body["error"]))
        replies.append(reply)
    return replies


def _ok(reply: Message | None) -> bool:
    return reply is not None and "error" not in reply.body
