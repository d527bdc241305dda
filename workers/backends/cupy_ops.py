"""What the cupy device does other than the op table's build over its module: the ops CuPy
spells otherwise than numpy, and elementwise runs of a graph fused into one kernel.

Rule: written against an array module ``xp`` and the functions passed in (``to_host``,
``fuse``), never against ``cupy`` itself, so that every line here runs on a CPU too, with
numpy standing in for the module (``tests/unit/test_cupy_ops.py``); only what CUDA does (the
kernel ``cupy.fuse`` compiles, the copies) needs a GPU to be checked.

- ``nanpercentile``, ``nanquantile``: CuPy has neither: numpy's own, on a host copy, moved
  back (the device's values are read; a rare op, not a fast one);
- ``lstsq_residuals``: the table's is numpy's function of host arrays: ``xp.linalg.lstsq``'s;
- ``getitem``, ``setitem``: an integer index array out of bounds raises numpy's IndexError
  (CuPy wraps it around), checked by numpy on stand-ins (``index_checks``; the index arrays
  are read, not the target), and an update's value loses its leading lengths of one as
  numpy's assignment drops them; an update whose index repeats a position is numpy's own on
  a host copy (numpy stores the last of the values given for it, CuPy any one);
- ``ufunc_at``: numpy's own ``ufunc.at`` on a host copy (repeated indices accumulate as
  numpy's do, whatever ufunc; CuPy's covers a few, with atomics);
- ``astype`` (and an update's value cast to its target) from a float to an integer,
  ``floor_divide`` and ``remainder`` of floats, ``fmod`` of integers (CuPy's goes through
  double), ``power`` of an integer to a negative power,
  ``bincount`` of a negative value: ``numpy_values`` (CUDA's conversion saturates, CuPy's
  float division is ``floor(a / b)``, its integer power gives 0, 1 or -1 where numpy
  raises), the operands of the ufuncs first cast to numpy's loop;
- ``searchsorted``: a scalar ``v`` made an array (CuPy's refuses anything else); with a
  sorter, numpy's own on a host copy; ``repeat`` by a negative count refused:
  ``numpy_values``.

A graph's runs of consecutive elementwise ops (numpy ufuncs CuPy has, without params, and
whose kernel computes numpy's values: not ``numpys_own``) become
one step each (``fused_steps``), whose function applies the run's ufuncs to its leaves, each
operand cast first to the loop numpy's resolution picks (``ufunc.resolve_dtypes``), so that
the run computes numpy's dtypes whatever the module's promotion; ``fuse`` compiles it (on a
GPU, ``cupy.fuse``: one kernel, no temporaries). A value the run makes is inlined only where
every op that reads it is in the run and it is no output of the graph. A fused call whose
result is not the graph's dtype, or that cannot be compiled, runs its ops one at a time from
then on (``FusedRun``), naming the one that fails.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any, Callable

import numpy as np

from fabric.core.op_indexing import bind_index
from fabric.core.ops import OPS, Op, Spec
from fabric.core.ops_functions import cut_off

from . import numpy_values
from .base import Constant, GraphOp, GraphOpError, GraphStep, graph_step
from .index_checks import checked_index, fitted_value, repeats_a_position

Bind = Callable[[Op, dict[str, Any]], Callable[..., Any]]
# The ops that run numpy's own function on a host copy of their inputs, moved back
ON_HOST = ("nanpercentile", "nanquantile", "ufunc_at")


def spelled(xp: Any, to_host: Callable[[Any], np.ndarray]) -> dict[str, Callable[..., Any]]:
    """Op name -> its function on a device of module ``xp``, where the table's build over
    ``xp`` is not numpy's."""
    def on_host(name: str) -> Callable[..., Any]:
        impl = OPS[name].impl

        def run(*inputs: Any, **params: Any) -> Any:
            return xp.asarray(impl(*[to_host(x) if isinstance(x, xp.ndarray) else x
                                     for x in inputs], **params))
        return run

    def lstsq_residuals(a: Any, b: Any, rcond: float | None = None) -> Any:
        return xp.linalg.lstsq(a, b, rcond=cut_off(a, rcond))[1]

    def getitem(array: Any, *arrays: Any, index: tuple[Any, ...]) -> Any:
        return array[checked_index(array, index, arrays, to_host=to_host)]

    def setitem(array: Any, value: Any, *arrays: Any, index: tuple[Any, ...]) -> Any:
        key = checked_index(array, index, arrays, value, to_host=to_host)
        if arrays and repeats_a_position(array.shape, bind_index(index, [
                to_host(a) for a in arrays])):  # (CuPy stores any one of the repeated values)
            return on_host("setitem")(array, value, *arrays, index=index)
        if isinstance(value, xp.ndarray) and value.dtype != array.dtype:
            value = numpy_values.astype(xp, value, array.dtype)  # (numpy's assignment's cast)
        updated = array.copy()  # (copy on write, as the table's)
        updated[key] = fitted_value(array, value, index, arrays, to_host=to_host)
        return updated

    def in_loop(name: str) -> Callable[..., Any]:
        function, ufunc = getattr(numpy_values, name), getattr(np, name)
        return lambda a, b: function(xp, *_loop_arrays(xp, ufunc, (a, b)))

    def power(a: Any, b: Any) -> Any:
        a, b = _loop_arrays(xp, np.power, (a, b))
        numpy_values.refuse_negative_power(xp, a, b)
        return xp.power(a, b)

    def searchsorted(a: Any, v: Any, *sorter: Any, side: str = "left") -> Any:
        if sorter:  # (numpy refuses a sorter index past the array where its search reads it)
            return on_host("searchsorted")(a, v, *sorter, side=side)
        return xp.searchsorted(a, xp.asarray(v), side=side)

    def repeat(a: Any, repeats: Any, axis: int | None = None) -> Any:
        numpy_values.refuse_negative_repeats(xp, repeats)
        return xp.repeat(a, repeats, axis)

    def bincount(x: Any, *weights: Any, minlength: int = 0) -> Any:
        numpy_values.refuse_negative_counts(xp, x)
        return xp.bincount(x, *weights, minlength=minlength)

    return {**{name: on_host(name) for name in ON_HOST}, "lstsq_residuals": lstsq_residuals,
            "getitem": getitem, "setitem": setitem, "power": power, "bincount": bincount,
            "searchsorted": searchsorted, "repeat": repeat,
            "astype": lambda a, dtype: numpy_values.astype(xp, a, dtype),
            "floor_divide": in_loop("floor_divide"), "remainder": in_loop("remainder"),
            "fmod": in_loop("fmod")}


