"""Graphs on the client: trace a function of tensors once per input signature, then replay it.

Rule: a graph is made only by running the user's function on placeholder tensors of a
``Tracer``, an array namespace whose stream records the ops it is given (the tracer is the
stream's sink) and never sends them; so
a graph's ops, shapes, dtypes and errors are exactly those of eager execution, and there is
no second op API to keep in step. A trace depends on the inputs' shapes and dtypes and on
the non-tensor arguments (constants), never on tensor values: anything that needs a value
(``bool(t)``, ``float(t)``, ``t.numpy()``, ``if t > 0:``) raises ``TraceError`` at trace time.

The worker keeps each session's graphs in a bounded cache. Its contents are decided here,
by the client, which knows them without asking: every session mirrors them in an LRU of at
most ``GRAPH_CACHE_SIZE`` graph ids, evicts from it with an explicit ``graph_free`` op and
registers what it does not hold in the same op stream as the call. The worker's own bound is
the same size, so a conforming client never makes it evict anything by itself.

The graph ops travel in the ordinary SUBMIT stream, run in order with every other op; their
form is ``fabric.core.wire``'s.
"""

from __future__ import annotations

import functools
import itertools
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from fabric.arrays.creation import ArrayNamespace
from fabric.arrays.origins import PACKAGE_DIR, issued_at, origin_line
from fabric.arrays.tensor import Tensor
from fabric.core.device import Device
from fabric.core.errors import TraceError
from fabric.core.ops import OPS, Spec
from fabric.core.wire import GRAPH_CACHE_SIZE, MAX_GRAPH_OPS
from fabric.mesh.sharded import ShardedTensor
from fabric.mesh.sharded_functions import call_per_shard

TRACE_CACHE_SIZE = 256  # traces a function keeps (least recently called go; traced again)

_graph_ids = itertools.count(1)  # unique in this process, so across all its sessions
_TRACE_DEVICE = Device(index=-1, worker="trace", backend="trace", settings={})


# -- argument and result structures ---------------------------------------------------------

def _flatten(tree: Any, leaves: list[Any]) -> Any:
    """Append ``tree``'s leaves to ``leaves``; return its hashable structure."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind, tuple([_flatten(item, leaves) for item in tree])
    if kind is dict:
        return dict, tuple([(key, _flatten(value, leaves)) for key, value in tree.items()])
    leaves.append(tree)
    return None


def _unflatten(structure: Any, leaves: Iterator[Any]) -> Any:
    """The inverse of ``_flatten``."""
    if structure is None:
        return next(leaves)
    kind, children = structure
    if kind is dict:
        return {key: _unflatten(child, leaves) for key, child in children}
    return kind([_unflatten(child, leaves) for child in children])


@dataclass(frozen=True)
class _Constant:
    """A non-tensor leaf of a traced function's result, returned as it is by every call."""

    value: Any


# -- tracing -------------------------------------------------------------------------------

# What a traced function did when it needed a tensor's value, by the Tensor method it called.
_READS = {
    "__bool__": "bool(t) on a tensor (an 'if', 'while', 'and' or 'or' on a tensor?)",
    "__float__": "float(t) on a tensor", "__int__": "int(t) on a tensor",
    "__index__": "a tensor used as a Python int (range(t), an index?)",
    "item": "t.item()", "numpy": "t.numpy()", "__array__": "np.asarray(t)",
}


def _value_use() -> str:
    """Which read of a tensor's value the traced function made (the outermost Tensor method)."""
    frame, found = sys._getframe(1), "a read of a tensor's value"
    while frame is not None and frame.f_code.co_filename.startswith(PACKAGE_DIR):
        found = _READS.get(frame.f_code.co_name, found)
        frame = frame.f_back
    return found


