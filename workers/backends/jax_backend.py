"""The jax device: the op table over ``jax.numpy`` on one XLA device (CPU cores here, a GPU
or TPU where jax finds one), and registered graphs compiled to one XLA executable each.

Rule: this device computes exactly what the numpy device computes: numpy's dtypes (jax runs
with 64-bit types; an elementwise op's operands are cast to the loop numpy's own resolution
picks, ``ufunc.resolve_dtypes``, and every result's dtype is checked against the op table's,
which the client inferred), numpy's shapes, and numpy's values within rounding. A dtype XLA
has no type for (numpy's extended precision: float128, complex256) is refused with
``DtypeNotSupported``, never computed in another precision; a result whose dtype jax makes
otherwise than numpy is refused alike, naming the op. What jax spells otherwise than numpy
is ``jax_ops``.

Arrays live on the device: an upload or a tensor moved here is copied in
(``jax.device_put``), a read or a move copies out through host memory; memory admission and
metrics count them by ``nbytes``, as host arrays. New arrays (creation, random draws) are
placed on the device by ``on_thread``, which its thread enters. This module is imported only
by a worker that hosts jax devices, after ``backends.prepare`` has set XLA's host device
count (one XLA CPU device per fabric device).

A registered graph's plan is traced with ``jax.jit`` and compiled (``lower().compile()``) at
its first call, on the device's thread, never on the control thread that sends heartbeats:
one executable per graph, and a graph is registered for one signature, so one per signature,
held as long as its session holds the graph (``SessionGraphs``: at most ``GRAPH_CACHE_SIZE``
per session). A graph holding an op that reads its data to decide (a random draw, an index
array, an integer power, linear algebra's errors: ``jax_ops.needs_data``) runs op by op. A
batch of streamed ops seen again becomes such a graph too (``workers.batch_graphs``).
"""

from __future__ import annotations

import functools
from time import perf_counter
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fabric.core.errors import BackendMissing, DtypeNotSupported
from fabric.core.flow import COMPILES_BATCHES
from fabric.core.ops import QUANTILES, RANDOM_OPS, Op, Spec
from fabric.core.ops_functions import FFTS

from .base import FIXED_WIDTH_DTYPES, Backend, GraphOp, GraphPlan
from .jax_ops import SPELLED, needs_data

jax.config.update("jax_enable_x64", True)

HELD = FIXED_WIDTH_DTYPES  # (the dtypes XLA holds)

# Ops whose result's dtype is numpy's promotion of their operands (from the one numbered
# here on), where jax's promotion differs (int64 with float32 is float32 in jax): their
# operands are cast to numpy's result dtype first
PROMOTING = {"where": 1, "clip": 0, "concatenate": 0, "stack": 0, "dot": 0, "einsum": 0,
             "median": 0, "nanmedian": 0, **{name: 0 for name in QUANTILES}, "average": 0,
             "convolve": 0, "interp": 2}
# Reductions and scans numpy computes in a wider dtype for integers and bools (float64 for
# an average, where jax takes float32 for a bool; int64 for a sum of int32, where jax's
# cumsum keeps int32): such an input is cast to the result's dtype first
WIDENING = frozenset({"mean", "std", "var", "sum", "prod", "cumsum", "cumprod", "nanmean",
                      "nanstd", "nanvar", "nansum", "nanprod", "ufunc_reduce",
                      "ufunc_accumulate", "histogram_bin_edges"})
# Ops numpy computes in double precision whatever their inputs (np.linalg's LAPACK calls; the
# results cast back to single precision where the inputs were): their inputs are cast to
# double first, their results to numpy's dtype (eig's, which the data decides, as it is)
DOUBLE = frozenset({"inv", "det", "solve", "eigh", "eigvalsh", "svd", "qr", "slogdet",
                    "cholesky", "pinv", "lstsq", "lstsq_residuals"})
# Ops whose result jax makes in a dtype of its own choosing (int32 indexes, float counts),
# which numpy's (intp, int64) holds exactly: cast to numpy's
RECAST = frozenset({"searchsorted", "lexsort", "histogram"})


