"""Graphs on the worker: each session's registered graphs, compiled once, and their calls.

Rule: a graph is checked and compiled once, when it is registered (op names, every local id
defined before it is read, input specs), so a call only checks its bindings and runs the
compiled plan. Every way a call can fail (a graph the session does not hold, bindings of the
wrong count, shape or dtype, an input freed meanwhile, an op failing inside) poisons all of
the call's outputs with an error naming the graph, reported at the next read or sync like
any op's; the session goes on. Intermediate results live only during the call, and each is
dropped as soon as the last op that reads it has run. What a call needs in memory is found at
registration, from the input specs through the op table's shape rules (``need``): every op's
result at once, and one temporary; a call past the session's limit or the worker's budget
is refused with QuotaExceeded before the plan runs.

What a session's cache holds is decided by the client (``fabric.graphs.function``), which mirrors
it and says ``graph_free`` before it registers past the bound; the bound here is the same size
and evicts the least recently used graph only for a client that does not.

A graph holds at most ``MAX_GRAPH_OPS`` ops (``fabric.core.wire``): compiling its plan is one call
of Python's ``compile`` that holds the GIL throughout, so its size bounds how long the device
thread keeps the worker's other threads waiting; a longer registration is refused with a
``GraphError`` naming the bound before anything is built from it.

A graph compiles to a plan, ``plan(inputs, rng) -> outputs`` (arrays in, arrays out; ``rng``
is the session's generator, for random ops), once per signature: a graph is traced for one,
so its registration gives every input's shape and dtype, and the op table's rules give every
op's. The device lowers the ops to steps (``Backend.graph_steps``: by default one resolved
numpy call per op; the numexpr device makes elementwise runs numexpr programs, compiled
then), and ``generate`` writes the steps as straight-line Python, operands bound by position;
a device that compiles makes that plan one executable (``Backend.compile_plan``: the jax
device traces it with ``jax.jit``).
A step whose result is a new array (a ufunc's, a program's) writes it into the buffer of an
argument that dies there, where shape and dtype agree (``out=``), when that buffer is an
intermediate no one else can see: made by such a step, never an input or an output, and read
only by such steps (none of which returns a view of it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable

import msgpack
import numpy as np

from fabric.core.errors import GraphError, ProtocolError
from fabric.core.ops import OPS, RANDOM_OPS, Spec
from fabric.core.wire import (GRAPH_CACHE_SIZE, MAX_GRAPH_OPS, decode_params, decode_scalar,
                              is_wire_scalar, parse_op)

from .backends.base import Backend, Constant, GraphOp, GraphOpError, GraphPlan, GraphStep
from .memory import need
from .tally import DeviceTally

# In a generated plan: the def line, the unpacking of inputs, then op i's step on line 3 + i
# (a step that computes several ops is on its last op's line; the others are blank).
_FIRST_OP_LINE = 3
_PLAN_FILE = "<fabric graph "  # how a generated plan's file name starts


@dataclass
class RegisteredGraph:
    """A graph a session registered: what a call binds, and the plan that runs it."""

    id: int
    name: str
    inputs: list[tuple[tuple[int, ...], np.dtype]]
    outputs: int
    op_names: list[str]
    wire_bytes: int  # what sending its ops one by one would cost
    output_bytes: int = 0  # what a call's outputs hold
    need: int = 0  # the bytes a call is admitted for (memory.need of all its results)
    plan: GraphPlan | None = None
    error: dict[str, Any] | None = None  # a registration that failed: every call raises it
    called: bool = False  # the first call comes with the registration; later ones replay

    def label(self) -> str:
        """How errors name the graph: its function's name and its id."""
        return f"graph {self.name!r} (#{self.id})"

    @property
    def filename(self) -> str:
        """The file name of its generated plan, found again in tracebacks."""
        return f"{_PLAN_FILE}{self.id}>"


def _check(condition: bool, graph_id: Any, what: str) -> None:
    if not condition:
        raise ProtocolError(f"graph_register #{graph_id}: {what}.", graph=graph_id)