class Tracer(ArrayNamespace):
    """The array namespace of a traced function: its placeholders' and ops' tensors. It is
    its stream's sink: it checks and records each op, and its stream is never sent."""

    tracing = True

    def __init__(self, name: str) -> None:
        super().__init__(_TRACE_DEVICE)
        self.name = name
        self.finished = False
        self.ops: list[Sequence[Any]] = []
        self.stream.sinks.append(self)

    def placeholder(self, like: Spec) -> Tensor:
        """A new input of the graph, with ``like``'s shape and dtype."""
        return self.stream.new_tensor(like.shape, like.dtype, None)

    def _refuse(self, what: str, advice: str) -> TraceError:
        file, line = origin_line(issued_at())
        return TraceError(f"{what} in traced function {self.name} ({file}, line {line}): "
                          f"{advice}.", function=self.name, file=file, line=line)

    def record(self, op: Sequence[Any], buffer: Any, result: Spec | None) -> None:
        """Keep ``op`` as one of the graph's, or refuse what a graph cannot hold."""
        if self.finished:
            raise self._refuse("A tensor made while tracing was used after the trace ended",
                               "return it from the function instead of keeping it")
        if buffer is not None:
            raise self._refuse("An array upload", "upload it once with session.asarray(...) "
                               "and pass the tensor as an argument")
        if op[0] == "seed":
            raise self._refuse("random.seed()", "seed the session before calling the function")
        if op[0] not in OPS:
            raise self._refuse(f"{op[0]!r}", "do it outside the traced function")
        self.ops.append(op)

    def foreign_tensor(self, tensor: Tensor) -> TraceError:
        """The error for an op that mixes the trace's tensors with a tensor from outside."""
        return self._refuse(
            "A tensor from outside (a global or a closure variable?) is used", "pass it as an "
            "argument, so that each call uses its current value, or create it inside from an "
            "argument's session (x.session.zeros(...))")

    def read(self, tensor: Tensor, copy: bool = True, out: np.ndarray | None = None) \
            -> np.ndarray:
        """Refused: a trace knows no values."""
        raise self._refuse(
            f"Tensor values are unknown while tracing, and {_value_use()} needs one",
            "a traced function runs once per input signature, so Python control flow cannot "
            "depend on tensor values. Use tensor ops instead (np.where(cond, x, y), "
            "np.maximum, t.clip(...)), read the value outside the function, or call the "
            "function without @fabric.function")

    def _outside(self, call: str) -> TraceError:
        return self._refuse(call, "call it outside the traced function")

    def resolve_shape(self, tensor: Tensor) -> None:
        """Refused: a graph's shapes are fixed when it is traced."""
        raise self._refuse(
            "An op whose result's shape or dtype depends on the data (a[mask], np.nonzero, "
            "np.unique, np.bincount, np.linalg.eig)",
            "a graph's shapes are fixed when it is traced: select with np.where(mask, x, y) "
            "instead, or do it outside the traced function")

    def check_update(self) -> None:
        """Refused: a traced function makes new tensors, it does not update its inputs."""
        raise self._refuse(
            "An update of a tensor (t[i] = v, t += v, out=, np.add.at)",
            "make a new tensor instead (np.where(mask, v, t), t = t + v) and return it")

    def receive_from(self, source: Tensor) -> Tensor:
        """Refused: a trace moves no data between sessions."""
        raise self._outside("t.to(session)")

    def sync(self, timeout: float | None = None) -> None:
        """Refused: a trace runs nothing."""
        raise self._outside("session.sync()")

    def stats(self) -> dict[str, int]:
        """Refused: a trace runs nothing."""
        raise self._outside("session.stats()")

    def compile(self, fn: Callable[..., Any]) -> "Function":
        """``fn``, called inside this trace: inlined into it."""
        return Function(fn, session=self)

    def flush(self, timeout: float | None = None) -> None:
        """Nothing to send: a trace's ops are its graph's."""


