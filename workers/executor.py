"""A device's sessions, sans I/O: what a worker does with each message for one device.

Rule: every rule about a session's life on the worker lives here: open, close, running its
ops in submission order, poisoning the outputs of an op that fails (and of every op that
reads a poisoned tensor), memory (the per-session ``--memory-limit`` and this device's part
of the worker's ``MemoryBudget``, both checked before an op allocates: ``workers.memory``),
and answering reads and syncs. The device thread feeds it decoded messages and sends back
what it returns.

Warnings: numpy's floating-point warnings (divide by zero, overflow, invalid value) of a
session's ops are kept per session (at most ``MAX_WARNINGS`` distinct ones, the rest
counted) and carried back in the session's next REPLY. The device thread runs in
``floating_point_errors()``: numpy, which checks the FPU's flags after every ufunc anyway,
then calls ``_on_float_error`` instead of printing on the worker's stderr; nothing runs per op
that warns nothing. The callback finds the op from the executor's own frames: it reads
``Executor._run``'s locals by their names (``RUN_LOCALS``), so that loop pays nothing per op
to say which op runs; renaming one of them there means renaming it in ``RUN_LOCALS`` too
(tests/unit/test_executor.py fails until then).

The device is reached only through the ``Backend`` contract (``backends.base``). Telemetry:
a device counts its own work (``DEVICE_COUNTERS``: ops it fused, expressions it evaluated);
what that grows by while one session's message is handled is credited to that session.
"""

from __future__ import annotations

import math
import sys
from time import perf_counter
from types import FrameType
from typing import Any, Callable, Iterable

import numpy as np

from fabric.core import cross_memory
from fabric.core.errors import FabricError, ProtocolError, RemoteError, ReplyLost, SessionLost
from fabric.core.flow import CREDIT_EVERY
from fabric.core.ops import NO_PARAMS, OPS, RANDOM_OPS, WRITES_IN_PLACE
from fabric.core.protocol import Kind, Message, reply_error, reply_to
from fabric.core.resume import DIGEST_BYTES, batch_seq, digest, new_secret
from fabric.core.wire import (MAX_WARNINGS, DeviceWarning, decode_index, decode_params,
                              decode_scalar, device_dtype, dtype_name, parse_op, require_ints)

from . import device_pool, shared_memory
from .admission import Admission
from .backends.base import Backend, DeferredError, DeferredValue, QueuedError, Value
from .batch_graphs import BatchGraphs, BatchOps
from .device_session import DeviceSession
from .elision import ELIDE_FROM_ELEMENTS, run_elided
from .in_place import write_in_place
from .lent_memory import LentMemory, read_lent
from .memory import BOUND_PER_ELEMENT, SAME_SIZE_OPS, MemoryBudget
from .registered_graphs import GraphOps, SessionGraphs, plan_op
from .session_moves import SessionMoves, expire_early
from .tally import DeviceTally

# For a device's ops on fewer than its ``plain_below`` elements, an op without params is this
# call, its result made an array. (Random ops are not here: they always take the session's
# generator.)
_PLAIN_IMPLS = {name: op.impl for name, op in OPS.items() if name not in RANDOM_OPS}
# The locals of ``Executor._run`` that ``_running_op`` reads from its frame while an op runs:
# the session, the op's name, the tensor it makes, and its params (a graph call's graph id).
RUN_LOCALS = ("session", "name", "out", "params")


