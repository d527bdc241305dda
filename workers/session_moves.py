"""Tensors moving between two sessions on a worker's devices, sans I/O: the ``Executor``'s
part that sends a tensor (a ``send`` op), agrees to take one (``expect``), stores one that
arrives (a TRANSFER), and answers who waits for it (``await``).

Rule: a session takes a tensor only under a ticket its own client gave (``expect``), used
once: no session can push tensors into another, nor replace one there, whatever ids it
knows; what arrives under no ticket is dropped and counted (``transfers_refused``). A
tensor's poison travels in its place. The bytes go in the TRANSFER's frame, through a slot
of shared memory the receiving client lent (``workers.shared_memory``), or, between two
workers of one host, are read by the receiver where they lie (``workers.lent_memory``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fabric.core.errors import ProtocolError, QuotaExceeded, RemoteError
from fabric.core.protocol import Kind, Message, reply_error, reply_to
from fabric.core.wire import require_ints

from . import shared_memory
from .device_session import DeviceSession

MAX_EXPECTED = 1024  # tensors one session may wait for from other sessions at once


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
        one there, whatever ids it knows."""
        session = self.sessions[message.session]
        body = message.body
        tensor_id = session.expected.pop(body.get("ticket"), None)  # (a ticket is used once)
        if tensor_id is None or tensor_id in session.tensors or tensor_id in session.poisoned:
            session.transfers_refused += 1
            return []
        try:
            if "error" in body:
                session.poisoned[tensor_id] = body["error"]
            else:
                self._store(session, tensor_id, self.arrived(
                    session, "to (a tensor moved here)", body, message.buffers, 0))
        except QuotaExceeded as exc:
            session.poisoned[tensor_id] = self._op_error("to", tensor_id, exc)
        except Exception as exc:  # a malformed transfer: poison, as for an op
            session.poisoned[tensor_id] = RemoteError(
                f"The tensor moved to this session could not be stored: "
                f"{type(exc).__name__}: {exc}", op="to", tensor=tensor_id).to_wire()
        return [reply_to(request, {"ok": True})
                for request in session.awaiting.pop(tensor_id, [])]

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
        session.expected[ticket] = tensor_id
        return [reply_to(message, {"ok": True})]

    def _await(self, session: DeviceSession, message: Message) -> list[Message]:
        tensor_id = message.body.get("id")
        if tensor_id in session.tensors or tensor_id in session.poisoned:
            # (where it came otherwise than by its ticket, the ticket goes: a direct link
            # that broke, and the upload sent again as a put)
            for ticket in [t for t, tid in session.expected.items() if tid == tensor_id]:
                del session.expected[ticket]
            return [reply_to(message, {"ok": True})]
        session.awaiting.setdefault(tensor_id, []).append(message)
        return []  # answered when the tensor arrives
