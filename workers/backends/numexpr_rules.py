"""Which elementwise ops numexpr computes exactly as numpy does, and how it spells them.

Rule: an op is deferred only where this module says numexpr computes it the way numpy does.
That is decided once per op and loop dtypes (``deferral``), from numpy's own loop resolution
(``ufunc.resolve_dtypes``) and a probe that compiles the op's numexpr template and checks the
dtype numexpr gives it; ``TEMPLATES`` holds only semantics numpy shares. Compiling and
calling a numexpr program also happen here, the one way both are done.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, NamedTuple, Sequence

import numexpr
import numpy as np
from numexpr.necompiler import NumExpr, getExprNames

from fabric.core.ops import OPS, Spec

from .base import DeferredValue

# The dtypes numexpr computes in, and the type that names each in a numexpr signature.
NUMEXPR_TYPES: dict[np.dtype, type] = {
    np.dtype(bool): bool, np.dtype(np.int32): np.int32, np.dtype(np.int64): np.int64,
    np.dtype(np.float32): float, np.dtype(np.float64): np.float64}
BOOL = np.dtype(bool)
# x ** n for a scalar n: numexpr expands these into multiplications (0.5: a square root), as
# numpy's loop has fast paths for 0.5, -1 and 2; the others differ from pow only in rounding
INLINE_POWERS = frozenset([-2, -1, 0, 0.5, 1, 2, 3, 4])
_CONTEXT = {"optimization": "aggressive", "truediv": True}


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


class Deferral(NamedTuple):
    """How one op with given input dtypes is deferred."""

    template: str
    sources: tuple[int, ...]  # which inputs are the template's first operands
    types: tuple[np.dtype, ...]  # the dtype numexpr must see for each of them
    constants: tuple[tuple[np.ndarray, np.dtype], ...]  # further operands: typed 0-d leaves
    out: np.dtype
    uses: tuple[int, ...]  # how often the template spells each operand (for MAX_TEXT)


def compile_program(text: str, types: Sequence[np.dtype]) -> tuple[Any, bool]:
    """A numexpr program for ``text`` over variables v0, v1, ... of ``types``."""
    signature = [(f"v{i}", NUMEXPR_TYPES[t]) for i, t in enumerate(types)]
    program = NumExpr(text, signature, **_CONTEXT)
    uses_vml = bool(numexpr.use_vml) and bool(getExprNames(text, dict(_CONTEXT))[1])
    return program, uses_vml


def call_program(program: Any, uses_vml: bool, args: Sequence[np.ndarray],
          out: np.ndarray | None = None) -> np.ndarray:
    # 'unsafe' lets numexpr cast an input to its declared loop dtype exactly as numpy's
    # ufuncs do (int to bool for logical ops included); declared dtypes come from numpy.
    return program(*args, out=out, order="K", casting="unsafe", ex_uses_vml=uses_vml)


@lru_cache(maxsize=None)
def _probe(template: str, types: tuple[np.dtype, ...], out: np.dtype) -> bool:
    """Whether numexpr compiles ``template`` over operands of ``types`` to an ``out`` result."""
    try:
        program, uses_vml = compile_program(template.format(*[f"v{i}" for i in range(len(types))]),
                                     types)
        result = call_program(program, uses_vml, [np.ones(2, t) for t in types])
    except Exception:
        return False
    return result.dtype == out


def typed_scalar(value: Any, dtype: np.dtype) -> np.ndarray:
    array = np.asarray(value, dtype=dtype)
    array.flags.writeable = False
    return array


@lru_cache(maxsize=None)
def cast_template(source: np.dtype, target: np.dtype) -> tuple[str, tuple[Any, ...]] | None:
    """A template that turns a deferred ``source`` value into ``target`` as numpy casts it."""
    if target == BOOL:
        template, constants = "({0} != 0)", ()
    elif np.can_cast(source, target, "safe"):
        template, constants = "({0} * {1})", ((typed_scalar(1, target), target),)  # exact
    else:
        return None
    types = (source, *(t for _, t in constants))
    return (template, constants) if _probe(template, types, target) else None


def _example(descriptor: Any) -> Any:
    # numpy's promotion of a Python scalar (weak) or a dtype (strong), without the value
    return descriptor(1) if isinstance(descriptor, type) else np.empty((), descriptor)


@lru_cache(maxsize=8192)
def deferral(name: str, descriptors: tuple[Any, ...],
             power: float | None = None) -> Deferral | None:
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
            loop = (BOOL, result, result, result)
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
        constants = tuple((typed_scalar(v, ins[0]), ins[0]) for v in values)
        types = tuple(ins[i] for i in sources)
        if _probe(template, types + tuple(t for _, t in constants), out):
            operands = len(sources) + len(constants)
            uses = tuple(template.count(f"{{{i}}}") for i in range(operands))
            return Deferral(template, sources, types, constants, out, uses)
    return None


@lru_cache(maxsize=None)
def fused_ops() -> tuple[str, ...]:
    """The ops this device defers for at least one of bool, int32, int64, float32, float64."""
    fused = []
    for name in TEMPLATES:
        arity = 3 if name == "where" else OPS[name].impl.nin
        for dtype in NUMEXPR_TYPES:
            descriptors = (BOOL, dtype, dtype) if name == "where" else (dtype,) * arity
            if deferral(name, descriptors) is not None:
                fused.append(name)
                break
    return tuple(sorted(fused))


def descriptor(value: Any) -> Any:
    """How numpy's promotion sees an operand: a dtype (arrays, deferred values, specs, numpy
    scalars), or a Python scalar's type (weak); None for anything else."""
    if isinstance(value, (np.ndarray, DeferredValue, Spec, np.generic)):
        return value.dtype
    if type(value) is bool:
        return BOOL  # numpy treats Python bools as np.bool_, not as weak scalars
    if type(value) in (int, float, complex):
        return type(value)
    return None


def inline_power(base: Any, exponent: Any) -> float | None:
    """The exponent numexpr may spell as a constant: numpy's loop takes its fast paths for any
    exponent it does not step through (a scalar, or one element broadcast)."""
    if type(exponent) is bool:
        return None
    if isinstance(exponent, (np.ndarray, DeferredValue)):
        if exponent.size != 1 or exponent.ndim > len(getattr(base, "shape", ())):
            return None
        exponent = np.asarray(exponent).reshape(-1)[0]  # (one element, if deferred)
    try:
        value = float(exponent)
    except (TypeError, ValueError):
        return None
    return (int(value) if value.is_integer() else value) if value in INLINE_POWERS else None
