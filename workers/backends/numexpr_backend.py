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
compiled once per expression text and input types, and kept per device (LRU).

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
from functools import lru_cache
from typing import Any, NamedTuple, Sequence

import numexpr
import numpy as np
from numexpr.necompiler import NumExpr, getExprNames

from fabric.ops import OPS, Op

MAX_OPS = 64  # ops in one expression (counted as a tree: a shared input counts per use)
MAX_LEAVES = 32  # distinct input arrays (and scalars) of one expression
PROGRAMS = 512  # compiled programs kept per device
SCALARS = 1024  # 0-d scalar operands kept per device, so repeated scalars share a variable
INLINE_POWERS = frozenset(range(-2, 5))  # x ** n with these constant n become multiplications

# The dtypes numexpr computes in, and the type that names each in a numexpr signature.
NUMEXPR_TYPES: dict[np.dtype, type] = {
    np.dtype(bool): bool, np.dtype(np.int32): np.int32, np.dtype(np.int64): np.int64,
    np.dtype(np.float32): float, np.dtype(np.float64): np.float64}
_BOOL = np.dtype(bool)
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

    __slots__ = ("device", "op", "shape", "dtype", "template", "operands", "ops", "leaves",
                 "value", "failure", "error")

    def __init__(self, device: "NumexprDevice", op: str, shape: tuple[int, ...],
                 dtype: np.dtype, template: str, operands: tuple[Any, ...], ops: int,
                 leaves: frozenset) -> None:
        self.device = device
        self.op = op
        self.shape = shape
        self.dtype = dtype
        self.template = template
        self.operands = operands
        self.ops = ops
        self.leaves = leaves
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
        state = "evaluated" if self.value is not None else f"{self.ops} ops deferred"
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
    uses: tuple[int, ...]  # how often the template uses each operand (for MAX_OPS)


def _compile(text: str, types: Sequence[np.dtype]) -> tuple[Any, bool]:
    """A numexpr program for ``text`` over variables v0, v1, ... of ``types``."""
    signature = [(f"v{i}", NUMEXPR_TYPES[t]) for i, t in enumerate(types)]
    program = NumExpr(text, signature, **_CONTEXT)
    uses_vml = bool(numexpr.use_vml) and bool(getExprNames(text, dict(_CONTEXT))[1])
    return program, uses_vml


def _call(program: Any, uses_vml: bool, args: Sequence[np.ndarray]) -> np.ndarray:
    # 'unsafe' lets numexpr cast an input to its declared loop dtype exactly as numpy's
    # ufuncs do (int to bool for logical ops included); declared dtypes come from numpy.
    return program(*args, order="K", casting="unsafe", ex_uses_vml=uses_vml)


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
def plan(name: str, descriptors: tuple[Any, ...], power: int | None = None) -> Plan | None:
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


def _inline_power(exponent: Any) -> int | None:
    if isinstance(exponent, (np.ndarray, Deferred)) or type(exponent) is bool:
        return None
    try:
        value = float(exponent)
    except (TypeError, ValueError):
        return None
    return int(value) if value in INLINE_POWERS else None


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

    def __init__(self, index: int) -> None:
        self.index = index
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
                "max_ops": MAX_OPS, "max_leaves": MAX_LEAVES}

    # -- running ops ---------------------------------------------------------------------

    def run(self, op: Op, inputs: list[Any], params: dict[str, Any]) -> Any:
        """Defer an elementwise op numexpr computes as numpy does; run anything else eagerly.

        Returns a ``Deferred`` value or an array.
        """
        if op.elementwise and not params:
            deferred = self._defer(op.name, inputs)
            if deferred is not None:
                self.ops_fused += 1
                return deferred
        arrays = [self.materialize(x) if type(x) is Deferred else x for x in inputs]
        self.ops_eager += 1
        return np.asarray(op.impl(*arrays, **params))

    def _defer(self, name: str, inputs: list[Any]) -> Deferred | None:
        descriptors = tuple(_descriptor(x) for x in inputs)
        power = _inline_power(inputs[1]) if name == "power" and len(inputs) == 2 else None
        how = plan(name, descriptors, power)
        if how is None:
            return None
        try:
            operands = [self._operand(inputs[i], t) for i, t in zip(how.sources, how.types)]
        except OverflowError:  # a Python int the loop dtype cannot hold: numpy compares
            return None  # such ints by value (eager), and refuses them elsewhere
        operands += how.constants
        ops, leaves = _size(operands, how.uses)
        if ops > MAX_OPS or len(leaves) > MAX_LEAVES:  # evaluate the inputs first
            operands = [(self.materialize(o), o.dtype) if type(o) is Deferred else o
                        for o in operands]
            ops, leaves = _size(operands, how.uses)
        return Deferred(self, name, _shape(inputs), how.out, how.template, tuple(operands),
                        ops, leaves)

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
            ops, leaves = _size(operands, (1,) * len(operands))
            return Deferred(self, value.op, value.shape, dtype, template, operands, ops,
                            leaves)
        if isinstance(value, np.ndarray):
            return (value, dtype)
        return (self._scalar(value, dtype), dtype)

    def _scalar(self, value: Any, dtype: np.dtype) -> np.ndarray:
        key = (type(value), value, dtype)
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
        names: dict[tuple[int, str], str] = {}
        args: list[np.ndarray] = []
        types: list[np.dtype] = []

        def text(item: Any) -> str:
            if type(item) is Deferred:
                if item.failure is not None:
                    raise DeferredError(item, item.failure)
                if item.value is None:
                    return item.template.format(*[text(o) for o in item.operands])
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
        result = _call(*compiled, args)
        self.expressions_evaluated += 1
        if result.dtype != node.dtype:  # the probe makes this unreachable; cheap insurance
            result = result.astype(node.dtype)
        node.value = result
        node.operands = ()  # the leaves are no longer needed

    def _replay(self, root: Deferred, error: Exception) -> None:
        """Evaluate a chain whose fused evaluation failed one op at a time, to name the op
        that fails (or to get the value, if only the fused program failed)."""
        order: list[Deferred] = []
        seen: set[int] = set()

        def visit(node: Deferred) -> None:
            if node.value is not None or id(node) in seen:
                return
            seen.add(id(node))
            for operand in node.operands:
                if type(operand) is Deferred:
                    visit(operand)
            order.append(node)

        visit(root)
        for node in order:
            try:
                self._evaluate(node)
            except DeferredError:
                raise
            except Exception as exc:
                node.failure = exc.with_traceback(None)  # kept: no frames (and arrays) held
                raise DeferredError(node, exc) from None
        if root.value is None:  # pragma: no cover - visit() always ends with the root
            raise DeferredError(root, error)


def _size(operands: Sequence[Any], uses: Sequence[int]) -> tuple[int, frozenset]:
    """Ops and distinct leaves of an expression over ``operands``."""
    ops = 1
    leaves: set[tuple[int, str]] = set()
    for operand, count in zip(operands, uses):
        if type(operand) is Deferred:
            ops += count * operand.ops
            leaves |= operand.leaves
        else:
            leaves.add((id(operand[0]), operand[1].char))
    return ops, frozenset(leaves)