@dataclass(frozen=True, eq=False)
class TracedGraph:
    """One trace of a function: its ops on local ids, and how to call and register it."""

    id: int
    name: str
    inputs: tuple[tuple[tuple[int, ...], np.dtype], ...]  # (shape, dtype) per input
    outputs: tuple[tuple[tuple[int, ...], np.dtype], ...]  # (shape, dtype) per output
    result: Any  # the structure of the function's result
    leaves: tuple[Any, ...]  # per result leaf: index into outputs, or a _Constant
    origins: tuple[tuple[str, int], ...]  # per op: the line of the function that issued it
    elements: int  # array elements one call's ops touch (its work, as a batch counts it)
    register_op: list[Any]  # the graph_register op, built once

    @property
    def op_count(self) -> int:
        """How many ops one call runs on the worker."""
        return len(self.register_op[3]["ops"])

    def rebuild(self, tensors: Sequence[Tensor]) -> Any:
        """The function's result, from the tensors a call returned."""
        return _unflatten(self.result, iter([tensors[leaf] if type(leaf) is int else leaf.value
                                             for leaf in self.leaves]))


def trace_function(fn: Callable[..., Any], name: str, structure: Any,
                   leaves: Sequence[Any]) -> TracedGraph:
    """Run ``fn`` once on placeholders for the tensor ``leaves``; return its graph."""
    tracer = Tracer(name)
    inputs = [leaf for leaf in leaves if isinstance(leaf, Tensor)]
    bound = iter([tracer.placeholder(leaf) if isinstance(leaf, Tensor) else leaf
                  for leaf in leaves])
    args, kwargs = _unflatten(structure, bound)
    try:
        result = fn(*args, **kwargs)
    finally:
        tracer.finished = True
    out_leaves: list[Any] = []
    result_structure = _flatten(result, out_leaves)
    outputs: list[Tensor] = []
    graph_leaves: list[Any] = []
    for leaf in out_leaves:
        if isinstance(leaf, Tensor):
            tracer.wire_arg(leaf)  # refuses a tensor that is not the trace's own
            graph_leaves.append(len(outputs))
            outputs.append(leaf)
        else:
            graph_leaves.append(_Constant(leaf))
    if not outputs:
        raise TraceError(f"{name} returned no tensor: a traced function must return a tensor "
                         "or a tuple, list or dict of tensors.", function=name)
    if len(tracer.ops) > MAX_GRAPH_OPS:
        raise TraceError(f"{name} traced {len(tracer.ops)} ops, more than the {MAX_GRAPH_OPS} "
                         "a graph may hold (the worker compiles a graph in one go): trace a "
                         "smaller function, such as a loop's body called in the loop, or call "
                         "this one untraced.", function=name, ops=len(tracer.ops),
                         limit=MAX_GRAPH_OPS)
    graph_id = next(_graph_ids)
    register_op = ["graph_register", 0, [], {
        "graph": graph_id, "name": name, "ops": tracer.ops,
        "inputs": [[list(t.shape), t.dtype.str] for t in inputs],
        "outputs": [t.id for t in outputs]}]
    return TracedGraph(graph_id, name, tuple((t.shape, t.dtype) for t in inputs),
                 tuple((t.shape, t.dtype) for t in outputs), result_structure,
                 tuple(graph_leaves),
                 tuple(origin_line(tracer.stream.origins[op[1]]) for op in tracer.ops),
                 tracer.stream.batch_elements, register_op)


def call(session: ArrayNamespace, graph: TracedGraph,
         inputs: Sequence[Tensor]) -> list[Tensor]:
    """Queue a call of ``graph`` on ``session``, registering it first if the worker lacks it."""
    stream = session.stream
    held = stream.graphs
    if graph.id in held:
        held.move_to_end(graph.id)
    else:
        if len(held) >= GRAPH_CACHE_SIZE:
            evicted, _ = held.popitem(last=False)
            stream.enqueue(["graph_free", 0, [], {"graph": evicted}])
        held[graph.id] = graph
        stream.enqueue(graph.register_op)
    origin = issued_at()
    outputs = [stream.new_tensor(shape, dtype, origin) for shape, dtype in graph.outputs]
    stream.enqueue(["graph_call", outputs[0].id, [t.id for t in inputs],
                    {"graph": graph.id, "outputs": len(outputs)}],
                   elements=graph.elements, graph_ops=graph.op_count)
    return outputs