def _loop_arrays(xp: Any, ufunc: np.ufunc, operands: tuple[Any, ...]) -> list[Any]:
    """``operands`` as arrays of module ``xp`` in the dtypes of the loop numpy runs
    ``ufunc`` in (a Python scalar weak, as numpy's promotion sees it)."""
    loop = ufunc.resolve_dtypes((*[x.dtype if isinstance(x, xp.ndarray) else _weak(x)
                                   for x in operands], None))[:ufunc.nin]
    return [x.astype(dtype, copy=False) if isinstance(x, xp.ndarray) else xp.asarray(x, dtype)
            for x, dtype in zip(operands, loop)]


def numpys_own(op: GraphOp) -> bool:
    """Whether CuPy's kernel of ``op`` computes other values than numpy's for some operands
    (``numpy_values``): a float ``floor_divide`` or ``remainder``, an integer ``power`` or
    ``fmod``."""
    kind = op.spec.dtype.kind if op.spec is not None else ""
    return (op.name in ("floor_divide", "remainder") and kind == "f"
            or op.name == "power" and kind == "i" or op.name == "fmod" and kind in "iu")


@functools.lru_cache(maxsize=4)
def fusable_ops(xp: Any) -> frozenset[str]:
    """The ops a fused run on module ``xp`` may hold: the table's elementwise ufuncs of one
    output (no gufunc: matmul) that ``xp`` has by the same name."""
    return frozenset(name for name, op in OPS.items()
                     if op.elementwise and type(op.impl) is np.ufunc and op.build is None
                     and op.impl.nout == 1 and op.impl.signature is None
                     and callable(getattr(xp, name, None)))


def fusable(op: GraphOp, xp: Any) -> bool:
    """Whether ``op`` may join a fused run on module ``xp``: one of ``fusable_ops``, without
    params, in a graph whose signature the table accepts, and not ``numpys_own``."""
    return (op.spec is not None and not op.params and op.name in fusable_ops(xp)
            and not numpys_own(op))


