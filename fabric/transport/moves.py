"""Tensors moved worker to worker (``t.to(session)``), many at once.

Rule: a move takes three steps, each a request or a flush: the receiving device agrees to take
a new tensor with a one-time ticket only this client knows (``expect``), the sending device
sends it with that ticket (a ``send`` op, flushed), and the receiving device waits for it
(``await``), so that later ops there may use it. ``move_all`` takes each step for every move
before waiting on any device, so the moves of a reshard overlap across devices, where one
move after another cost its round trips apiece. Shared memory between devices of this host:
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


def _move(moves: Sequence[tuple[Tensor, Session]]) -> list[Tensor]:
    origin = issued_at()
    agreed: list[tuple[Tensor, int, int]] = []
    failed = None
    for source, target in moves:
        tensor = target.stream.new_tensor(source.shape, source.dtype, origin)
        ticket = secrets.randbits(63)
        try:
            agreed.append((tensor, ticket, target._send_request(
                {"op": "expect", "id": tensor.id, "ticket": ticket})))
        except Exception as exc:  # (a closed session: those asked already still answer)
            failed = exc
            break
    _answered([(target, request) for (_, target), (_, _, request) in zip(moves, agreed)],
              failed)
    by_memory: dict[int, tuple[Tensor, Session, int]] = {}  # tensor id -> the move's parts
    with ExitStack() as lent:
        senders: dict[int, Any] = {}
        for (source, target), (tensor, ticket, _) in zip(moves, agreed):
            slot = bulk.slot_for_move(target, source, tensor)  # (None: the bytes go in the
            # TRANSFER)
            if slot == "by_memory":
                way: dict[str, Any] = {"by_memory": True}
                by_memory[tensor.id] = (source, target, ticket)
            else:
                lent.enter_context(bulk.lent(target.connection.segments, slot))
                way = {"into": slot.ref()} if slot else {}
            source.session.stream.enqueue(["send", 0, [source.id], {
                "session": target.id, "ticket": ticket, **way}])
            senders[id(source.session)] = source.session
        for sender in senders.values():
            sender.flush()
        awaits = {(target, target._send_request({"op": "await", "id": tensor.id})): tensor.id
                  for (_, target), (tensor, _, _) in zip(moves, agreed)}
        answered: list[tuple[Session, int]] = []
        try:
            _answered(list(awaits), answered=answered)
        finally:
            _released([by_memory[awaits[a]] for a in answered if awaits[a] in by_memory])
    return [tensor for tensor, _, _ in agreed]


def _released(by_memory: list[tuple[Tensor, Session, int]]) -> None:
    """The moves read by memory whose receiving device answered (it read the tensor, or
    failed to) are done with (``workers.lent_memory``): each sending device may let its
    lend go (a ``release`` op, sent at once), and a size moved again is asked for ahead.
    Where no answer came (a timeout), the lend stays until its time runs out: the receiver
    may read it yet."""
    senders: dict[int, Any] = {}
    for source, target, ticket in by_memory:
        # (a session lost or closed: its worker lets the lend go once its time ran out)
        with suppress(Exception):
            source.session.stream.enqueue(["release", 0, [], {"ticket": ticket}])
            senders[id(source.session)] = source.session
            bulk.after_memory_read(target, source.size * source.dtype.itemsize)
    for sender in senders.values():
        with suppress(Exception):
            sender.flush()


def _answered(requests: list[tuple[Session, int]], failed: Exception | None = None,
              answered: list[tuple[Session, int]] | None = None) -> None:
    """Wait for every request's reply (none is left unclaimed), listing those that came in
    ``answered``; raise ``failed`` or else the first error."""
    errors = [] if failed is None else [failed]
    for session, request in requests:
        try:
            reply = session._reply(request)
        except Exception as exc:  # (a lost session, a timeout: the others still answer)
            errors.append(exc)
            continue
        if answered is not None:
            answered.append((session, request))
        if "error" in reply.body:
            errors.append(session._remote_error(reply.body["error"]))
    if errors:
        raise errors[0]
