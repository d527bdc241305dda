"""The contract between a worker's executor and a device's backend, with its defaults.

Rule: the executor and the graphs call a device only through what ``Backend`` declares; a
backend overrides the hooks it has and inherits the defaults for the others, so nothing is
ever probed with ``getattr`` or ``hasattr``. The numpy device is the reference: every other
backend computes what it computes, op for op (dtype, shape, and values within rounding).

A backend is an array module (``xp``) and a few adapters around it: the op table runs over
``xp`` (``Op.over``), and a backend overrides ``implementation`` only for the ops its module
spells otherwise. Its arrays may live elsewhere than in host memory: what arrives (an upload,
a tensor moved here) enters through ``from_host`` and what leaves (a read, a move) through
``to_host``; memory admission and metrics count a device's arrays by their ``nbytes`` as
they count numpy's. ``on_thread`` is the state the device's thread runs in (the device a
module places new arrays on), and ``compile_plan`` may turn a graph's plan into one
executable.

A backend may defer work (the numexpr device keeps chains of elementwise ops as one
expression): ``run`` then returns a ``DeferredValue``, which the executor holds in a
session's tensors as it holds arrays (it has their ``shape``, ``dtype``, ``size`` and
``nbytes``, so the memory budget charges it as if computed) and turns into an array with
``materialize`` when a read, a sync or a transfer needs one. A deferred op that fails when
its chain is evaluated raises ``DeferredError``, which the executor turns into that op's poison.

A registered graph is compiled once per signature (its inputs' shapes and dtypes), and every
op's shape and dtype is known then: a device lowers its ops to ``GraphStep``s
(``graph_steps``), by default one resolved call per op, and a device that fuses replaces runs
of ops with one step each; ``workers.registered_graphs`` turns the steps into the plan.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, ClassVar, NamedTuple, Union

import numpy as np

from fabric.core.ops import OPS, Op, Spec
from fabric.core.worker_options import WorkerOptions

# The dtypes of fixed width, which an accelerator's module holds (every device dtype but
# numpy's extended precision, float128 and complex256)
FIXED_WIDTH_DTYPES = frozenset(np.dtype(name) for name in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128"))
# A compiled graph: the arrays bound to its inputs and the session's generator (for random
# ops) in, its outputs out.
GraphPlan = Callable[[list[np.ndarray], np.random.Generator], list[Any]]
DEVICE_COUNTERS = ("ops_fused", "expressions_evaluated")  # a Backend's counters


class GraphOp(NamedTuple):
    """One op of a graph being compiled: its ``index`` among the graph's ops, its local ids
    (``args`` hold local ids as ints, and scalars decoded, wrapped in ``Constant``), its
    decoded params, and the shape and dtype of what it makes (``spec``; None past an op the
    op table refuses for this signature, where a call fails)."""

    index: int
    name: str
    out: int
    args: list[Any]
    params: dict[str, Any]
    spec: Spec | None


class Constant(NamedTuple):
    """A value a graph step reads that is no local id: a scalar, or a device's own operand."""

    value: Any


class GraphStep(NamedTuple):
    """One line of a graph's plan: ``call(*args)`` makes local id ``out``.

    ``ops`` are the indices of the graph's ops it computes (its line is the last one's);
    ``fresh``: its result is a new array that aliases no argument and that it can be handed
    to write into instead (``out=``), as a ufunc's and a numexpr program's.
    """

    call: Callable[..., Any]
    args: list[Any]
    out: int
    ops: tuple[int, ...]
    fresh: bool = False