def register(params: dict[str, Any], device: Backend) -> RegisteredGraph:
    """Check a ``graph_register`` op's params and compile the graph for ``device``.

    Raises ProtocolError naming what is malformed; a failing device hook raises its error.
    """
    graph_id = params.get("graph")
    _check(type(graph_id) is int, graph_id, "'graph' must be an int")
    ops, inputs, outputs = params.get("ops"), params.get("inputs"), params.get("outputs")
    _check(isinstance(ops, list) and isinstance(inputs, list) and isinstance(outputs, list)
           and outputs, graph_id, "'ops', 'inputs' and 'outputs' must be lists, with at least "
           "one output")
    if len(ops) > MAX_GRAPH_OPS:  # checked before anything is built from them
        raise GraphError(f"graph #{graph_id} has {len(ops)} ops, more than the {MAX_GRAPH_OPS} "
                         "a graph may hold (compiling it would hold the device for seconds): "
                         "trace a smaller function, such as a loop's body called in the loop.",
                         graph=graph_id, ops=len(ops), limit=MAX_GRAPH_OPS)
    try:
        specs = [(tuple(int(n) for n in shape), np.dtype(dtype)) for shape, dtype in inputs]
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"graph_register #{graph_id}: bad input spec: {exc}.",
                            graph=graph_id) from None
    defined = set(range(1, len(specs) + 1))
    for op in ops:
        try:
            name, out, args, op_params = parse_op(op)
        except ProtocolError:
            raise ProtocolError(f"graph_register #{graph_id}: malformed op {op!r}.",
                                graph=graph_id) from None
        _check(name in OPS, graph_id, f"unknown op {name!r}")
        _check(out not in defined, graph_id,
               f"op {name} must define a new local id, not {out!r}")
        _check(isinstance(args, list) and isinstance(op_params, dict), graph_id,
               f"op {name} needs a list of args and a dict of params")
        for arg in args:
            _check(arg in defined if type(arg) is int else is_wire_scalar(arg), graph_id,
                   f"op {name} reads {arg!r}, which is neither a defined local id nor a scalar")
        defined.add(out)
    _check(all(type(o) is int and o in defined for o in outputs), graph_id,
           "every output must be a defined local id")
    graph = RegisteredGraph(graph_id, str(params.get("name", "")), specs, len(outputs),
                            [op[0] for op in ops], len(msgpack.packb(ops)))
    values = _infer(specs, ops)
    made = [values[out] for _, out, _, _ in ops if out in values]
    largest = max((int(np.prod(v.shape)) for v in values.values()), default=0)
    graph.output_bytes = sum(_nbytes(values[o]) for o in outputs if o in values)
    # A call is admitted for every op's result held at once (the most a plan holds) and one
    # temporary.
    graph.need = need(sum(_nbytes(v) for v in made), largest)
    graph_ops = [GraphOp(index, name, out,
                         [a if type(a) is int else Constant(decode_scalar(a)) for a in args],
                         decode_params(name, params) if params else {}, values.get(out))
                 for index, (name, out, args, params) in enumerate(ops)]
    graph.plan = device.compile_plan(
        generate(graph, device.graph_steps(graph_ops, values, outputs), values, outputs),
        graph_ops)
    return graph


def _infer(specs: list[tuple[tuple[int, ...], np.dtype]], ops: list[list[Any]],
           ) -> dict[int, Spec]:
    """The shape and dtype of every local id a call makes, from the op table's rules."""
    values: dict[int, Spec] = {i: Spec(*spec) for i, spec in enumerate(specs, 1)}
    for name, out, args, params in ops:
        try:
            shape, dtype = OPS[name].infer(
                [values[a] if type(a) is int else decode_scalar(a) for a in args],
                decode_params(name, params) if params else {})
        except Exception:  # numpy refuses this op: a call fails there, before the ops after
            break  # it allocate anything, and says so as the op's own error
        values[out] = Spec(shape, np.dtype(dtype))
    return values


def _nbytes(spec: Spec) -> int:
    return int(np.prod(spec.shape)) * spec.dtype.itemsize


