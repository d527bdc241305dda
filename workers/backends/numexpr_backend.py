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
numpy is faster than numexpr's overhead.

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
import os
from collections import OrderedDict
from functools import lru_cache, partial
from typing import Any, Callable, NamedTuple, Sequence

import numexpr
import numpy as np
from numexpr.necompiler import NumExpr, getExprNames

from fabric.ops import OPS, Op

# Below this many elements numpy is faster than numexpr's call and thread overhead (a 7-op
# chain on 4K float64: 9 us with numpy, ~100 us with numexpr; even at ~32K), so smaller ops
# run eagerly; the environment variable sets another bound (0: fuse every size).
MIN_SIZE = 1 << 15
MIN_SIZE_ENV = "FABRIC_NUMEXPR_MIN_SIZE"
# Reductions of a whole deferred value (the sum that ends a chain) evaluate it BLOCK elements
# at a time: the result is combined from the blocks' results (sums as numpy's pairwise sum
# does, within rounding; the others exactly) and no temporary of the value's size is made.
BLOCKWISE = frozenset({"sum", "prod", "min", "max", "any", "all"})
BLOCK = 1 << 18
MAX_OPS = 64  # distinct ops in one expression (numexpr computes a value used twice once)
MAX_TEXT = 512  # ops in its text, where a value used n times is spelled n times
MAX_LEAVES = 32  # distinct input arrays (and scalars) of one expression
PROGRAMS = 512  # compiled programs kept per device
SCALARS = 1024  # 0-d scalar operands kept per device, so repeated scalars share a variable
# x ** n for a scalar n: numexpr expands these into multiplications (0.5: a square root), as
# numpy's loop has fast paths for 0.5, -1 and 2; the others differ from pow only in rounding
INLINE_POWERS = frozenset([-2, -1, 0, 0.5, 1, 2, 3, 4])

# The dtypes numexpr computes in, and the type that names each in a numexpr signature.
NUMEXPR_TYPES: dict[np.dtype, type] = {
    np.dtype(bool): bool, np.dtype(np.int32): np.int32, np.dtype(np.int64): np.int64,
    np.dtype(np.float32): float, np.dtype(np.float64): np.float64}
_BOOL = np.dtype(bool)
_EMPTY: frozenset = frozenset()
_CONTEXT = {"optimization": "aggressive", "truediv": True}


class Deferred:
    """An elementwise result not computed yet: a numexpr template over its operands.

    ``operands`` are deferred values of exactly the dtype the template expects, or leaves:
    ``(array, dtype)`` pairs, the dtype being the one numexpr is told (it casts the array).
    ``shape``, ``dtype`` and ``nbytes`` are those of the result, so the executor charges the
    memory quota as if the value were computed, exactly as on the numpy device. Code that
    takes it for an array (``np.asarray``) gets it evaluated by its device.

    ``failure`` is the exception its op failed with when its chain was evaluated (every
    later evaluation that needs it raises ``DeferredError`` again, as poison flows), and
    ``error`` is the executor's wire error for that failure, so it is reported once.
    """

    __slots__ = ("device", "op", "shape", "dtype", "template", "operands", "nodes", "text",
                 "leaves", "sized", "value", "failure", "error")

    def __init__(self, device: "NumexprDevice", op: str, shape: tuple[int, ...],
                 dtype: np.dtype, template: str, operands: tuple[Any, ...],
                 size: tuple[frozenset, int, frozenset]) -> None:
        self.device = device
        self.op = op
        self.shape = shape
        self.dtype = dtype
        self.template = template
        self.operands = operands
        nodes, self.text, self.leaves = size  # see _measure
        self.nodes = nodes | {id(self)}
        self.sized = device.expressions_evaluated  # sizes stale once a part is evaluated
        self.value: np.ndarray | None = None
        self.failure: BaseException | None = None
        self.error: dict[str, Any] | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.device.materialize(self)
        return array if dtype is None else array.astype(dtype, copy=False)

    def __repr__(self) -> str:
        state = "evaluated" if self.value is not None else f"{len(self.nodes)} ops deferred"
        return f"<Deferred {self.op} {self.shape} {self.dtype}: {state}>"