class GraphOpError(Exception):
    """A graph step that computes several ops failed at one of them: ``index`` is that op's
    among the graph's ops, ``cause`` the error it raised."""

    def __init__(self, index: int, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.index = index
        self.cause = cause


class DeferredValue:
    """A result its device has not computed yet; what the executor may know of one.

    ``op`` names the op that made it; ``error`` is the executor's wire error once the value
    failed to evaluate, so that the failure is reported once and then flows as poison.
    """

    __slots__ = ()
    op: str
    shape: tuple[int, ...]
    dtype: np.dtype
    nbytes: int
    error: dict[str, Any] | None

    @property
    def size(self) -> int:
        """Its number of elements, as an array's."""
        return math.prod(self.shape)


# What a session's tensor id holds on a device.
Value = Union[np.ndarray, DeferredValue]


class DeferredError(Exception):
    """A deferred op failed when its chain was evaluated; ``deferred`` is that op's value.

    The executor poisons the tensors holding ``deferred`` and names ``deferred.op``, with the
    message of ``cause``, as it would had the op failed when it was run.
    """

    def __init__(self, deferred: DeferredValue, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.deferred = deferred
        self.cause = cause


class QueuedError(Exception):
    """An error a device reported only when its queued work was waited for (``finish``):
    ``ops`` names the ops it is attributed to, ``cause`` is the error."""

    def __init__(self, ops: str, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.ops = ops
        self.cause = cause


class Backend:
    """One device of a worker; ``index`` is its local index on that worker.

    A subclass names its ``backend`` and defines ``settings`` and ``run``; the other hooks
    have defaults. Counters: ``ops_fused`` and ``expressions_evaluated`` count the device's
    own work (a fusing device grows them, and says so with ``counts_work``); what they grow by
    while one session's message is handled is credited to that session.
    """

    backend: ClassVar[str]
    # ``run(op, inputs, {})`` is ``np.asarray(op.impl(*inputs))`` for ops whose tensor inputs'
    # sizes multiply to fewer elements than this, and for those ``small(inputs)`` names: the
    # executor then makes that call itself (every op of a stream costs two Python calls
    # less); 0: never. (An int: the executor compares it with an int for every op.)
    plain_below: int = 0
    # True when the device grows its counters: the executor reads them around each message
    # only then (on every read, that costs a device that counts nothing about 5% of its work).
    counts_work: ClassVar[bool] = False
    # True when a batch of streamed ops seen again should run as one graph, which the device
    # compiles (``compile_plan``): the executor keeps their graphs (``workers.batch_graphs``)
    compiles_batches: ClassVar[bool] = False
    # True when the device queues its work and may report an error of it later (a GPU's
    # kernels run asynchronously): the executor calls ``finish`` at the end of each batch
    queues: ClassVar[bool] = False
    ops_fused: int = 0
    expressions_evaluated: int = 0

    # The array module the device's arrays are, which the op table runs over
    xp: ClassVar[Any] = np

    def __init__(self, index: int) -> None:
        self.index = index
        # every op's function over ``xp``, as ``implementation`` says
        self.implementations = {name: self.implementation(op) for name, op in OPS.items()}

    @classmethod
    def check_host(cls) -> None:
        """Raise ``BackendMissing``, with a sentence naming what is missing, where this host
        cannot hold such a device (a GPU backend on a machine without one); every host can
        hold one by default. Asked before a worker starts."""

    @classmethod
    def for_worker(cls, index: int, options: WorkerOptions) -> "Backend":
        """Device ``index`` of a worker run as ``options`` say (a backend with settings of
        its own reads them there)."""
        return cls(index)

    def settings(self) -> dict[str, Any]:
        """What the device is, as shown in WELCOME and ``fabric.devices()``."""
        raise NotImplementedError

    def implementation(self, op: Op) -> Callable[..., Any]:
        """``op``'s function on this device: the table's, over ``xp``; a backend whose module
        spells an op otherwise returns its own for that op."""
        return op.over(self.xp)

    def run(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> Value:
        """Run one op of the shared table on ``inputs`` (arrays, deferred values, scalars):
        an array, or a deferred value. By default its ``implementation``, called."""
        return self.implementations[op.name](*inputs, **params)

    def small(self, inputs: list[Any]) -> bool:
        """Whether ``run`` makes a plain numpy call of an op without params on ``inputs``,
        though their sizes multiply to ``plain_below`` elements or more (asked then only)."""
        return False

    def materialize(self, value: Value) -> np.ndarray:
        """The array of a value; a device that never defers has nothing to compute."""
        return value  # type: ignore[return-value]

    def held(self, result: Any) -> Value:
        """A graph's output as a tensor holds it (numpy makes a 0-d result a scalar: an
        array of it)."""
        return np.asarray(result)

    def from_host(self, array: np.ndarray) -> Any:
        """An array that arrived in host memory (an upload, a tensor moved here) as the
        device holds it; a device whose arrays live elsewhere copies it there."""
        return array

    def to_host(self, value: Any) -> np.ndarray:
        """A tensor's values in host memory, for a read or a move (a deferred value computed
        first); a device whose arrays live elsewhere copies them out."""
        return self.materialize(value)

    def finish(self) -> None:
        """Wait for the work the device has queued (where ``queues``): an error the device
        reports only then is raised here, naming the ops it may come from. Nothing is queued
        by default."""

    def on_thread(self) -> contextlib.AbstractContextManager[Any]:
        """The state the device's thread runs in, entered once by that thread; none by
        default."""
        return contextlib.nullcontext()

    def stats(self) -> dict[str, Any]:
        """The device's own figures, as every session's ``stats()`` shows them; none by
        default."""
        return {}

    def compile_plan(self, plan: GraphPlan, ops: list[GraphOp]) -> GraphPlan:
        """What runs a graph whose generated ``plan`` computes ``ops`` (for one signature):
        by default the plan itself, step by step in Python."""
        return plan

    def bind(self, op: Op, params: dict[str, Any]) -> Callable[..., Any]:
        """``op`` with its params bound: a function of its inputs (and of the session's
        generator, ``rng=``, for a random op), for compiled graphs."""
        def run(*inputs: Any, **rng: Any) -> Value:
            return self.run(op, list(inputs), {**params, **rng} if rng else params)
        return run

    def graph_steps(self, ops: list[GraphOp], specs: dict[int, Spec],
                    outputs: list[int]) -> list[GraphStep]:
        """The steps that compute a graph's ``ops`` for one signature (``specs``: the shape
        and dtype of every local id; ``outputs``: the ids the caller sees), in op order.
        By default one step per op, calling ``bind``'s function of it."""
        return [graph_step(self.bind(OPS[op.name], op.params), op) for op in ops]


def graph_step(call: Callable[..., Any], op: GraphOp) -> GraphStep:
    """The step that computes ``op`` alone with ``call``; a ufunc's result is fresh."""
    return GraphStep(call, op.args, op.out, (op.index,), isinstance(call, np.ufunc))
