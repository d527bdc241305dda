"""The contract between a worker's executor and a device's backend, with its defaults.

Rule: the executor and the graphs call a device only through what ``Backend`` declares; a
backend overrides the hooks it has and inherits the defaults for the others, so nothing is
ever probed with ``getattr`` or ``hasattr``. The numpy device is the reference: every other
backend computes what it computes, op for op (dtype, shape, and values within rounding).

A backend may defer work (the numexpr device keeps chains of elementwise ops as one
expression): ``run`` then returns a ``DeferredValue``, which the executor holds in a
session's tensors as it holds arrays (it has their ``shape``, ``dtype``, ``size`` and
``nbytes``, so the memory budget charges it as if computed) and turns into an array with
``materialize`` when a read, a sync or a transfer needs one. A deferred op that fails when
its chain is evaluated raises ``DeferredError``, which the executor turns into that op's poison.
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Union

import numpy as np

from fabric.ops import Op

# A compiled graph: the arrays bound to its inputs and the session's generator (for random
# ops) in, its outputs out.
GraphPlan = Callable[[list[np.ndarray], np.random.Generator], list[Any]]
DEVICE_COUNTERS = ("ops_fused", "expressions_evaluated")  # a Backend's counters


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


class Backend:
    """One device of a worker; ``index`` is its local index on that worker.

    A subclass names its ``backend`` and defines ``settings`` and ``run``; the other hooks
    have defaults. Counters: ``ops_fused`` and ``expressions_evaluated`` count the device's
    own work (a fusing device grows them, and says so with ``counts_work``); what they grow by
    while one session's message is handled is credited to that session.
    """

    backend: ClassVar[str]
    # True when ``run(op, inputs, {})`` is ``np.asarray(op.impl(*inputs))``: the executor
    # may then make that call itself (every op of a stream costs two Python calls less).
    plain_calls: ClassVar[bool] = False
    # True when the device grows its counters: the executor reads them around each message
    # only then (on every read, that costs a device that counts nothing about 5% of its work).
    counts_work: ClassVar[bool] = False
    ops_fused: int = 0
    expressions_evaluated: int = 0

    def __init__(self, index: int) -> None:
        self.index = index

    def settings(self) -> dict[str, Any]:
        """What the device is, as shown in WELCOME and ``fabric.devices()``."""
        raise NotImplementedError

    def run(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> Value:
        """Run one op of the shared table on ``inputs`` (arrays, deferred values, scalars):
        an array, or a deferred value."""
        raise NotImplementedError

    def materialize(self, value: Value) -> np.ndarray:
        """The array of a value; a device that never defers has nothing to compute."""
        return value  # type: ignore[return-value]

    def bind(self, op: Op, params: dict[str, Any]) -> Callable[..., Any]:
        """``op`` with its params bound: a function of its inputs, for compiled graphs."""
        def run(*inputs: Any) -> Value:
            return self.run(op, list(inputs), params)
        return run

    def compile_graph(self, ops: list[list[Any]], inputs: int,
                      outputs: list[int]) -> GraphPlan | None:
        """A plan for a graph being registered (its wire ops on local ids, ``1..inputs``
        being the inputs, and its output ids), or None for the default plan, which calls
        ``bind``'s function of each op in turn."""
        return None