class JaxDevice(Backend):
    """One jax device of a worker: XLA device number ``index`` of this process.

    Counters (``stats``): ``compiles``, the graphs compiled (registered ones and batches seen
    again), and ``compile_seconds``, the time their traces and compiles took.
    """

    backend = "jax"
    xp = jnp
    compiles_batches = True

    def __init__(self, index: int) -> None:
        found = jax.devices()
        if index >= len(found):
            raise BackendMissing(
                f"This worker hosts jax device {index}, but jax finds {len(found)} "
                f"{found[0].platform} device(s) in this process: start it with --devices "
                f"{len(found)} or fewer (on a CPU host, --devices sets XLA's host device count "
                "when the worker starts).", backend="jax")
        self.xla = found[index]
        super().__init__(index)
        self.compiles = 0
        self.compile_seconds = 0.0

    def settings(self) -> dict[str, Any]:
        """What the device is, as shown in WELCOME and ``fabric.devices()``."""
        memory = self.xla.memory_stats()  # (None on a CPU)
        return {"backend": self.backend, "version": jax.__version__,
                "numpy": np.__version__, "platform": self.xla.platform,
                "device": str(self.xla), "x64": True, "fuses": [], "compiles": COMPILES_BATCHES,
                "dtypes": sorted(dtype.name for dtype in HELD),
                "memory_bytes": memory.get("bytes_limit") if memory else None}

    def implementation(self, op: Op) -> Callable[..., Any]:
        """``op``'s function: ``jax_ops``' where jax spells it otherwise, else the table's
        build over ``jax.numpy``."""
        return SPELLED.get(op.name) or op.over(jnp)

    # -- running ops --------------------------------------------------------------------

    def run(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> Any:
        """Run one op of the table: its operands cast as numpy's loop casts them (for a
        ufunc), its result's dtype numpy's or the op refused."""
        expected = self._result_dtype(op, inputs, params)
        if type(op.impl) is np.ufunc:
            inputs = _loop_operands(op.impl, inputs)
        elif op.name in PROMOTING:
            first = PROMOTING[op.name]
            inputs = inputs[:first] + [_as(x, expected) for x in inputs[first:]]
        elif op.name in WIDENING and "dtype" not in params and inputs[0].dtype.kind in "biu":
            inputs = [_as(inputs[0], expected), *inputs[1:]]
        elif op.name in DOUBLE or op.name in FFTS or op.name == "eig":
            inputs = [_in_double(x, every=op.name in DOUBLE) for x in inputs]
        result = self.implementations[op.name](*inputs, **params)
        if op.name in RECAST or op.name in DOUBLE:
            result = result.astype(expected)
        if result.dtype != expected:
            raise DtypeNotSupported(
                f"The jax device computes {op.name} of {_described(inputs)} as {result.dtype}, "
                f"where numpy makes {expected}: it refuses the op rather than give another "
                f"precision. Run it on a numpy device, or astype the operands first.",
                backend=self.backend, dtype=str(expected))
        return result

    def _result_dtype(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> np.dtype:
        """numpy's dtype of ``op`` on ``inputs``, by the op table's rule; DtypeNotSupported
        where XLA has no such type."""
        dtype = np.dtype(op.result_dtype(
            [Spec(x.shape, x.dtype) if isinstance(x, jax.Array) else x for x in inputs],
            params))
        if dtype not in HELD:
            raise _refused(op.name, dtype)
        return dtype

    def stats(self) -> dict[str, Any]:
        """Its compiles, for ``session.stats()``."""
        return {"device_compiles": self.compiles,
                "device_compile_seconds": round(self.compile_seconds, 6)}

    def held(self, result: Any) -> Any:
        """A graph's output as it is: a jax array (0-d ones too)."""
        return result

    # -- transfers ----------------------------------------------------------------------

    def from_host(self, array: np.ndarray) -> Any:
        """An upload or a tensor moved here, copied onto the device."""
        if array.dtype not in HELD:
            raise _refused("put (an upload)", array.dtype)
        return jax.device_put(array, self.xla)

    def to_host(self, value: Any) -> np.ndarray:
        """A tensor's values, copied into host memory (read-only)."""
        return np.asarray(value)

    def on_thread(self) -> Any:
        """The device's thread places new arrays on its XLA device."""
        return jax.default_device(self.xla)

    # -- graphs -------------------------------------------------------------------------

    def compile_plan(self, plan: GraphPlan, ops: list[GraphOp]) -> GraphPlan:
        """The plan as one XLA executable, compiled at the first call; the plan itself where
        an op reads its data to decide (``jax_ops.needs_data``) or draws random numbers."""
        if any(op.name in RANDOM_OPS or needs_data(op.name, op.args, op.spec and op.spec.dtype)
               for op in ops):
            return plan
        return _Compiled(plan, self)


class _Compiled:
    """A graph's plan traced with ``jax.jit`` and compiled at its first call (a trace that
    fails names the plan's line, its op, as the plan's own run would), then replayed."""

    def __init__(self, plan: GraphPlan, device: JaxDevice) -> None:
        self.jitted = jax.jit(functools.partial(plan, rng=None))
        self.device = device
        self.executable: Any = None

    def __call__(self, inputs: list[Any], rng: np.random.Generator) -> list[Any]:
        if self.executable is None:
            started = perf_counter()
            self.executable = self.jitted.lower(inputs).compile()
            self.device.compile_seconds += perf_counter() - started
            self.device.compiles += 1
        return self.executable(inputs)


@functools.lru_cache(maxsize=1024)
def _loop(ufunc: np.ufunc, descriptors: tuple[Any, ...]) -> tuple[np.dtype, ...]:
    """The dtypes of numpy's loop of ``ufunc`` for operands seen as ``descriptors``."""
    return ufunc.resolve_dtypes((*descriptors, *(None,) * ufunc.nout))[:ufunc.nin]


def _loop_operands(ufunc: np.ufunc, inputs: list[Any]) -> list[Any]:
    """``inputs`` cast to the loop numpy runs ``ufunc`` in: arrays by ``astype``, scalars as
    numpy scalars of the loop's dtype (as numpy's loop reads a weak Python scalar)."""
    descriptors = tuple(x.dtype if isinstance(x, (jax.Array, np.generic)) else
                        np.dtype(bool) if type(x) is bool else type(x) for x in inputs)
    return [_as(x, dtype) for x, dtype in zip(inputs, _loop(ufunc, descriptors))]


def _as(x: Any, dtype: np.dtype) -> Any:
    """An operand as ``dtype`` (None, an absent bound, as it is). A bool made a number goes
    through an optimization barrier: XLA's simplifier turns ``x * convert(bool)`` into a
    select, which gives 0 for nan times False (jax issue 12233), where numpy gives nan."""
    if not isinstance(x, jax.Array):
        return x if x is None else dtype.type(x)
    if x.dtype == dtype:
        return x
    if x.dtype.kind == "b":
        return jax.lax.optimization_barrier(x.astype(dtype))
    return x.astype(dtype)


def _in_double(x: Any, every: bool) -> Any:
    """An input numpy computes in double precision (np.fft's from an integer or bool, and
    ``every`` one, np.linalg's), as float64 or complex128."""
    if not isinstance(x, jax.Array) or not every and x.dtype.kind not in "biu":
        return x
    return _as(x, np.dtype(np.complex128 if x.dtype.kind == "c" else np.float64))


def _described(inputs: list[Any]) -> str:
    return ", ".join(str(x.dtype) if isinstance(x, jax.Array) else type(x).__name__
                     for x in inputs) or "no operands"


def _refused(what: str, dtype: np.dtype) -> DtypeNotSupported:
    return DtypeNotSupported(
        f"The jax device cannot hold {dtype} (XLA has no such type): {what} is refused rather "
        f"than computed in another precision. Run it on a numpy device, or astype to "
        f"float64 or complex128 first.", backend="jax", dtype=str(dtype))