def generate(graph: RegisteredGraph, steps: list[GraphStep], specs: dict[int, Spec],
             outputs: list[int]) -> GraphPlan:
    """The plan: one line of straight-line Python per step (on its last op's line), calling
    its function, handing it a dying intermediate's buffer where that is safe (``out=``),
    and deleting what no later step reads.

    Only names made here go into the source; functions and constants reach it through the
    namespace, so nothing from the wire is ever evaluated as code.
    """
    names = {local: f"a{i}" for i, local in enumerate(range(1, len(graph.inputs) + 1))}
    namespace: dict[str, Any] = {}
    last_read = {arg: position for position, step in enumerate(steps) for arg in step.args
                 if type(arg) is int}
    keep = set(names) | set(outputs)
    fresh = {step.out for step in steps if step.fresh} - keep
    reusable = fresh - {arg for step in steps if not step.fresh
                        for arg in step.args if type(arg) is int}
    unpack = "".join(f"{name}, " for name in names.values())
    lines = ["def plan(inputs, rng):", f"    ({unpack}) = inputs"]
    for position, step in enumerate(steps):
        namespace[f"f{position}"] = step.call
        call_args = []
        for place, arg in enumerate(step.args):
            if type(arg) is int:
                call_args.append(names[arg])
            else:
                call_args.append(f"k{position}_{place}")
                namespace[call_args[-1]] = arg.value
        tensors = dict.fromkeys(arg for arg in step.args if type(arg) is int)
        dying = [a for a in tensors if a not in keep and last_read[a] == position]
        buffer = next((a for a in dying if step.fresh and a in reusable
                       and _same_buffer(specs.get(a), specs.get(step.out))), None)
        if buffer is not None:
            call_args.append(f"out={names[buffer]}")
        if len(step.ops) == 1 and graph.op_names[step.ops[0]] in RANDOM_OPS:
            call_args.append("rng=rng")
        dead = sorted(names[a] for a in dying)
        names[step.out] = f"r{position}"
        lines += [""] * (_FIRST_OP_LINE + step.ops[-1] - len(lines) - 1)
        lines.append(f"    r{position} = f{position}({', '.join(call_args)})"
                     + (f"; del {', '.join(dead)}" if dead else ""))
    lines.append(f"    return [{', '.join(names[o] for o in outputs)}]")
    exec(compile("\n".join(lines), graph.filename, "exec"), namespace)
    return namespace["plan"]


def _same_buffer(buffer: Spec | None, result: Spec | None) -> bool:
    """Whether a result of ``result``'s spec can be written into an array of ``buffer``'s (a
    0-d result is a numpy scalar, no buffer)."""
    return (buffer is not None and result is not None and len(buffer.shape) > 0
            and tuple(buffer.shape) == tuple(result.shape) and buffer.dtype == result.dtype)


def plan_op(frame: FrameType) -> int | None:
    """The index of the op a generated plan's ``frame`` is running; None for another frame."""
    if frame.f_code.co_filename.startswith(_PLAN_FILE):
        return frame.f_lineno - _FIRST_OP_LINE
    return None


def failed_op(graph: RegisteredGraph, exc: BaseException) -> tuple[int, BaseException] | None:
    """The index of the op of ``graph``'s generated plan that raised ``exc``, if it was one,
    and the error that op raised."""
    if isinstance(exc, GraphOpError):  # a step of several ops named which one failed
        return exc.index, exc.cause
    tb, index = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == graph.filename:
            index = tb.tb_lineno - _FIRST_OP_LINE
        tb = tb.tb_next
    return None if index is None else (index, exc)


class SessionGraphs:
    """One session's graphs, least recently used first, and what they saved it."""

    def __init__(self, tally: DeviceTally | None = None, limit: int = GRAPH_CACHE_SIZE) -> None:
        self.limit = limit
        self.tally = tally or DeviceTally()  # its device's, which counts every session's too
        self.held: OrderedDict[int, RegisteredGraph] = OrderedDict()
        self.registrations = 0
        self.replays = 0
        self.bytes_saved = 0

    def add(self, graph: RegisteredGraph) -> None:
        """Hold ``graph`` (replacing one with its id), evicting past the bound."""
        self.held.pop(graph.id, None)
        self.held[graph.id] = graph
        self.registrations += 1
        self.tally.graph_registrations += 1
        while len(self.held) > self.limit:
            self.held.popitem(last=False)

    def lookup(self, graph_id: Any, call_bytes: int) -> RegisteredGraph | None:
        """The graph a call names, marked most recently used; counts a replay."""
        graph = self.held.get(graph_id)
        if graph is not None:
            self.held.move_to_end(graph_id)
            if graph.called:
                self.replays += 1
                self.tally.graph_replays += 1
                self.bytes_saved += graph.wire_bytes - call_bytes
            graph.called = True
        return graph

    def stats(self) -> dict[str, int]:
        """The session's graph telemetry, as ``session.stats()`` shows it."""
        return {"graphs": len(self.held), "graph_registrations": self.registrations,
                "graph_replays": self.replays, "bytes_saved_by_replay": self.bytes_saved}