class Executor(GraphOps, Admission, BatchOps, SessionMoves):
    """The sessions of one device and the messages addressed to them."""

    def __init__(self, device: Backend, memory_limit: int | None = None,
                 budget: MemoryBudget | None = None,
                 sharing: shared_memory.HostSharing | None = None) -> None:
        self.device = device
        self.memory_limit = memory_limit  # per session; the budget is the worker's
        self.allowance = (budget or MemoryBudget(None)).allowance()
        self.lent = LentMemory(self.allowance)  # tensors moved by memory, till read
        self.sessions: dict[int, DeviceSession] = {}
        self._plain_impls = _PLAIN_IMPLS if device.plain_below else {}
        self.tally = DeviceTally()  # what the device did, for the worker's heartbeats
        # shared memory with clients on this host: what the worker's options allow, and its
        # own pool for uploads (``device_pool.offer``), and what wakes the device's thread
        # once a segment of it was made (set by that thread: ``workers.lane_io``)
        self.sharing = sharing or shared_memory.HostSharing()
        self.slots: Any = None
        self.wake: Callable[[], None] | None = None
        # batches seen again, run as one graph, on a device that compiles (``batch_graphs``)
        self.batches = BatchGraphs() if device.compiles_batches else None
        # A worker of a broker pair keeps each session's recent replies, for a client that
        # sends a request again after a takeover (``fabric.core.resume``); about a
        # microsecond a request, which a single broker's worker does not pay.
        self.records_replies = False

    def handle(self, message: Message) -> list[Message]:
        """Apply one message; return the replies to send to the broker."""
        handler = self._handlers.get(message.kind)
        if handler is None:
            return [_error(message, ProtocolError(
                f"A worker does not accept {message.kind.name} messages."))]
        session = self.sessions.get(message.session)
        if session is None and message.kind != Kind.OPEN:
            if message.kind == Kind.CLOSE:
                return [Message(Kind.CLOSED, message.session, message.request)]
            if message.kind in (Kind.SUBMIT, Kind.TRANSFER):
                return []  # nothing to answer; the next request reports the lost session
            return [reply_error(message, SessionLost(
                f"Session {message.session:#x} is not open on this worker: open a new "
                "session.", session=message.session))]
        device = self.device
        if session is None or not device.counts_work:
            # (its counters read as attributes: a call costs more here)
            return handler(self, message)
        fused, evaluated = device.ops_fused, device.expressions_evaluated
        replies = handler(self, message)
        if device.ops_fused != fused or device.expressions_evaluated != evaluated:
            counters = session.counters
            counters["ops_fused"] += device.ops_fused - fused
            counters["expressions_evaluated"] += device.expressions_evaluated - evaluated
        return replies

    # -- session life ----------------------------------------------------------------------

    def _open(self, message: Message) -> list[Message]:
        if message.session in self.sessions:
            return [_error(message, ProtocolError(
                f"Session {message.session:#x} is already open on this device."),
                kind=Kind.REJECT)]
        limit = message.body.get("max_message_bytes")
        owner = message.body.get("owner", b"")
        secret = new_secret()  # (its digest is kept; the secret goes to the client)
        self.sessions[message.session] = DeviceSession(
            message.session, str(message.body.get("client", "")),
            limit if type(limit) is int and limit > 0 else None,
            graphs=SessionGraphs(self.tally),
            owner=owner if isinstance(owner, bytes) and len(owner) == DIGEST_BYTES else b"",
            secret_digest=digest(secret))
        return [Message(Kind.OPENED, message.session, message.request, {"secret": secret})]

    def _close(self, message: Message) -> list[Message]:
        session = self.sessions.pop(message.session)
        shared_memory.closed(self, session)
        self.allowance.refund(session, session.resident)
        self.allowance.held -= session.replies.nbytes
        self.lent.expire()
        self.allowance.settle()
        return [Message(Kind.CLOSED, message.session, message.request)]

    def floating_point_errors(self) -> np.errstate:
        """numpy's error state for the thread that runs this device (numpy keeps it per
        thread): divide by zero, overflow and invalid value call ``_on_float_error`` instead
        of warning; underflow stays ignored, as numpy's default says."""
        return np.errstate(call=self._on_float_error, divide="call", over="call",
                           invalid="call", under="ignore")

    def _on_float_error(self, kind: str, flag: int) -> None:
        """numpy's callback for an op that hit a floating-point error: keep numpy's warning
        (``kind`` is "divide by zero", ...) for the op's session, once per op."""
        running = _running_op(sys._getframe(1))
        if running is None:  # (nothing computes here outside an op)
            return
        session, name, out, graph, graph_op = running
        warning = DeviceWarning(f"{kind} encountered in {name}", out, graph, graph_op)
        if warning in session.warnings:
            return
        if len(session.warnings) < MAX_WARNINGS:
            session.warnings[warning] = None
        else:
            session.warnings_dropped += 1

    def close_all(self) -> None:
        """Forget every session (the broker that knew them is gone); the device's own shared
        memory still counts (``device_pool.DevicePool``)."""
        for session in self.sessions.values():
            shared_memory.closed(self, session)
        self.sessions.clear()
        self.allowance.held = self.lent.nbytes  # (kept past their sessions: lent_memory)
        if self.slots is not None:
            self.slots.recount()
        self.allowance.settle()

    # -- ops ------------------------------------------------------------------------------

    def _submit(self, message: Message) -> list[Message]:
        session = self.sessions[message.session]
        seq = batch_seq(message.body)
        if seq is not None and seq <= session.submits:
            # Sent again by a client that resumed the session (``fabric.core.resume``): it ran
            return [Message(Kind.CREDIT, session.id, 0, {"done": session.submits})]
        session.submits += 1  # (a malformed one too: the client counted it)
        credit = ([Message(Kind.CREDIT, session.id, 0, {"done": session.submits})]
                  if session.submits % CREDIT_EVERY == 0 else [])
        ops = message.body.get("ops", [])
        if not isinstance(ops, list):
            return [reply_error(message, ProtocolError("SUBMIT needs a list 'ops'.")), *credit]
        started, ran = perf_counter(), session.ops
        if self.batches is None or not self._replayed(session, ops):
            self._run(session, ops, message.buffers)
        if self.device.queues:
            self._finish(session, ops)
        self.tally.ran(session.ops - ran, perf_counter() - started)
        if session.slots_used:  # its client reuses the slots once it hears this batch ran
            session.slots_used = False
            credit = [Message(Kind.CREDIT, session.id, 0, {"done": session.submits})]
        self.allowance.settle()
        outgoing, session.outgoing = session.outgoing, []
        return outgoing + credit

    def _finish(self, session: DeviceSession, ops: list[Any]) -> None:
        """Wait for what the batch's ``ops`` queued on the device. An error the device reports
        only then (CUDA's asynchronous errors) poisons every tensor the batch made, named
        after the op the device attributes it to (``QueuedError``)."""
        try:
            self.device.finish()
        except QueuedError as exc:
            made = [op[0] if type(op[0]) is int else op[1] for op in ops
                    if type(op) is list and len(op) > 1]
            if made:
                self._poison(session, made, self._op_error(exc.ops, made[0], exc.cause))

    def _store(self, session: DeviceSession, tensor_id: int, array: Value) -> None:
        """Hold ``array`` (admitted already: ``_admit``, ``_require``) as ``tensor_id``."""
        if tensor_id in session.tensors or tensor_id in session.poisoned:  # (an id used again)
            self._drop(session, (tensor_id,))
        session.tensors[tensor_id] = array
        self.allowance.charge(session, array.nbytes)

    def _drop(self, session: DeviceSession, tensor_ids: Iterable[Any]) -> None:
        tensors, poisoned = session.tensors, session.poisoned
        for tensor_id in tensor_ids:
            array = tensors.pop(tensor_id, None)
            if array is not None:
                self.allowance.refund(session, array.nbytes)
            if poisoned:
                poisoned.pop(tensor_id, None)

    def _run(self, session: DeviceSession, ops: list[Any], buffers: Any) -> None:
        # A SUBMIT's ops and frees (tensor ids), in order. This loop bounds the op rate (bench
        # W1): the commonest path, an op of the table, is kept short, and runs without a Python
        # call of ours (a call per op, to run it and to store its result, cost 7% of the
        # worker's work). A warning's callback reads this frame's locals ``RUN_LOCALS`` (the
        # session, and the op's name, out and params): rename one here, rename it there.
        tensors, poisoned, store = session.tensors, session.poisoned, self._store
        plain_impls, special_ops = self._plain_impls, self._special_ops
        admit, allowance, limit = self._admit, self.allowance, self.memory_limit
        same_size, plain_below, small = SAME_SIZE_OPS, self.device.plain_below, self.device.small
        ndarray = np.ndarray  # (a local: its look-up was 2% of a W1 op)
        freed = 0
        for position, op in enumerate(ops):
            if type(op) is int:  # a tensor the client let go, freed at the point it did so
                # that the next op's result can take its memory, still in cache (inline, as
                # _drop does it: a call of _drop here cost 8% of a W1 op)
                array = tensors.pop(op, None)
                if array is not None:
                    nbytes = array.nbytes  # (Allowance.refund, inline: see below)
                    session.resident -= nbytes
                    allowance.held -= nbytes
                if poisoned:
                    poisoned.pop(op, None)
                freed += 1
                continue
            try:  # (fabric.core.wire.parse_op's checks, inline: it runs for every op)
                out = op[0]  # (one statement each: a star unpack, or a tuple's, cost 3%)
                if type(out) is int:  # the compact form, [out, name, *args]: no params
                    name = op[1]
                    args = op[2:]
                    params = NO_PARAMS
                else:
                    name, out, args, params = op
                    if type(out) is not int:
                        raise TypeError
            except (TypeError, ValueError, LookupError):
                try:
                    parse_op(op)  # (raises, with the wire's own words)
                except ProtocolError as exc:
                    session.unreported.append(exc.to_wire())
                continue
            try:
                impl = None if params else plain_impls.get(name)
                if impl is None and name == "getitem" and len(args) == 1 and len(params) == 1 \
                        and type(args[0]) is int and type(tensors[args[0]]) is ndarray:
                    # a basic index: a view, which allocates nothing, taken without the calls
                    # and the admission around an op of the table (a stencil's every operand
                    # is one)
                    result = tensors[args[0]][decode_index(params.get("index"))]
                else:
                    if impl is None:
                        if name in WRITES_IN_PLACE:
                            inputs = value = result = None  # (to write_in_place, a name left
                            # to a view of the target, from the last op, is a view in use)
                            if write_in_place(session, name, out, args, params):
                                continue
                        if name in special_ops:
                            special_ops[name](self, session, out, args, params)
                            continue
                    inputs, elements, shape = [], 1, None
                    for arg in args:  # (a poisoned input is not held: its lookup fails, below)
                        if type(arg) is int:
                            value = tensors[arg]
                            inputs.append(value)
                            if shape is None:
                                shape, elements = value.shape, value.size
                            elif value.shape != shape:  # (an input of the first's shape adds
                                elements *= value.size  # nothing to what a broadcast makes)
                        else:  # (a float, the commonest scalar, as it is: no call)
                            inputs.append(arg if type(arg) is float else decode_scalar(arg))
                    if not (elements and name in same_size and limit is None  # (_admit's common
                            and allowance.held + BOUND_PER_ELEMENT * elements  # case, inline)
                            <= allowance.granted):
                        admit(session, name, inputs, params, elements)  # before it allocates
                    if impl is None or elements >= plain_below and not small(inputs):
                        store(session, out, self._compute(session, name, inputs, params, buffers))
                        continue
                    elif elements < ELIDE_FROM_ELEMENTS or type(impl) is not np.ufunc:
                        result = impl(*inputs)  # the device's own run, without the calls around it
                    else:  # (numpy's elision of a large temporary: workers.elision)
                        value = result = array = None  # (no name here for an input: it counts
                        # references; array: the last tensor freed, perhaps one an op reused)
                        result = run_elided(impl, ops, position, args, inputs)
                if type(result) is not ndarray:
                    result = np.asarray(result)
                if out not in tensors and out not in poisoned:
                    tensors[out] = result  # _store's common case, inline
                    # Allowance.charge, inline: its call cost 4% of the worker's W1 op
                    # (bench/instructions.py --servers: 18,276 instructions, 17,497 inline)
                    nbytes = result.nbytes
                    session.resident += nbytes
                    allowance.held += nbytes
                else:
                    store(session, out, result)
            except Exception as exc:  # any failure of the op becomes the poison of its output
                missing = _missing_input(exc, args, tensors)
                if missing is None:
                    self._fail(session, name, out, exc)
                elif missing in poisoned:  # poison flows to everything downstream, unreported
                    poisoned[out] = poisoned[missing]
                else:
                    self._fail(session, name, out, ProtocolError(
                        f"{name} read tensor {missing}, which does not exist in this session "
                        "(freed, or never made): send ops only on the session's tensors."))
        session.ops += len(ops) - freed

    def _seed(self, session: DeviceSession, out: int, args: list[Any],
              params: dict[str, Any]) -> None:
        session.rng = np.random.default_rng(params["seed"])

    def _send(self, session: DeviceSession, out: int, args: list[Any],
              params: dict[str, Any]) -> None:
        session.outgoing.append(self._transfer(session, args[0], params))

    # Ops that are not the op table's: they act on the session, and make no tensor of theirs.
    _special_ops: dict[str, Callable[..., None]] = {
        "seed": _seed, "send": _send, "release": SessionMoves._release, **GraphOps._graph_ops}

    def _materialize(self, session: DeviceSession, tensor_id: Any) -> None:
        """Compute a value the device deferred (the numexpr device's fused chains)."""
        value = session.tensors.get(tensor_id)
        if isinstance(value, DeferredValue):
            try:
                session.tensors[tensor_id] = self.device.materialize(value)
            except Exception as exc:
                self._fail(session, value.op, tensor_id, exc)

    def _fail(self, session: DeviceSession, name: str, out: Any, exc: Exception) -> None:
        """Poison ``out`` with op ``name`` failing. Where a fused chain failed, the op that
        failed in it is named, the tensors holding its result are poisoned too, and its error
        is reported once (met again, it flows as poison does)."""
        if not isinstance(exc, DeferredError):
            self._poison(session, (out,), self._op_error(name, out, exc))
            return
        failed = exc.deferred
        held = tuple(t for t, v in session.tensors.items() if v is failed and t != out)
        known = failed.error is not None
        if not known:
            failed.error = self._op_error(name, (*held, out)[0], exc)
        self._poison(session, (*held, out), failed.error, report=not known)

    def _op_error(self, name: str, tensor: int, exc: Exception) -> dict[str, Any]:
        """The wire error for op ``name`` (making ``tensor``) failing with ``exc``."""
        if isinstance(exc, DeferredError):  # a fused chain failed at this op
            name, exc = exc.deferred.op, exc.cause
        if isinstance(exc, FabricError):
            error = exc.to_wire()
            error["details"].update(op=name, tensor=tensor)
            return error
        return RemoteError(f"{name} failed on device {self.device.index}: "
                           f"{type(exc).__name__}: {exc}", op=name, tensor=tensor).to_wire()

    def _poison(self, session: DeviceSession, outs: Any, error: dict[str, Any],
                report: bool = True) -> None:
        """Make ``error`` the value of every tensor in ``outs``; report it at the next sync."""
        self._drop(session, outs)
        for out in outs:
            session.poisoned[out] = error
        if report:
            session.unreported.append(error)

    def _compute(self, session: DeviceSession, name: str, inputs: list[Any],
                 params: dict[str, Any], buffers: Any) -> Value:
        if name == "put":
            return self.arrived(session, "put (an upload)", params, buffers, params.get("buffer"))
        if params:
            params = decode_params(name, params)
        if name in RANDOM_OPS:
            params = {**params, "rng": session.rng}
        return self.device.run(OPS[name], inputs, params)  # an array, or a deferred value

    def arrived(self, session: DeviceSession, what: str, params: dict[str, Any], buffers: Any,
                index: Any) -> Value:
        """The device's array of an upload or a tensor moved here (``params``: the put's or
        the TRANSFER's; ``what`` names it in a QuotaExceeded), admitted against the session's
        memory first: a view of the frame ``buffers[index]`` that brought it, allocating
        nothing; or out of shared memory, counted, where the device keeps its own slot as it
        is and copies the client's (which the client reuses once this ran); or read out of
        the client's own memory (a put's ``"from"``), or the sending worker's (a TRANSFER's
        ``"lent"``)."""
        if "from" in params or "lent" in params:  # (read here: one copy)
            if "from" in params:  # (its client waits for this batch's CREDIT, even where
                session.slots_used = True  # the put fails)
            shape, dtype = shared_memory.declared(params)
            nbytes = math.prod(shape) * dtype.itemsize
            self._require(session, what, nbytes, nbytes)
            into = cross_memory.array_to_read_into(shape, dtype)
            array = shared_memory.read_from_client(session, params["from"], into,
                                                   self.sharing.copies) if "from" in params \
                else read_lent(params["lent"], into, self.sharing)
            self.tally.came_shared(nbytes)
            return self.device.from_host(array)
        shared = "shm" in params
        array = shared_memory.uploaded(session, params) if shared else np.frombuffer(
            buffers[index], dtype=device_dtype(params["dtype"])).reshape(params["shape"])
        self._require(session, what, array.nbytes, array.nbytes)
        if shared:
            self.tally.came_shared(array.nbytes)
            array = shared_memory.owned(self.sharing.copies, array)
        return self.device.from_host(array)

    # -- requests -------------------------------------------------------------------------

    def _request(self, message: Message) -> list[Message]:
        session = self.sessions[message.session]
        if message.body.get("again"):  # sent again by a client that resumed the session
            answered = session.replies.get(message.request)
            if answered is not None:  # (answered before: not run twice)
                return answered
            if session.replies.lost(message.request, session.submits):
                return [reply_error(message, ReplyLost(
                    "The answer to this request was lost with the broker this session was "
                    "resumed past, was too large to keep, and the session has run ops since: "
                    "read the tensor again."))]
        replies = self._run_request(session, message)
        if self.records_replies:
            nbytes = sum(memoryview(b).nbytes for reply in replies for b in reply.buffers)
            # (the worker's memory budget counts the record, not the session's tensors)
            self.allowance.held += session.replies.keep(
                message.request, replies, nbytes, session.submits,
                room=nbytes == 0 or self.allowance.fits(nbytes))
        return replies

    def _run_request(self, session: DeviceSession, message: Message) -> list[Message]:
        body = message.body
        op = body.get("op")  # (a str: the REQUEST schema says so)
        handler = self._requests.get(op)
        carries = "ops" in body  # the session's batch (a client Session's SUBMIT), run first
        if handler is None or carries and type(body["ops"]) is not list:
            return [reply_error(message, ProtocolError(
                f"Unknown request {op!r}." if handler is None else "'ops' must be a list."))]
        carried = self._submit(message) if carries else []
        tensor_id = body.get("id", 0)
        if type(tensor_id) is not int:  # (tested here first: this is every read's path)
            require_ints(f"A {op} request", id=tensor_id)
        replies = handler(self, session, message)
        if session.warnings and replies:  # (an await answered later carries them then)
            _carry_warnings(session, replies[0])
        return carried + replies if carried else replies

    def _sync(self, session: DeviceSession, message: Message) -> list[Message]:
        for tensor_id in [t for t, v in session.tensors.items() if isinstance(v, DeferredValue)]:
            self._materialize(session, tensor_id)  # "ran everything", errors included
        if session.unreported:
            error = session.unreported[0]
            session.unreported.clear()
            return [reply_to(message, {"error": error})]
        return [reply_to(message, {"ok": True})]

    def _read(self, session: DeviceSession, message: Message) -> list[Message]:
        tensor_id = message.body.get("id")
        array = session.tensors.get(tensor_id)
        if type(array) is not np.ndarray:  # a deferred value, a device's array that lives
            # elsewhere, a poisoned or unknown tensor
            array = self._computed(session, message, tensor_id)
            if type(array) is Message:
                return [array]
            array = self.device.to_host(array)
        shape = list(array.shape)
        dtype = dtype_name(array.dtype)
        flat = np.frombuffer(np.ascontiguousarray(array), np.uint8)  # (whatever the shape)
        expected = (message.body.get("dtype"), message.body.get("shape"))
        if expected == (None, None):  # a reader that wants to be told
            body = {"dtype": dtype, "shape": shape}
        elif expected == (dtype, shape):  # what the client inferred is so: the bytes alone
            body = {}
        else:
            return [reply_error(message, RemoteError(
                f"Tensor {tensor_id} is {dtype} with shape {shape} on the device, but the "
                f"client inferred {expected[0]} with shape {expected[1]}: the client's op table "
                "disagrees with this worker's backend. Report it as a fabric bug, with the "
                "op that made the tensor.", tensor=tensor_id, dtype=dtype, shape=shape))]
        return [reply_to(message, body, (flat,))]

    def _computed(self, session: DeviceSession, message: Message,
                  tensor_id: Any) -> np.ndarray | Message:
        """Tensor ``tensor_id``'s array, computed if deferred; or the reply to ``message``
        that says why there is none (its op's error, reported here, or no such tensor)."""
        self._materialize(session, tensor_id)
        if tensor_id in session.poisoned:
            error = session.poisoned[tensor_id]
            if error in session.unreported:
                session.unreported.remove(error)
            return reply_to(message, {"error": error})
        array = session.tensors.get(tensor_id)
        if array is None:
            return reply_error(message, ProtocolError(
                f"Tensor {tensor_id} does not exist in this session."))
        return array

    def _shape(self, session: DeviceSession, message: Message) -> list[Message]:
        # The shape (and dtype) of a tensor whose op's result depends on the data (a boolean
        # index, np.unique, np.linalg.eig): the client learns it here, and its later reads
        # are checked against it.
        array = self._computed(session, message, message.body.get("id"))
        return [array if type(array) is Message else reply_to(
            message, {"shape": list(array.shape), "dtype": dtype_name(array.dtype)})]

    def _stats(self, session: DeviceSession, message: Message) -> list[Message]:
        expire_early(session)  # (counted in transfers_refused)
        return [reply_to(message, {
            "tensors": len(session.tensors), "resident_bytes": session.resident,
            "ops": session.ops, "poisoned": len(session.poisoned),
            "device_sessions": len(self.sessions),
            "device_resident_bytes": sum(s.resident for s in self.sessions.values()),
            "device_lent_bytes": self.lent.nbytes,
            "transfers_refused": session.transfers_refused, **session.counters,
            **session.graphs.stats(), **(self.batches.stats() if self.batches else {}),
            **self.device.stats()})]

    _requests: dict[str, Callable[..., list[Message]]] = {
        "sync": _sync, "read": _read, "stats": _stats, "await": SessionMoves._await,
        "expect": SessionMoves._expect,
        "shape": _shape, "shm_probe": shared_memory.probe, "read_into": shared_memory.read_into,
        "shm_slot": device_pool.offer, "unpin": shared_memory.unpin}
    _handlers = {Kind.OPEN: _open, Kind.CLOSE: _close, Kind.SUBMIT: _submit,
                 Kind.REQUEST: _request, Kind.TRANSFER: SessionMoves._receive}


