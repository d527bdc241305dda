"""The numexpr device: chains of elementwise ops run as one numexpr evaluation.

Rule: this device computes exactly what the numpy device computes: numpy's dtype and shape,
and numpy's values within floating-point rounding. An elementwise op is *deferred* (kept as a
node of an expression, not computed) only where numexpr computes it the way numpy does; that
is decided once per op and loop dtypes, from numpy's own loop resolution
(``ufunc.resolve_dtypes``) and a probe that compiles the op's numexpr template and checks the
dtype numexpr gives it. Every other op runs eagerly with the shared op table's numpy
implementation, after its deferred inputs are evaluated: integer division and modulo,
integer powers, ``exp2``/``cbrt``, ``clip``/``astype``, float16/int8/unsigned/complex loops,
and float32 loops of the functions numexpr only has in double precision.

A deferred value is evaluated as ONE numexpr program over all its leaves when a value is
needed: a read or sync (the executor calls ``materialize``), a consumer that is not fused, or
a bound on the expression (``MAX_OPS`` ops, ``MAX_LEAVES`` distinct inputs). Programs are
compiled once per expression text and input types, and kept per device (LRU). A reduction of
a whole deferred value (the sum that ends a chain) evaluates it a block at a time instead,
without a temporary of its size. Ops on fewer than ``min_size`` elements run eagerly: there
numpy is faster than numexpr's overhead. That is decided once per op, from its inputs' sizes,
before anything else: the executor makes those ops' numpy calls itself (``plain_below``,
``small``), as it does for the numpy device.

A registered graph is compiled once per signature instead (``numexpr_graphs``): its
elementwise runs become programs compiled at registration, where numexpr is faster.

Operands are typed the way numpy's loop types them: an input array is handed to numexpr with
the loop's dtype declared (numexpr's iterator casts it as numpy would), a Python or numpy
scalar becomes a 0-d array of the loop's dtype (so a float32 array times a Python float stays
float32, as NumPy 2's weak scalars say), and a deferred input of another dtype is upcast inside
the expression by a multiplication with a typed one.

Fused templates cannot fail on data (numpy's only data-dependent elementwise error, integer
to a negative power, runs eagerly), so a failed evaluation means a resource failure such as
``MemoryError``: the chain is then replayed one op at a time and the first op that fails is
named by ``DeferredError``, which the executor turns into that op's poison.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Any, Sequence

import numexpr
import numpy as np

from fabric.core.ops import Op, Spec
from fabric.core.worker_options import WorkerOptions

from ..threads import limited_to
from .base import DeferredError, GraphOp, GraphStep
from .numexpr_deferred import MAX_LEAVES, MAX_OPS, Deferred, measure, refresh, too_big, walk
from .numexpr_graphs import fused_steps
from .numexpr_rules import (call_program, cast_template, compile_program, deferral,
                            descriptor, fused_ops, inline_power, typed_scalar)
from .numpy_backend import NumpyDevice

# Below this many elements numpy is faster than numexpr's call and thread overhead (a 7-op
# chain on 4K float64: 9 us with numpy, ~100 us with numexpr; even at ~32K), so smaller ops
# run eagerly; the environment variable (read into the worker's options) sets another bound
# (0: fuse every size).
MIN_SIZE = 1 << 15
# Reductions of a whole deferred value (the sum that ends a chain) evaluate it BLOCK elements
# at a time: the result is combined from the blocks' results (sums as numpy's pairwise sum
# does, within rounding; the others exactly) and no temporary of the value's size is made.
BLOCKWISE = frozenset({"sum", "prod", "min", "max", "any", "all"})
BLOCK = 1 << 18
PROGRAMS = 512  # compiled programs kept per device
SCALARS = 1024  # 0-d scalar operands kept per device, so repeated scalars share a variable

# -- the device ------------------------------------------------------------------------------

class NumexprDevice(NumpyDevice):
    """One numexpr device of a worker; ``index`` is its local index on that worker. What it
    does not fuse it runs as the numpy device does.

    Counters (the executor credits ``ops_fused`` and ``expressions_evaluated`` to sessions):
    ops deferred into expressions or run in a graph's programs, numexpr evaluations, ops run
    eagerly with numpy by ``run``, and programs compiled.
    """

    backend = "numexpr"
    counts_work = True

    @classmethod
    def for_worker(cls, index: int, options: WorkerOptions) -> "NumexprDevice":
        return cls(index, MIN_SIZE if options.numexpr_min_size is None
                   else options.numexpr_min_size)

    def __init__(self, index: int, min_size: int = MIN_SIZE) -> None:
        super().__init__(index)
        threads = limited_to()  # (the worker's --threads: numexpr's pool too)
        if threads:
            numexpr.set_num_threads(threads)
        self.min_size = min_size
        self.plain_below = self.min_size  # smaller ops are numpy's: the executor calls it
        self.ops_fused = 0
        self.expressions_evaluated = 0
        self.ops_eager = 0
        self.programs_compiled = 0
        self._programs: OrderedDict[tuple[str, str], tuple[Any, bool]] = OrderedDict()
        self._scalars: dict[tuple[Any, ...], np.ndarray] = {}

    def settings(self) -> dict[str, Any]:
        """What the device is, as shown in WELCOME and ``fabric.devices()``."""
        return {"backend": self.backend, "version": numexpr.__version__,
                "numpy": np.__version__, "threads": numexpr.get_num_threads(),
                "vml": bool(numexpr.use_vml), "fuses": list(fused_ops()),
                "min_size": self.min_size, "max_ops": MAX_OPS, "max_leaves": MAX_LEAVES}

    # -- running ops ---------------------------------------------------------------------

    def run(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> Any:
        """Defer an elementwise op numexpr computes as numpy does (on ``min_size`` elements
        or more); run anything else eagerly. Returns a ``Deferred`` value or an array.
        """
        if op.elementwise and not params and not self.small(inputs):
            deferred = self._defer(op.name, inputs)
            if deferred is not None:
                self.ops_fused += 1
                return deferred
        if op.name in BLOCKWISE and len(inputs) == 1 and type(inputs[0]) is Deferred:
            reduced = self._reduce_blockwise(op, inputs[0], params)
            if reduced is not None:
                self.ops_eager += 1
                return reduced
        arrays = [self.materialize(x) if type(x) is Deferred else x for x in inputs]
        self.ops_eager += 1
        return np.asarray(op.impl(*arrays, **params))

    def graph_steps(self, ops: list[GraphOp], specs: dict[int, Spec],
                    outputs: list[int]) -> list[GraphStep]:
        """A graph's steps for one signature: its elementwise runs as numexpr programs where
        numexpr is faster (``numexpr_graphs``), the other ops as the numpy device's calls."""
        return fused_steps(self, ops, specs, outputs)

    def _reduce_blockwise(self, op: Op, node: Deferred, params: dict[str, Any],
                          ) -> np.ndarray | None:
        """A reduction of all of a deferred value, which is evaluated one block at a time into
        a buffer that stays in cache rather than into a whole new array (the value stays
        deferred). None where that does not apply: a reduction along an axis, inputs that
        broadcast or are not contiguous, or any failure (the ordinary path then names it).
        """
        if node.value is not None or params.get("axis") is not None or \
                node.size < 4 * BLOCK:
            return None
        try:
            compiled, args = self._program(node)
        except DeferredError:
            raise  # an op of the chain failed before: its poison flows to the reduction
        except Exception:
            return None
        if any(a.ndim and (a.shape != node.shape or not a.flags.c_contiguous) for a in args):
            return None
        flat = [a.reshape(-1) if a.ndim else a for a in args]
        whole = {**params, "keepdims": False}
        per_block = {k: v for k, v in whole.items() if k != "initial"}  # (counted once)
        buffer = np.empty(BLOCK, node.dtype)
        partials = []
        try:
            for start in range(0, node.size, BLOCK):
                stop = min(start + BLOCK, node.size)
                block = call_program(*compiled, [a[start:stop] if a.ndim else a for a in flat],
                              out=buffer[:stop - start])
                partials.append(op.impl(block, **per_block))
            result = op.impl(np.stack(partials), **whole)
        except Exception:
            return None
        self.expressions_evaluated += 1
        return result.reshape((1,) * node.ndim) if params.get("keepdims") else result

    def small(self, inputs: Sequence[Any]) -> bool:
        """Whether an elementwise result has fewer than ``min_size`` elements (any op on
        such inputs runs with numpy)."""
        first = None
        for x in inputs:
            if type(x) is Deferred:
                return False  # deferred because it was big enough
            if isinstance(x, np.ndarray):
                if x.size >= self.min_size:
                    return False  # a result is at least as big as each input
                if first is None:
                    first = x.shape
                elif x.shape != first:  # broadcasting may make a bigger result
                    return math.prod(_shape(inputs)) < self.min_size
        return True

    def _defer(self, name: str, inputs: list[Any]) -> Deferred | None:
        shape = _shape(inputs)
        if 0 in shape:  # nothing to compute, and numexpr broadcasts empty operands wrongly
            return None  # ((0, 1) with (1, 0) gives it (0, 1), not (0, 0)): numpy's
        descriptors = tuple(descriptor(x) for x in inputs)
        power = inline_power(*inputs) if name == "power" and len(inputs) == 2 else None
        how = deferral(name, descriptors, power)
        if how is None:
            return None
        try:
            operands = [self._operand(inputs[i], t) for i, t in zip(how.sources, how.types)]
        except OverflowError:  # a Python int the loop dtype cannot hold: numpy compares
            return None  # such ints by value (eager), and refuses them elsewhere
        operands += how.constants
        size = measure(operands, how.uses)
        if too_big(size):
            operands, size = self._cut(operands, how.uses)
        return Deferred(self, name, shape, how.out, how.template, tuple(operands), size)

    def _cut(self, operands: list[Any], uses: Sequence[int]) -> tuple[list[Any], Any]:
        """Evaluate parts of an expression past a bound until it fits, biggest shared part
        first (a value several operands read is evaluated once), then whole operands."""
        while True:
            operands = [(o.value, o.dtype) if type(o) is Deferred and o.value is not None
                        else o for o in operands]
            for operand in operands:
                if type(operand) is Deferred:
                    refresh(operand, {}, self.expressions_evaluated)
            size = measure(operands, uses)
            if not too_big(size):
                return operands, size
            deferred = [(o, n) for o, n in zip(operands, uses) if type(o) is Deferred]
            reads: dict[int, int] = {}
            for operand, count in deferred:
                for node in operand.nodes:
                    reads[node] = reads.get(node, 0) + count
            shared = {node for node, count in reads.items() if count > 1}
            candidates = [n for o, _ in deferred for n in walk(o) if id(n) in shared]
            if candidates:
                self.materialize(max(candidates, key=lambda n: len(n.nodes)))
            else:
                biggest = max((o for o, _ in deferred), key=lambda o: len(o.nodes))
                operands = [(self.materialize(o), o.dtype) if o is biggest else o
                            for o in operands]

    def _operand(self, value: Any, dtype: np.dtype) -> Any:
        """``value`` as an operand numexpr sees with ``dtype``."""
        if type(value) is Deferred:
            if value.value is not None:
                return (value.value, dtype)
            if value.dtype == dtype:
                return value
            cast = cast_template(value.dtype, dtype)
            if cast is None:
                return (self.materialize(value), dtype)
            template, constants = cast
            operands = (value, *constants)
            return Deferred(self, value.op, value.shape, dtype, template, operands,
                            measure(operands, (1,) * len(operands)))
        if isinstance(value, np.ndarray):
            return (value, dtype)
        return (self.scalar(value, dtype), dtype)

    def scalar(self, value: Any, dtype: np.dtype) -> np.ndarray:
        """``value`` as a read-only 0-d array of ``dtype``, the one the device keeps for it
        (so that repeated scalars share a variable); OverflowError where it does not fit."""
        # -0.0 == 0.0, but they are different scalars to copysign, division and more
        sign = math.copysign(1.0, value) if isinstance(value, (float, np.floating)) else 1.0
        key = (type(value), value, sign, dtype)
        array = self._scalars.get(key)
        if array is None:
            if len(self._scalars) >= SCALARS:
                self._scalars.clear()
            array = self._scalars[key] = typed_scalar(value, dtype)
        return array

    # -- evaluating --------------------------------------------------------------------------

    def materialize(self, value: Any) -> np.ndarray:
        """The array of a value: a deferred one is evaluated now (once; the result is kept).

        Raises ``DeferredError`` naming the op that failed.
        """
        if type(value) is not Deferred:
            return value
        if value.value is None:
            try:
                self._evaluate(value)
            except DeferredError:
                raise  # an op of the chain failed before: its poison flows here
            except Exception as exc:
                self._replay(value, exc)
        return value.value

    def _evaluate(self, node: Deferred) -> None:
        compiled, args = self._program(node)
        result = call_program(*compiled, args)
        self.expressions_evaluated += 1
        if result.dtype != node.dtype:  # the probe makes this unreachable; cheap insurance
            result = result.astype(node.dtype)
        node.value = result
        node.operands = ()  # the leaves are no longer needed

    def _program(self, node: Deferred) -> tuple[tuple[Any, bool], list[np.ndarray]]:
        """The compiled program of ``node``'s expression (from the cache if it was compiled
        before) and its arguments."""
        names: dict[tuple[int, str], str] = {}
        args: list[np.ndarray] = []
        types: list[np.dtype] = []
        spelled: dict[int, str] = {}  # a value used more than once is spelled once here

        def text(item: Any) -> str:
            if type(item) is Deferred:
                if item.failure is not None:
                    raise DeferredError(item, item.failure)
                if item.value is None:
                    if id(item) not in spelled:
                        spelled[id(item)] = item.template.format(
                            *[text(o) for o in item.operands])
                    return spelled[id(item)]
                item = (item.value, item.dtype)
            array, dtype = item
            key = (id(array), dtype.char)
            name = names.get(key)
            if name is None:
                name = names[key] = f"v{len(args)}"
                args.append(array)
                types.append(dtype)
            return name

        expression = text(node)
        return self.compiled(expression, types), args

    def compiled(self, expression: str, types: Sequence[np.dtype]) -> tuple[Any, bool]:
        """The numexpr program of ``expression`` over v0, v1, ... of ``types``: compiled once
        per expression text and types, and kept (``PROGRAMS`` of them, least recently used
        dropped first)."""
        key = (expression, "".join(t.char for t in types))
        compiled = self._programs.get(key)
        if compiled is None:
            compiled = self._programs[key] = compile_program(expression, types)
            self.programs_compiled += 1
            if len(self._programs) > PROGRAMS:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        return compiled

    def _replay(self, root: Deferred, error: Exception) -> None:
        """Evaluate a chain whose fused evaluation failed one op at a time, to name the op
        that fails (or to get the value, if only the fused program failed)."""
        for node in walk(root):  # operands first, the root last
            try:
                self._evaluate(node)
            except DeferredError:
                raise
            except Exception as exc:
                node.failure = exc.with_traceback(None)  # kept: no frames (and arrays) held
                raise DeferredError(node, exc) from None
        if root.value is None:  # pragma: no cover - walk always ends with the root
            raise DeferredError(root, error)


def _shape(inputs: Sequence[Any]) -> tuple[int, ...]:
    shapes = [x.shape for x in inputs if isinstance(x, (np.ndarray, Deferred))]
    if not shapes:
        return ()
    if all(s == shapes[0] for s in shapes):
        return shapes[0]
    return np.broadcast_shapes(*shapes)