class _Inherited(Exception):
    """A call's outputs take an error already reported: a poisoned input, a failed registration."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error)
        self.error = error


class GraphOps:
    """The executor's graph ops, mixed into ``Executor``: register, call, free."""

    def _graph_register(self, session: Any, out: int, args: list[Any],
                        params: dict[str, Any]) -> None:
        try:
            graph = register(params, self.device)
        except Exception as exc:
            if type(params.get("graph")) is not int:
                raise  # nothing to hold: the op's error is all there is
            # Held anyway, broken: the client counts it as held, and its calls say why.
            graph = RegisteredGraph(params["graph"], str(params.get("name", "")), [], 0, [],
                                    0, error=self._op_error("graph_register", 0, exc))
            graph.error["message"] += f" (registering {graph.label()})"
            graph.error["details"].update(graph=graph.id, graph_name=graph.name)
            session.unreported.append(graph.error)
        session.graphs.add(graph)

    def _graph_free(self, session: Any, out: int, args: list[Any],
                    params: dict[str, Any]) -> None:
        session.graphs.held.pop(params.get("graph"), None)

    def _graph_call(self, session: Any, out: int, args: list[Any],
                    params: dict[str, Any]) -> None:
        count = params.get("outputs")
        if type(count) is not int or count < 1:
            raise ProtocolError("graph_call needs an int 'outputs' count of at least 1.")
        outs = range(out, out + count)
        graph_id = params.get("graph")
        graph = session.graphs.lookup(graph_id, len(msgpack.packb(
            ["graph_call", out, args, params])))
        try:
            for tensor_id, array in zip(outs, self._replay(session, graph, args, count)):
                self._store(session, tensor_id, self.device.held(array))
        except _Inherited as inherited:
            self._poison(session, outs, inherited.error, report=False)
        except Exception as exc:
            label = graph.label() if graph is not None else f"graph #{graph_id}"
            failed = None if graph is None else failed_op(graph, exc)
            if isinstance(exc, GraphError):
                error = GraphError(f"The {label} {exc.message}", op="graph_call",
                                   tensor=out).to_wire()
            elif failed is not None:
                index, cause = failed
                error = self._op_error(graph.op_names[index], out, cause)
                error["message"] += f" (op {index} of {label})"
                error["details"]["graph_op"] = index
            else:  # a device's plan failed, or the outputs are past the memory limit
                error = self._op_error("graph_call", out, exc)
                error["message"] += f" (calling {label})"
            error["details"].update(graph=graph_id, graph_name=graph and graph.name)
            self._poison(session, outs, error)

    def _replay(self, session: Any, graph: RegisteredGraph | None, args: list[Any],
                count: int) -> list[Any]:
        """The outputs of one call of ``graph`` on the tensors ``args``."""
        if graph is None:
            raise GraphError("is not held by this session on the worker (freed, or never "
                             "registered): register it again.")
        if graph.error is not None:
            raise _Inherited(graph.error)
        if len(args) != len(graph.inputs) or count != graph.outputs:
            raise GraphError(f"takes {len(graph.inputs)} inputs and gives {graph.outputs} "
                             f"outputs, but the call bound {len(args)} and asked for {count}.")
        inputs = []
        for position, (arg, (shape, dtype)) in enumerate(zip(args, graph.inputs), 1):
            array = session.tensors.get(arg) if type(arg) is int else None
            if array is None:
                if type(arg) is int and arg in session.poisoned:  # poison flows through a
                    raise _Inherited(session.poisoned[arg])  # call as through an op
                raise GraphError(f"reads tensor {arg!r} as input {position}, but it does not "
                                 "exist in this session (freed before the call?).")
            if array.shape != shape or array.dtype != dtype:
                raise GraphError(f"takes a {shape} {dtype} tensor as input {position}, but "
                                 f"tensor {arg} is {array.shape} {array.dtype}: trace the "
                                 "function for this signature.")
            inputs.append(array)
        self._require(session, f"the {graph.label()}", graph.output_bytes, graph.need)
        return graph.plan(inputs, session.rng)

    _graph_ops: dict[str, Callable[..., None]] = {
        "graph_register": _graph_register, "graph_call": _graph_call, "graph_free": _graph_free}