def _running_op(frame: FrameType | None) -> tuple[DeviceSession, str, int, Any, Any] | None:
    """The session and op that ``frame`` (numpy's caller) runs for: the op's name, the tensor
    it makes and, inside a graph, the graph's id and the op's index there. Read from the
    frames of ``Executor._run`` (its locals named in ``RUN_LOCALS``) and of a graph's plan;
    only a warning pays for this look."""
    graph_op = None
    while frame is not None:
        if frame.f_code is _RUN_CODE:
            local = frame.f_locals
            session, name, out, params = [local[n] for n in RUN_LOCALS]
            if name != "graph_call":
                return session, name, out, None, None
            graph_id = params.get("graph")
            graph = session.graphs.held.get(graph_id)
            if graph is not None and graph_op is not None:
                name = graph.op_names[graph_op]
            return session, name, out, graph_id, graph_op
        if graph_op is None:
            graph_op = plan_op(frame)
        frame = frame.f_back
    return None


def _carry_warnings(session: DeviceSession, reply: Message) -> None:
    """Move the session's warnings into ``reply``'s body (``fabric.core.wire.DeviceWarning``)."""
    reply.body["warnings"] = [list(w) for w in session.warnings]
    if session.warnings_dropped:
        reply.body["warnings_dropped"] = session.warnings_dropped
    session.warnings.clear()
    session.warnings_dropped = 0


def _error(message: Message, error: FabricError, kind: Kind = Kind.ERROR) -> Message:
    return Message(kind, message.session, message.request, error.to_wire())


def _missing_input(exc: Exception, args: Any, tensors: dict[int, Any]) -> int | None:
    """The input of an op that ``exc`` failed to find among the session's tensors (poisoned,
    freed or never made), if that is what ``exc`` is. The lookup itself is left bare and
    explained here, after the fact: it runs for every input of every op."""
    if type(exc) is KeyError and exc.args and type(exc.args[0]) is int \
            and exc.args[0] in args and exc.args[0] not in tensors:
        return exc.args[0]
    return None


_RUN_CODE = Executor._run.__code__
