"""A device's sessions, sans I/O: what a worker does with each message for one device.

Rule: every rule about a session's life on the worker lives here: open, close, running its
ops in submission order, poisoning the outputs of an op that fails (and of every op that
reads a poisoned tensor), the per-session memory limit, and answering reads and syncs. The
device thread feeds it decoded messages and sends back what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from fabric.errors import FabricError, ProtocolError, QuotaExceeded, RemoteError, SessionLost
from fabric.ops import OPS, RANDOM_OPS
from fabric.protocol import Kind, Message
from fabric.tensor import decode_index


@dataclass
class SessionState:
    id: int
    client: str
    tensors: dict[int, np.ndarray] = field(default_factory=dict)
    poisoned: dict[int, dict[str, Any]] = field(default_factory=dict)  # id -> wire error
    unreported: list[dict[str, Any]] = field(default_factory=list)  # for the next sync
    resident: int = 0  # bytes held in ``tensors``
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    ops: int = 0


def _scalar(arg: list[Any]) -> Any:
    return arg[0] if len(arg) == 1 else np.dtype(arg[1]).type(arg[0])


class Executor:
    """The sessions of one device and the messages addressed to them."""

    def __init__(self, device: Any, memory_limit: int | None = None) -> None:
        self.device = device
        self.memory_limit = memory_limit
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
            if message.kind == Kind.SUBMIT:
                return []  # nothing to answer; the next request reports the lost session
            return [_reply_error(message, SessionLost(
                f"Session {message.session:#x} is not open on this worker: open a new "
                "session.", session=message.session))]
        return handler(self, message)

    # -- session life ----------------------------------------------------------------------

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

    def close_all(self) -> None:
        """Forget every session (the broker that knew them is gone)."""
        self.sessions.clear()

    # -- ops ------------------------------------------------------------------------------

    def _submit(self, message: Message) -> list[Message]:
        session = self.sessions[message.session]
        ops, free = message.body.get("ops", []), message.body.get("free", [])
        if not isinstance(ops, list) or not isinstance(free, list):
            return [_reply_error(message, ProtocolError("SUBMIT needs lists 'ops' and 'free'."))]
        for op in ops:
            self._run(session, op, message.buffers)
        for tensor_id in free:
            self._drop(session, tensor_id)
        return []

    def _store(self, session: SessionState, tensor_id: int, array: np.ndarray) -> None:
        self._drop(session, tensor_id)
        if self.memory_limit is not None and session.resident + array.nbytes > self.memory_limit:
            raise QuotaExceeded(
                f"The op needs {array.nbytes} more bytes but the session already holds "
                f"{session.resident} of its {self.memory_limit}-byte limit: free tensors "
                "(del them) or ask for a larger --memory-limit.",
                limit=self.memory_limit, resident=session.resident)
        session.tensors[tensor_id] = array
        session.resident += array.nbytes

    def _drop(self, session: SessionState, tensor_id: Any) -> None:
        array = session.tensors.pop(tensor_id, None)
        if array is not None:
            session.resident -= array.nbytes
        session.poisoned.pop(tensor_id, None)

    def _run(self, session: SessionState, op: Any, buffers: Any) -> None:
        session.ops += 1
        try:
            name, out, args, params = op
        except (TypeError, ValueError):
            session.unreported.append(ProtocolError(f"Malformed op {op!r}.").to_wire())
            return
        try:
            if name == "seed":
                session.rng = np.random.default_rng(params["seed"])
                return
            inputs = []
            for arg in args:
                if type(arg) is int:
                    if arg in session.poisoned:  # poison flows to everything downstream
                        session.poisoned[out] = session.poisoned[arg]
                        return
                    inputs.append(session.tensors[arg])
                else:
                    inputs.append(None if arg is None else _scalar(arg))
            self._store(session, out, self._compute(session, name, inputs, params, buffers))
        except Exception as exc:  # any failure of the op becomes the poison of its output
            self._drop(session, out)
            if isinstance(exc, FabricError):
                error = exc.to_wire()
                error["details"].update(op=name, tensor=out)
            else:
                error = RemoteError(
                    f"{name} failed on device {self.device.index}: {type(exc).__name__}: "
                    f"{exc}", op=name, tensor=out).to_wire()
            session.poisoned[out] = error
            session.unreported.append(error)

    def _compute(self, session: SessionState, name: str, inputs: list[Any],
                 params: dict[str, Any], buffers: Any) -> np.ndarray:
        if name == "put":
            return np.frombuffer(buffers[params["buffer"]], dtype=np.dtype(params["dtype"])) \
                .reshape(params["shape"])
        if name == "getitem":
            params = {"index": decode_index(params["index"])}
        elif name in RANDOM_OPS:
            params = {**params, "rng": session.rng}
        elif type(params.get("axis")) is list:  # msgpack sent the axis tuple as a list,
            params = {**params, "axis": tuple(params["axis"])}  # which numpy refuses
        return np.asarray(self.device.run(OPS[name], inputs, params))

    # -- requests -------------------------------------------------------------------------

    def _request(self, message: Message) -> list[Message]:
        session = self.sessions[message.session]
        handler = self._requests.get(message.body.get("op"))
        if handler is None:
            return [_reply_error(message, ProtocolError(
                f"Unknown request {message.body.get('op')!r}."))]
        return handler(self, session, message)

    def _sync(self, session: SessionState, message: Message) -> list[Message]:
        if session.unreported:
            error = session.unreported[0]
            session.unreported.clear()
            return [Message(Kind.REPLY, message.session, message.request, {"error": error})]
        return [Message(Kind.REPLY, message.session, message.request, {"ok": True})]

    def _read(self, session: SessionState, message: Message) -> list[Message]:
        tensor_id = message.body.get("id")
        if tensor_id in session.poisoned:
            error = session.poisoned[tensor_id]
            if error in session.unreported:
                session.unreported.remove(error)
            return [Message(Kind.REPLY, message.session, message.request, {"error": error})]
        array = session.tensors.get(tensor_id)
        if array is None:
            return [_reply_error(message, ProtocolError(
                f"Tensor {tensor_id} does not exist in this session."))]
        shape = list(array.shape)
        flat = np.ascontiguousarray(array).reshape(-1)
        return [Message(Kind.REPLY, message.session, message.request,
                        {"dtype": array.dtype.str, "shape": shape}, (flat.view(np.uint8),))]

    def _stats(self, session: SessionState, message: Message) -> list[Message]:
        return [Message(Kind.REPLY, message.session, message.request, {
            "tensors": len(session.tensors), "resident_bytes": session.resident,
            "ops": session.ops, "poisoned": len(session.poisoned),
            "device_sessions": len(self.sessions),
            "device_resident_bytes": sum(s.resident for s in self.sessions.values())})]

    _requests: dict[str, Callable[..., list[Message]]] = {
        "sync": _sync, "read": _read, "stats": _stats}
    _handlers = {Kind.OPEN: _open, Kind.CLOSE: _close, Kind.SUBMIT: _submit,
                 Kind.REQUEST: _request}


def _error(message: Message, error: FabricError, kind: Kind = Kind.ERROR) -> Message:
    return Message(kind, message.session, message.request, error.to_wire())


def _reply_error(message: Message, error: FabricError) -> Message:
    return Message(Kind.REPLY, message.session, message.request, {"error": error.to_wire()})