def fused_steps(ops: list[GraphOp], specs: dict[int, Spec], outputs: list[int], xp: Any,
                fuse: Callable[[Callable[..., Any]], Callable[..., Any]], bind: Bind,
                fused: Callable[[int], None]) -> list[GraphStep]:
    """The steps of a graph: each run of ``fusable`` ops one fused step (``fused(n)`` told
    of the ``n`` ops each call computes), every other op one step of ``bind``'s."""
    steps: list[GraphStep] = []
    run: list[GraphOp] = []
    for op in [*ops, None]:
        if op is not None and fusable(op, xp):
            run.append(op)
            continue
        for part in _parts(run, ops, outputs):
            steps.append(_step(part, specs, xp, fuse, bind, fused) if len(part) > 1 else
                         graph_step(bind(OPS[part[0].name], part[0].params), part[0]))
        run = []
        if op is not None:
            steps.append(graph_step(bind(OPS[op.name], op.params), op))
    return steps


def _parts(run: list[GraphOp], ops: list[GraphOp], outputs: list[int]) -> list[list[GraphOp]]:
    """``run`` cut where a value is read outside its part or is an output: each part makes
    one value that leaves it, its last op's."""
    reads = Counter(arg for op in ops for arg in op.args if type(arg) is int)
    kept = set(outputs)
    cuts = {i for i, op in enumerate(run) if op.out in kept}
    while True:  # (a cut shortens a part, which may leave another value read outside)
        parts, start = [], 0
        for i in range(len(run)):
            if i in cuts or i == len(run) - 1:
                parts.append(run[start:i + 1])
                start = i + 1
        more = {run.index(op) for part in parts for op in part[:-1]
                if sum(arg == op.out for later in part for arg in later.args) != reads[op.out]}
        if more <= cuts:
            return parts
        cuts |= more


def _step(part: list[GraphOp], specs: dict[int, Spec], xp: Any,
          fuse: Callable[[Callable[..., Any]], Callable[..., Any]], bind: Bind,
          fused: Callable[[int], None]) -> GraphStep:
    made = {op.out for op in part}
    leaves = list(dict.fromkeys(arg for op in part for arg in op.args
                                if type(arg) is int and arg not in made))
    lines = []  # (ufunc of xp, operands: local ids or typed constants, their casts, out)
    for op in part:
        ufunc = OPS[op.name].impl
        loop = ufunc.resolve_dtypes((*[specs[a].dtype if type(a) is int else _weak(a.value)
                                       for a in op.args], None))[:ufunc.nin]
        operands = [a if type(a) is int else Constant(dtype.type(a.value))
                    for a, dtype in zip(op.args, loop)]
        casts = [dtype if type(a) is int and specs[a].dtype != dtype else None
                 for a, dtype in zip(op.args, loop)]
        lines.append((getattr(xp, op.name), operands, casts, op.out))

    def chain(*values: Any) -> Any:
        held = dict(zip(leaves, values))
        for function, operands, casts, out in lines:
            held[out] = function(*[
                a.value if type(a) is Constant else
                held[a] if cast is None else held[a].astype(cast)
                for a, cast in zip(operands, casts)])
        return held[part[-1].out]
    one_by_one = [graph_step(bind(OPS[op.name], op.params), op) for op in part]
    call = FusedRun(fuse(chain), one_by_one, leaves, specs[part[-1].out].dtype, fused)
    return GraphStep(call, leaves, part[-1].out, tuple(op.index for op in part))


def _weak(value: Any) -> Any:
    """How numpy's promotion sees a graph's scalar: a numpy scalar's dtype, a Python
    scalar's type (weak)."""
    if isinstance(value, np.generic):
        return value.dtype
    return np.dtype(bool) if type(value) is bool else type(value)


class FusedRun:
    """A run of ops as one compiled call of its ``leaves``; where that call fails or gives
    another dtype than numpy's, the run's ops one at a time (``one_by_one``), from then on."""

    def __init__(self, kernel: Callable[..., Any] | None, one_by_one: list[GraphStep],
                 leaves: list[int], dtype: np.dtype, fused: Callable[[int], None]) -> None:
        self.kernel = kernel
        self.one_by_one = one_by_one
        self.leaves = leaves
        self.dtype = dtype
        self.fused = fused

    def __call__(self, *values: Any) -> Any:
        if self.kernel is not None:
            try:
                result = self.kernel(*values)
            except Exception:  # (not compiled: the ops, one at a time, say what fails)
                self.kernel = None
            else:
                if result.dtype == self.dtype:
                    self.fused(len(self.one_by_one))
                    return result
                self.kernel = None
        held = dict(zip(self.leaves, values))
        for step in self.one_by_one:
            try:
                held[step.out] = step.call(*[arg.value if type(arg) is Constant else held[arg]
                                             for arg in step.args])
            except Exception as exc:
                raise GraphOpError(step.ops[0], exc) from exc
        return held[self.one_by_one[-1].out]
