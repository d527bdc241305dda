"""A device's sessions, sans I/O: what a worker does with each message for one device.

Rule: every rule about a session's life on the worker lives here: open, close, and (as the
op layer grows) running its messages in submission order. The device thread feeds it
decoded messages and sends back what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fabric.errors import FabricError, ProtocolError, SessionLost
from fabric.protocol import Kind, Message


@dataclass
class SessionState:
    id: int
    client: str
    tensors: dict[int, Any] = field(default_factory=dict)


class Executor:
    """The sessions of one device and the messages addressed to them."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.sessions: dict[int, SessionState] = {}

    def handle(self, message: Message) -> list[Message]:
        """Apply one message; return the replies to send to the broker."""
        handler = self._handlers.get(message.kind)
        if handler is None:
            return [_error(message, ProtocolError(
                f"A worker does not accept {message.kind.name} messages."))]
        if message.kind != Kind.OPEN and message.session not in self.sessions:
            if message.kind == Kind.CLOSE:
                return [Message(Kind.CLOSED, message.session, message.request)]
            return [_error(message, SessionLost(
                f"Session {message.session:#x} is not open on this worker: open a new "
                "session.", session=message.session))]
        return handler(self, message)

    def _open(self, message: Message) -> list[Message]:
        if message.session in self.sessions:
            return [_error(message, ProtocolError(
                f"Session {message.session:#x} is already open on this device."),
                kind=Kind.REJECT)]
        self.sessions[message.session] = SessionState(message.session,
                                                      str(message.body.get("client", "")))
        return [Message(Kind.OPENED, message.session, message.request)]

    def _close(self, message: Message) -> list[Message]:
        del self.sessions[message.session]
        return [Message(Kind.CLOSED, message.session, message.request)]

    def _request(self, message: Message) -> list[Message]:
        op = message.body.get("op")
        if op == "sync":
            return [Message(Kind.REPLY, message.session, message.request, {"ok": True})]
        return [_error(message, ProtocolError(f"Unknown request {op!r}."))]

    def close_all(self) -> None:
        """Forget every session (the broker that knew them is gone)."""
        self.sessions.clear()

    _handlers = {Kind.OPEN: _open, Kind.CLOSE: _close, Kind.REQUEST: _request}


def _error(message: Message, error: FabricError, kind: Kind = Kind.ERROR) -> Message:
    return Message(kind, message.session, message.request, error.to_wire())