class DeferredError(Exception):
    """A deferred op failed when its chain was evaluated; ``deferred`` is that op's value.

    The executor poisons the tensors holding ``deferred`` and names ``deferred.op``, with the
    message of ``cause``, as it would had the op failed when it was run.
    """

    def __init__(self, deferred: Deferred, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.deferred = deferred
        self.cause = cause


# -- what numexpr computes as numpy does ---------------------------------------------------

def _infix(symbol: str) -> str:
    return f"({{0}} {symbol} {{1}})"


_SAME = ["{0}"]


def _TRUTH(symbol: str) -> dict[str, list[Any]]:  # noqa: N802 - a table helper
    # numpy's logical ops on numbers compare their truth values (nan is true)
    return {kind: [f"(({{0}} != 0) {symbol} ({{1}} != 0))"] for kind in "if"}
# Per op and loop kind (b: bool, i: int32/int64, f: float32/float64), numexpr templates in
# order of preference; a template may be (text, constants): constants are extra operands of
# the loop's dtype. Only semantics numpy shares are here; the probe settles dtypes.
TEMPLATES: dict[str, dict[str, list[Any]]] = {
    "add": {"b": [_infix("|")], "i": [_infix("+")], "f": [_infix("+")]},
    "subtract": {"i": [_infix("-")], "f": [_infix("-")]},
    "multiply": {"b": [_infix("&")], "i": [_infix("*")], "f": [_infix("*")]},
    "divide": {"f": [_infix("/")]},
    "power": {"f": [_infix("**")]},  # integer powers raise on negative exponents: eager
    "less": {"b": [_infix("<"), "(~{0} & {1})"], "i": [_infix("<")], "f": [_infix("<")]},
    "less_equal": {"b": [_infix("<="), "(~{0} | {1})"], "i": [_infix("<=")],
                   "f": [_infix("<=")]},
    "equal": {"b": [_infix("=="), "(~({0} ^ {1}))"], "i": [_infix("==")], "f": [_infix("==")]},
    "not_equal": {"b": [_infix("!="), _infix("^")], "i": [_infix("!=")], "f": [_infix("!=")]},
    "greater_equal": {"b": [_infix(">="), "({0} | ~{1})"], "i": [_infix(">=")],
                      "f": [_infix(">=")]},
    "greater": {"b": [_infix(">"), "({0} & ~{1})"], "i": [_infix(">")], "f": [_infix(">")]},
    "bitwise_and": {"b": [_infix("&")], "i": [_infix("&")]},
    "bitwise_or": {"b": [_infix("|")], "i": [_infix("|")]},
    "bitwise_xor": {"b": [_infix("^"), _infix("!=")], "i": [_infix("^")]},
    # numexpr, like numpy, gives 0 (or the sign) for counts outside [0, bits)
    "left_shift": {"i": [_infix("<<")]},
    "right_shift": {"i": [_infix(">>")]},
    "logical_and": {"b": [_infix("&")], **_TRUTH("&")},
    "logical_or": {"b": [_infix("|")], **_TRUTH("|")},
    "logical_xor": {"b": [_infix("^"), _infix("!=")], **_TRUTH("^")},
    "maximum": {"b": [_infix("|")], "i": ["where({0} >= {1}, {0}, {1})"],
                "f": ["maximum({0}, {1})", "where(({0} >= {1}) | ({0} != {0}), {0}, {1})"]},
    "minimum": {"b": [_infix("&")], "i": ["where({0} <= {1}, {0}, {1})"],
                "f": ["minimum({0}, {1})", "where(({0} <= {1}) | ({0} != {0}), {0}, {1})"]},
    "fmax": {"b": [_infix("|")], "i": ["where({0} >= {1}, {0}, {1})"],
             "f": ["where(({0} >= {1}) | ({1} != {1}), {0}, {1})"]},
    "fmin": {"b": [_infix("&")], "i": ["where({0} <= {1}, {0}, {1})"],
             "f": ["where(({0} <= {1}) | ({1} != {1}), {0}, {1})"]},
    "arctan2": {"f": ["arctan2({0}, {1})"]},
    "hypot": {"f": ["hypot({0}, {1})"]},
    "fmod": {"f": ["fmod({0}, {1})"]},  # C fmod, as numpy; integer fmod is eager
    "copysign": {"f": ["copysign({0}, {1})"]},
    "negative": {"i": ["(-{0})"], "f": ["(-{0})"]},
    "positive": {"i": _SAME, "f": _SAME},
    "absolute": {"b": _SAME, "i": ["abs({0})", "where({0} < 0, -{0}, {0})"], "f": ["abs({0})"]},
    "invert": {"b": ["(~{0})"], "i": ["(~{0})"]},
    "logical_not": {"b": ["(~{0})"], "i": ["({0} == 0)"], "f": ["({0} == 0)"]},
    **{name: {"f": [f"{name}({{0}})"]} for name in [
        "exp", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sin", "cos", "tan",
        "arcsin", "arccos", "arctan", "sinh", "cosh", "tanh", "arcsinh", "arccosh", "arctanh"]},
    "square": {"i": ["({0} * {0})"], "f": ["({0} * {0})"]},
    "floor": {"b": _SAME, "i": _SAME, "f": ["floor({0})"]},
    "ceil": {"b": _SAME, "i": _SAME, "f": ["ceil({0})"]},
    "trunc": {"b": _SAME, "i": _SAME,
              "f": ["trunc({0})", "where({0} < 0, ceil({0}), floor({0}))"]},
    "rint": {"f": ["round({0})"]},  # numexpr's round is rint: half to even, as numpy
    "sign": {"i": ["sign({0})"],  # numexpr's float32 sign is double: spelled out instead
             "f": ["sign({0})", ("where({0} > 0, {1}, where({0} < 0, -{1}, {0}))", (1,))]},
    "isnan": {"b": ["({0} != {0})"], "i": ["({0} != {0})"], "f": ["isnan({0})", "({0} != {0})"]},
    "isinf": {"b": ["({0} != {0})"], "i": ["({0} != {0})"], "f": ["isinf({0})"]},
    "isfinite": {"b": ["({0} == {0})"], "i": ["({0} == {0})"], "f": ["isfinite({0})"]},
    "reciprocal": {"f": [("({1} / {0})", (1,))]},  # integer reciprocal divides by zero: eager
    "conjugate": {"i": _SAME, "f": _SAME},
    "deg2rad": {"f": [("({0} * {1})", (math.pi / 180,))]},
    "rad2deg": {"f": [("({0} * {1})", (180 / math.pi,))]},
    "where": {"b": ["where({0}, {1}, {2})"], "i": ["where({0}, {1}, {2})"],
              "f": ["where({0}, {1}, {2})"]},
}


class Plan(NamedTuple):
    """How one op with given input dtypes is deferred."""

    template: str
    sources: tuple[int, ...]  # which inputs are the template's first operands
    types: tuple[np.dtype, ...]  # the dtype numexpr must see for each of them
    constants: tuple[tuple[np.ndarray, np.dtype], ...]  # further operands: typed 0-d leaves
    out: np.dtype
    uses: tuple[int, ...]  # how often the template spells each operand (for MAX_TEXT)


def _compile(text: str, types: Sequence[np.dtype]) -> tuple[Any, bool]:
    """A numexpr program for ``text`` over variables v0, v1, ... of ``types``."""
    signature = [(f"v{i}", NUMEXPR_TYPES[t]) for i, t in enumerate(types)]
    program = NumExpr(text, signature, **_CONTEXT)
    uses_vml = bool(numexpr.use_vml) and bool(getExprNames(text, dict(_CONTEXT))[1])
    return program, uses_vml


def _call(program: Any, uses_vml: bool, args: Sequence[np.ndarray],
          out: np.ndarray | None = None) -> np.ndarray:
    # 'unsafe' lets numexpr cast an input to its declared loop dtype exactly as numpy's
    # ufuncs do (int to bool for logical ops included); declared dtypes come from numpy.
    return program(*args, out=out, order="K", casting="unsafe", ex_uses_vml=uses_vml)


@lru_cache(maxsize=None)
def _probe(template: str, types: tuple[np.dtype, ...], out: np.dtype) -> bool:
    """Whether numexpr compiles ``template`` over operands of ``types`` to an ``out`` result."""
    try:
        program, uses_vml = _compile(template.format(*[f"v{i}" for i in range(len(types))]),
                                     types)
        result = _call(program, uses_vml, [np.ones(2, t) for t in types])
    except Exception:
        return False
    return result.dtype == out


def _typed(value: Any, dtype: np.dtype) -> np.ndarray:
    array = np.asarray(value, dtype=dtype)
    array.flags.writeable = False
    return array


@lru_cache(maxsize=None)
def _cast(source: np.dtype, target: np.dtype) -> tuple[str, tuple[Any, ...]] | None:
    """A template that turns a deferred ``source`` value into ``target`` as numpy casts it."""
    if target == _BOOL:
        template, constants = "({0} != 0)", ()
    elif np.can_cast(source, target, "safe"):
        template, constants = "({0} * {1})", ((_typed(1, target), target),)  # exact
    else:
        return None
    types = (source, *(t for _, t in constants))
    return (template, constants) if _probe(template, types, target) else None


def _example(descriptor: Any) -> Any:
    # numpy's promotion of a Python scalar (weak) or a dtype (strong), without the value
    return descriptor(1) if isinstance(descriptor, type) else np.empty((), descriptor)


@lru_cache(maxsize=8192)
def plan(name: str, descriptors: tuple[Any, ...], power: float | None = None) -> Plan | None:
    """How to defer op ``name`` on inputs described by dtypes (arrays, numpy scalars) or
    Python types (weak scalars); ``power`` is an exponent inlined as a constant. None: eager.
    """
    templates = TEMPLATES.get(name)
    if templates is None or any(d is None for d in descriptors):
        return None
    impl = OPS[name].impl
    try:
        if name == "where":
            result = np.result_type(*[_example(d) for d in descriptors[1:]])
            loop = (_BOOL, result, result, result)
        else:
            loop = impl.resolve_dtypes((*descriptors, None))
    except Exception:  # numpy refuses these inputs: the eager run raises numpy's error
        return None
    *ins, out = loop
    if any(d not in NUMEXPR_TYPES for d in loop):
        return None
    kind = ins[-1].kind
    candidates = templates.get(kind, [])
    sources: tuple[int, ...] = tuple(range(len(ins)))
    if power is not None:  # x ** n with a constant n numexpr expands into multiplications
        candidates, sources = ([f"({{0}} ** {power})"] if kind == "f" else []), (0,)
    for candidate in candidates:
        template, values = candidate if isinstance(candidate, tuple) else (candidate, ())
        constants = tuple((_typed(v, ins[0]), ins[0]) for v in values)
        types = tuple(ins[i] for i in sources)
        if _probe(template, types + tuple(t for _, t in constants), out):
            operands = len(sources) + len(constants)
            uses = tuple(template.count(f"{{{i}}}") for i in range(operands))
            return Plan(template, sources, types, constants, out, uses)
    return None


@lru_cache(maxsize=None)
def fused_ops() -> tuple[str, ...]:
    """The ops this device defers for at least one of bool, int32, int64, float32, float64."""
    fused = []
    for name in TEMPLATES:
        arity = 3 if name == "where" else OPS[name].impl.nin
        for dtype in NUMEXPR_TYPES:
            descriptors = (_BOOL, dtype, dtype) if name == "where" else (dtype,) * arity
            if plan(name, descriptors) is not None:
                fused.append(name)
                break
    return tuple(sorted(fused))


def _descriptor(value: Any) -> Any:
    if isinstance(value, (np.ndarray, Deferred, np.generic)):
        return value.dtype
    if type(value) is bool:
        return _BOOL  # numpy treats Python bools as np.bool_, not as weak scalars
    if type(value) in (int, float, complex):
        return type(value)
    return None


def _inline_power(base: Any, exponent: Any) -> float | None:
    """The exponent numexpr may spell as a constant: numpy's loop takes its fast paths for any
    exponent it does not step through (a scalar, or one element broadcast)."""
    if type(exponent) is bool:
        return None
    if isinstance(exponent, (np.ndarray, Deferred)):
        if exponent.size != 1 or exponent.ndim > len(getattr(base, "shape", ())):
            return None
        exponent = np.asarray(exponent).reshape(-1)[0]  # (one element, if deferred)
    try:
        value = float(exponent)
    except (TypeError, ValueError):
        return None
    return (int(value) if value.is_integer() else value) if value in INLINE_POWERS else None


def _shape(inputs: Sequence[Any]) -> tuple[int, ...]:
    shapes = [x.shape for x in inputs if isinstance(x, (np.ndarray, Deferred))]
    if not shapes:
        return ()
    if all(s == shapes[0] for s in shapes):
        return shapes[0]
    return np.broadcast_shapes(*shapes)


# -- the device ------------------------------------------------------------------------------

class NumexprDevice:
    """One numexpr device of a worker; ``index`` is its local index on that worker.

    Counters (the executor credits ``ops_fused`` and ``expressions_evaluated`` to sessions):
    ops deferred into expressions, numexpr evaluations, ops run eagerly with numpy, and
    programs compiled.
    """

    backend = "numexpr"

    def __init__(self, index: int, min_size: int | None = None) -> None:
        self.index = index
        self.min_size = int(os.environ.get(MIN_SIZE_ENV, MIN_SIZE)) if min_size is None \
            else min_size
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
        if op.elementwise and not params and not self._small(inputs):
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

    def bind(self, op: Op, params: dict[str, Any]) -> Callable[..., Any]:
        """``op`` with its params bound, as a function of its inputs (for compiled graphs):
        ``run`` without its per-call checks where they cannot change the answer."""
        impl = partial(op.impl, **params) if params else op.impl
        if op.elementwise and not params and op.name in TEMPLATES:
            def elementwise(*inputs: Any) -> Any:
                if self._small(inputs):  # (a deferred input is never small)
                    self.ops_eager += 1
                    return impl(*inputs)
                return self.run(op, list(inputs), params)
            return elementwise

        def eager(*inputs: Any) -> Any:
            self.ops_eager += 1
            return impl(*[self.materialize(x) if type(x) is Deferred else x for x in inputs])
        return eager

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
                block = _call(*compiled, [a[start:stop] if a.ndim else a for a in flat],
                              out=buffer[:stop - start])
                partials.append(op.impl(block, **per_block))
            result = op.impl(np.stack(partials), **whole)
        except Exception:
            return None
        self.expressions_evaluated += 1
        return result.reshape((1,) * node.ndim) if params.get("keepdims") else result

    def _small(self, inputs: Sequence[Any]) -> bool:
        """Whether an elementwise result has fewer than ``min_size`` elements."""
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
        descriptors = tuple(_descriptor(x) for x in inputs)
        power = _inline_power(*inputs) if name == "power" and len(inputs) == 2 else None
        how = plan(name, descriptors, power)
        if how is None:
            return None
        try:
            operands = [self._operand(inputs[i], t) for i, t in zip(how.sources, how.types)]
        except OverflowError:  # a Python int the loop dtype cannot hold: numpy compares
            return None  # such ints by value (eager), and refuses them elsewhere
        operands += how.constants
        size = _measure(operands, how.uses)
        if _too_big(size):
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
                    _refresh(operand, {}, self.expressions_evaluated)
            size = _measure(operands, uses)
            if not _too_big(size):
                return operands, size
            deferred = [(o, n) for o, n in zip(operands, uses) if type(o) is Deferred]
            reads: dict[int, int] = {}
            for operand, count in deferred:
                for node in operand.nodes:
                    reads[node] = reads.get(node, 0) + count
            shared = {node for node, count in reads.items() if count > 1}
            candidates = [n for o, _ in deferred for n in _walk(o) if id(n) in shared]
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
            cast = _cast(value.dtype, dtype)
            if cast is None:
                return (self.materialize(value), dtype)
            template, constants = cast
            operands = (value, *constants)
            return Deferred(self, value.op, value.shape, dtype, template, operands,
                            _measure(operands, (1,) * len(operands)))
        if isinstance(value, np.ndarray):
            return (value, dtype)
        return (self._scalar(value, dtype), dtype)

    def _scalar(self, value: Any, dtype: np.dtype) -> np.ndarray:
        # -0.0 == 0.0, but they are different scalars to copysign, division and more
        sign = math.copysign(1.0, value) if isinstance(value, (float, np.floating)) else 1.0
        key = (type(value), value, sign, dtype)
        array = self._scalars.get(key)
        if array is None:
            if len(self._scalars) >= SCALARS:
                self._scalars.clear()
            array = self._scalars[key] = _typed(value, dtype)
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
        result = _call(*compiled, args)
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
        key = (expression, "".join(t.char for t in types))
        compiled = self._programs.get(key)
        if compiled is None:
            compiled = self._programs[key] = _compile(expression, types)
            self.programs_compiled += 1
            if len(self._programs) > PROGRAMS:
                self._programs.popitem(last=False)
        else:
            self._programs.move_to_end(key)
        return compiled, args

    def _replay(self, root: Deferred, error: Exception) -> None:
        """Evaluate a chain whose fused evaluation failed one op at a time, to name the op
        that fails (or to get the value, if only the fused program failed)."""
        for node in _walk(root):  # operands first, the root last
            try:
                self._evaluate(node)
            except DeferredError:
                raise
            except Exception as exc:
                node.failure = exc.with_traceback(None)  # kept: no frames (and arrays) held
                raise DeferredError(node, exc) from None
        if root.value is None:  # pragma: no cover - _walk always ends with the root
            raise DeferredError(root, error)


def _too_big(size: tuple[frozenset, int, frozenset]) -> bool:
    return len(size[0]) >= MAX_OPS or size[1] > MAX_TEXT or len(size[2]) > MAX_LEAVES


def _walk(node: Deferred) -> list[Deferred]:
    """The deferred values ``node``'s expression still computes, ``node`` last."""
    found: dict[int, Deferred] = {}

    def visit(item: Deferred) -> None:
        if item.value is None and id(item) not in found:
            for operand in item.operands:
                if type(operand) is Deferred:
                    visit(operand)
            found[id(item)] = item

    visit(node)
    return list(found.values())


def _refresh(node: Deferred, done: dict[int, bool], epoch: int) -> None:
    """Recompute the sizes of ``node``'s expression, values evaluated since as leaves
    (``epoch``: the device's evaluation count; nothing to do if none happened since)."""
    if id(node) in done or node.value is not None or node.sized == epoch:
        return
    done[id(node)] = True
    node.sized = epoch
    operands = []
    for operand in node.operands:
        if type(operand) is Deferred and operand.value is not None:
            operand = (operand.value, operand.dtype)
        elif type(operand) is Deferred:
            _refresh(operand, done, epoch)
        operands.append(operand)
    uses = [node.template.count(f"{{{i}}}") for i in range(len(operands))]
    nodes, node.text, node.leaves = _measure(operands, uses)
    node.nodes = nodes | {id(node)}


def _measure(operands: Sequence[Any], uses: Sequence[int]) -> tuple[frozenset, int, frozenset]:
    """An expression over ``operands``, without its own op: the deferred ops it holds (ids,
    each once), the ops its text spells, and its distinct leaves (array id and dtype)."""
    nodes: frozenset = _EMPTY
    leaves: frozenset = _EMPTY
    text = 1
    own = []
    for operand, count in zip(operands, uses):
        if type(operand) is Deferred:
            nodes = operand.nodes if not nodes else nodes | operand.nodes
            leaves = operand.leaves if not leaves else leaves | operand.leaves
            text += count * operand.text
        else:
            own.append((id(operand[0]), operand[1].char))
    return nodes, text, leaves.union(own) if own else leaves