# -- the user's API ------------------------------------------------------------------------

_STATIC = (type(None), bool, int, float, complex, str, np.generic, np.dtype, type)


class Function:
    """A function of tensors traced once per input signature and replayed on the worker.

    Made by ``@fabric.function`` or ``session.compile(fn)``. Tensor arguments (also inside
    tuples, lists and dicts) are the graph's inputs; other arguments (Python or numpy
    scalars, strings, None, dtypes) are constants of the trace, so a new value traces again.
    The function returns a tensor or a tuple, list or dict of them. It keeps its
    ``TRACE_CACHE_SIZE`` most recently called traces: a loop over ever-new constants costs a
    trace per call, not memory without end.
    """

    def __init__(self, fn: Callable[..., Any], session: ArrayNamespace | None = None) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.session = session
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.graphs: OrderedDict[Any, TracedGraph] = OrderedDict()  # signature -> graph, LRU

    def __repr__(self) -> str:
        return f"<fabric.function {self.name}: {len(self.graphs)} trace(s)>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Queue a call on the tensors' session (tracing first for a new signature); with
        sharded tensors, a call on each shard's device (``fabric.mesh.sharded_functions``)."""
        leaves: list[Any] = []
        structure = _flatten((args, kwargs), leaves)
        if any(isinstance(leaf, ShardedTensor) for leaf in leaves):
            return call_per_shard(self, structure, leaves)
        session = self.bind(leaves, self.session)
        if isinstance(session, Tracer):  # called from another traced function: inline it
            return self.fn(*args, **kwargs)
        graph = self.traced(structure, leaves)
        return graph.rebuild(self.replay(session, graph, leaves))

    def traced(self, structure: Any, leaves: Sequence[Any]) -> TracedGraph:
        """The graph of a call with ``leaves`` (tensors stand for their shape and dtype),
        traced for a new signature."""
        key = (structure, tuple((leaf.shape, leaf.dtype) if isinstance(leaf, Tensor)
                                else (type(leaf), leaf) for leaf in leaves))
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = trace_function(self.fn, self.name, structure, leaves)
            if len(self.graphs) > TRACE_CACHE_SIZE:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
        return graph

    def replay(self, session: ArrayNamespace, graph: TracedGraph,
               leaves: Sequence[Any]) -> list[Tensor]:
        """Queue ``graph``'s call on ``session`` with the tensors among ``leaves``; its
        output tensors."""
        return call(session, graph, [leaf for leaf in leaves if isinstance(leaf, Tensor)])

    def bind(self, leaves: list[Any], session: ArrayNamespace | None) -> ArrayNamespace:
        """The session a call with ``leaves`` runs on (``session``, where given, or the
        tensors'); uploads numpy arrays to a compiled function's session."""
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, np.ndarray) and self.session is not None:
                leaf = leaves[i] = self.session.asarray(leaf)
            if isinstance(leaf, Tensor):
                if session is None or leaf.session.tracing:  # inside a trace: inlined
                    session = leaf.session
                elif leaf.session is not session:
                    raise ValueError(f"{leaf._handle()} lives on another session than the other "
                                     f"arguments of {self.name}: move it with .to(session) "
                                     "first.")
            elif not isinstance(leaf, _STATIC):
                raise TypeError(
                    f"{self.name} got a {type(leaf).__name__} argument: pass tensors (upload "
                    "arrays with session.asarray, or use session.compile(fn), which uploads "
                    "them), or scalars, strings and None, which are constants of the trace.")
        if session is None:
            raise TypeError(f"{self.name} was called without a tensor argument: pass one, or "
                            "compile it for a session with session.compile(fn).")
        return session


def function(fn: Callable[..., Any]) -> Function:
    """Decorator: trace ``fn`` once per input signature, then replay it as one small op.

    The first call on a session registers the graph on the worker and runs it; later calls
    send only the graph id and the input tensors' ids, whatever the function's op count.
    Control flow on tensor values is refused at trace time with ``TraceError``.
    """
    return Function(fn)
