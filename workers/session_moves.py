"""Tensors moving between two sessions on a worker's devices, sans I/O: the ``Executor``'s
part that sends a tensor (a ``send`` op), agrees to take one (``expect``), stores one that
arrives (a TRANSFER), and answers who waits for it (``await``).

Rule: a session takes a tensor only under a ticket its own client gave (``expect``), used
once: no session can push tensors into another, nor replace one there, whatever ids it
knows; what arrives under no ticket is dropped and counted (``transfers_refused``).

A client sends a move's ``expect``, ``send`` and ``await`` at once where its TRANSFER is
small (``fabric.core.flow.EARLY_TRANSFER_BYTES``: the bytes go by memory or a slot, or are
few), so a TRANSFER may overtake its ``expect`` (through another worker, or another socket
of this one). One under a ticket not given yet waits for it: kept, where it is small, at
most ``EARLY_MOST`` of a session for ``EARLY_SECONDS``; else dropped and counted, its
ticket kept alone (at most ``MAX_EXPECTED``). One under a ticket used already is dropped at
once. An ``await`` of a tensor that has no ticket, nor came, is answered with an error at
once (its ``expect`` was refused). Where a move's TRANSFER could not be taken as it came
(dropped before its ticket came, or lent by a worker whose memory cannot be read here:
``LendUnreadable``), its ticket stays and its ``await`` is answered ``again``: the client
sends it once more, its bytes in the TRANSFER.

A tensor's poison travels in its place. The bytes go in the TRANSFER's frame, through a slot
of shared memory the receiving client lent (``workers.shared_memory``), or, between two
workers of one host, are read by the receiver where they lie (``workers.lent_memory``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from fabric.core.errors import ProtocolError, QuotaExceeded, RemoteError
from fabric.core.flow import EARLY_TRANSFER_BYTES
from fabric.core.protocol import Kind, Message, reply_error, reply_to
from fabric.core.wire import require_ints

from . import shared_memory
from .device_session import DeviceSession
from .lent_memory import LendUnreadable

MAX_EXPECTED = 1024  # tensors one session may wait for from other sessions at once
EARLY_MOST = 16  # small TRANSFERs kept till their ticket comes, of a session at once ...
EARLY_SECONDS = 5.0  # ... this long, from when each came (its expect was sent before it)
USED_TICKETS = 1024  # tickets a session remembers having used (a late copy of a TRANSFER)


class SessionMoves:
    """The ``Executor``'s handling of tensors moved between sessions (a mixin: it uses the
    executor's ``sessions``, ``device``, ``sharing``, ``tally``, ``lent``,
    ``_materialize``, ``arrived``, ``_store`` and ``_op_error``)."""

    def _transfer(self, session: DeviceSession, tensor_id: int,
                  params: dict[str, Any]) -> Message:
        """The TRANSFER that carries a tensor (or its poison) to another session, with the
        ticket that session gave its client when it agreed to take it (``expect``)."""
        require_ints("A send op", session=params.get("session"), ticket=params.get("ticket"))
        body: dict[str, Any] = {"ticket": params["ticket"]}
        buffers: tuple[Any, ...] = ()
        self._materialize(session, tensor_id)
        if tensor_id in session.poisoned:
            body["error"] = session.poisoned[tensor_id]
        elif tensor_id not in session.tensors:
            body["error"] = ProtocolError(f"Tensor {tensor_id} does not exist in the session "
                                          "it was moved from.").to_wire()
        else:
            array = self.device.to_host(session.tensors[tensor_id])
            body.update(dtype=array.dtype.str, shape=list(array.shape))
            if "into" in params:  # its client lent a slot of shared memory for the way
                shared_memory.carry_in_slot(self.sharing.copies, session, params["into"], array,
                                             body)
                if "shm" in body:  # (else the slot was refused: the error goes instead)
                    self.tally.went_shared(array.nbytes)
                return Message(Kind.TRANSFER, params["session"], session.id, body)
            array = np.ascontiguousarray(array)
            lent = self.lent.lend(session.id, params["ticket"], array) \
                if params.get("by_memory") is True and self.sharing.enabled else None
            if lent is None:
                buffers = (array.reshape(-1).view(np.uint8),)
            else:  # its receiver, a worker of this host, reads it here (``lent_memory``)
                body["lent"] = lent
                self.tally.went_shared(array.nbytes)
        return Message(Kind.TRANSFER, params["session"], session.id, body, buffers)

    def _release(self, session: DeviceSession, out: int, args: list[Any],
                 params: dict[str, Any]) -> None:
        """A ``release`` op: the tensor this session lent by memory for the move
        ``params["ticket"]`` was read by its receiver (or given up on)."""
        self.lent.release(session.id, params.get("ticket"))

    def _receive(self, message: Message) -> list[Message]:
        """A tensor sent from another session arrives: stored as the tensor its ticket names,
        and who awaits it answered. One whose ticket this session never gave (or already
        used) is dropped and counted: no session can push tensors into another, nor replace
        one there, whatever ids it knows. A small one whose ticket has not come yet waits
        for it (``_early``)."""
        session = self.sessions[message.session]
        ticket = message.body.get("ticket")
        tensor_id = session.expected.pop(ticket, None)  # (a ticket is used once)
        if tensor_id is None and self._early(session, ticket, message):
            return []
        return self._take(session, ticket, tensor_id, message)

    def _early(self, session: DeviceSession, ticket: Any, message: Message) -> bool:
        """Whether ``message``, a TRANSFER under a ticket not given yet (nor used), waits for
        it: kept where it is small and fewer than ``EARLY_MOST`` are; else dropped and
        counted, its ticket kept alone (``early_dropped``, at most ``MAX_EXPECTED``)."""
        if type(ticket) is not int or ticket in session.used_tickets \
                or ticket in session.early or ticket in session.early_dropped:
            return False
        expire_early(session)
        if sum(len(buffer) for buffer in message.buffers) <= EARLY_TRANSFER_BYTES \
                and len(session.early) < EARLY_MOST:
            session.early[ticket] = (message, time.monotonic() + EARLY_SECONDS)
        else:
            _dropped(session, ticket)
        return True

    def _take(self, session: DeviceSession, ticket: Any, tensor_id: int | None,
              message: Message) -> list[Message]:
        """Store the TRANSFER ``message`` as tensor ``tensor_id`` (the one its ``ticket``
        names; None: dropped and counted), and answer who awaits it."""
        if tensor_id is None or tensor_id in session.tensors or tensor_id in session.poisoned:
            session.transfers_refused += 1
            return []
        body = message.body
        try:
            if "error" in body:
                session.poisoned[tensor_id] = body["error"]
            else:
                self._store(session, tensor_id, self.arrived(
                    session, "to (a tensor moved here)", body, message.buffers, 0))
        except LendUnreadable as exc:  # (the ticket stays: its bytes come in a TRANSFER)
            session.expected[ticket] = tensor_id
            return self._again(session, tensor_id, exc.message)
        except QuotaExceeded as exc:
            session.poisoned[tensor_id] = self._op_error("to", tensor_id, exc)
        except Exception as exc:  # a malformed transfer: poison, as for an op
            session.poisoned[tensor_id] = RemoteError(
                f"The tensor moved to this session could not be stored: "
                f"{type(exc).__name__}: {exc}", op="to", tensor=tensor_id).to_wire()
        _remember(session.used_tickets, ticket, USED_TICKETS)
        return [reply_to(request, {"ok": True})
                for request in session.awaiting.pop(tensor_id, [])]

    def _again(self, session: DeviceSession, tensor_id: int, why: str) -> list[Message]:
        """Tensor ``tensor_id``'s TRANSFER could not be taken as it came (``why``): who
        awaits it, now or next, is answered ``again``, for its client to send the bytes."""
        awaiting = session.awaiting.pop(tensor_id, [])
        if not awaiting:
            session.again[tensor_id] = why
        return [reply_to(request, {"ok": True, "again": why}) for request in awaiting]

    def _expect(self, session: DeviceSession, message: Message) -> list[Message]:
        """This session's client agrees to receive a tensor from another of its sessions, as
        new tensor ``id``, sent with ``ticket`` (a random number only that client knows)."""
        body = message.body
        tensor_id, ticket = body.get("id"), body.get("ticket")
        require_ints("An expect request", id=tensor_id, ticket=ticket)
        if tensor_id in session.tensors or tensor_id in session.poisoned:
            return [reply_error(message, ProtocolError(
                f"Tensor {tensor_id} already exists in this session: a tensor moved here "
                "takes a new id, never an existing tensor's."))]
        if len(session.expected) >= MAX_EXPECTED:
            return [reply_error(message, ProtocolError(
                f"This session already waits for {MAX_EXPECTED} tensors moved from other "
                "sessions: move them (t.to()) one after another."))]
        expire_early(session)
        agreed = [reply_to(message, {"ok": True})]
        if ticket in session.early:  # (its TRANSFER came first)
            return [*self._take(session, ticket, tensor_id, session.early.pop(ticket)[0]),
                    *agreed]
        session.expected[ticket] = tensor_id
        if ticket in session.early_dropped:  # (it came, and was dropped: it comes again)
            del session.early_dropped[ticket]
            return [*self._again(session, tensor_id, "Its TRANSFER came before the device "
                                                     "agreed to take it, and could not wait."),
                    *agreed]
        return agreed

    def _await(self, session: DeviceSession, message: Message) -> list[Message]:
        tensor_id = message.body.get("id")
        if tensor_id in session.again:
            return [reply_to(message, {"ok": True, "again": session.again.pop(tensor_id)})]
        if tensor_id in session.tensors or tensor_id in session.poisoned:
            # (where it came otherwise than by its ticket, the ticket goes: a direct link
            # that broke, and the upload sent again as a put)
            for ticket in [t for t, tid in session.expected.items() if tid == tensor_id]:
                del session.expected[ticket]
            return [reply_to(message, {"ok": True})]
        if tensor_id not in session.expected.values():
            return [reply_error(message, ProtocolError(
                f"No tensor {tensor_id} is on its way to this session: its move was not "
                "agreed to here (its expect was refused). Move it again (t.to())."))]
        session.awaiting.setdefault(tensor_id, []).append(message)
        return []  # answered when the tensor arrives


def expire_early(session: DeviceSession) -> None:
    """The TRANSFERs kept ``EARLY_SECONDS`` for their ticket are dropped and counted, their
    tickets kept alone: one that comes yet is answered ``again``."""
    now = time.monotonic()
    for ticket in [t for t, (_, until) in session.early.items() if until <= now]:
        del session.early[ticket]
        _dropped(session, ticket)


def _dropped(session: DeviceSession, ticket: int) -> None:
    session.transfers_refused += 1
    _remember(session.early_dropped, ticket, MAX_EXPECTED)


def _remember(tickets: dict[int, None], ticket: int, most: int) -> None:
    """Add ``ticket`` to ``tickets`` (in order), the oldest going past ``most``."""
    tickets[ticket] = None
    if len(tickets) > most:
        del tickets[next(iter(tickets))]
