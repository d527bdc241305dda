"""The standard's elementwise functions (``sin``, ``add``, ``clip``, ``real``, ...): each one op
of the table on the device, under the standard's name.

Rule: a function is numpy's ufunc of the op table (``fabric.core.ops``), so its result's dtype
is numpy 2's, which is the standard's wherever the standard defines one. Its operands are
tensors or Python scalars (one at least a tensor): a scalar takes the tensor's dtype, as the
standard says (``fabric.array_api.dtypes.operands``). Nothing is read.
"""

from __future__ import annotations

from typing import Any, Callable

from fabric.array_api.dtypes import operand, operands
from fabric.arrays.tensor import Tensor

# The standard's name -> the op table's, for the functions of one array
UNARY = {
    "abs": "absolute", "acos": "arccos", "acosh": "arccosh", "asin": "arcsin",
    "asinh": "arcsinh", "atan": "arctan", "atanh": "arctanh", "bitwise_invert": "invert",
    "ceil": "ceil", "conj": "conjugate", "cos": "cos", "cosh": "cosh", "exp": "exp",
    "floor": "floor", "imag": "imag", "isfinite": "isfinite",
    "isinf": "isinf", "isnan": "isnan", "log": "log", "log1p": "log1p", "log2": "log2",
    "log10": "log10", "logical_not": "logical_not", "negative": "negative",
    "positive": "positive", "real": "real", "reciprocal": "reciprocal",
    "signbit": "signbit", "sin": "sin", "sinh": "sinh", "square": "square", "sqrt": "sqrt",
    "tan": "tan", "tanh": "tanh", "trunc": "trunc",
}
# ... and of two
BINARY = {
    "add": "add", "atan2": "arctan2", "bitwise_and": "bitwise_and",
    "bitwise_left_shift": "left_shift", "bitwise_or": "bitwise_or",
    "bitwise_right_shift": "right_shift", "bitwise_xor": "bitwise_xor", "copysign": "copysign",
    "divide": "divide", "equal": "equal", "greater": "greater",
    "greater_equal": "greater_equal", "hypot": "hypot", "less": "less",
    "less_equal": "less_equal", "logaddexp": "logaddexp", "logical_and": "logical_and",
    "logical_or": "logical_or", "logical_xor": "logical_xor", "maximum": "maximum",
    "minimum": "minimum", "multiply": "multiply", "nextafter": "nextafter",
    "not_equal": "not_equal", "pow": "power", "remainder": "remainder",
    "subtract": "subtract",
}


def tensor_argument(x: Any, name: str) -> Tensor:
    """``x``, which must be a fabric tensor (TypeError naming function ``name`` otherwise)."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} takes a fabric tensor, not {type(x).__name__}: make one with "
                        "the namespace's xp.asarray.")
    return x


def _unary(name: str, op: str) -> Callable[[Tensor], Tensor]:
    def function(x: Tensor, /) -> Tensor:
        x = tensor_argument(x, name)
        return x.session.apply(op, (x,), {})
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"The standard's ``{name}``: numpy's ``{op}`` of each element, on "
                        "the device.")
    return function


def _binary(name: str, op: str) -> Callable[[Any, Any], Tensor]:
    def function(x1: Tensor | complex, x2: Tensor | complex, /) -> Tensor:
        a, b = operands(x1, x2)
        return (a if isinstance(a, Tensor) else b).session.apply(op, (a, b), {})
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"The standard's ``{name}``: numpy's ``{op}`` of each pair of elements "
                        "(broadcast; a Python scalar takes the tensor's dtype), on the device.")
    return function


def sign(x: Tensor, /) -> Tensor:
    """-1, 0 or 1 by each element's sign; of a complex element, ``x / |x|`` as the standard
    defines it (+0 + 0j for a zero of either sign), where numpy's differs on infinities and
    zeros' signs."""
    x = tensor_argument(x, "sign")
    if x.dtype.kind != "c":
        return x.session.apply("sign", (x,), {})
    session = x.session
    nonzero = session.apply("not_equal", (x, 0), {})
    magnitude = session.apply("absolute", (session.apply("where", (nonzero, x, 1.0), {}),), {})
    return session.apply("where", (nonzero, session.apply("divide", (x, magnitude), {}), 0), {})


def expm1(x: Tensor, /) -> Tensor:
    """``exp(x) - 1``, accurate near 0; of a complex infinity or NaN, ``exp(x) - 1`` with the
    standard's special cases (numpy's expm1 gives NaNs there), and of a complex zero, +0."""
    x = tensor_argument(x, "expm1")
    session = x.session
    if x.dtype.kind != "c":
        return session.apply("expm1", (x,), {})
    finite = session.apply("isfinite", (x,), {})
    near = session.apply("where", (finite, session.apply("expm1", (x,), {}), session.apply(
        "subtract", (session.apply("exp", (x,), {}), 1), {})), {})
    return session.apply("add", (near, complex(0.0, -0.0)), {})  # (a -0 real part: +0)


def floor_divide(x1: Tensor | float, x2: Tensor | float, /) -> Tensor:
    """The floor of ``x1 / x2``; of floats, the standard's special cases where numpy's
    differ: an infinity by a finite number is an infinity, a finite number by an infinity a
    zero (signed by the operands), where numpy gives NaN, 0 or -1."""
    a, b = operands(x1, x2)
    session = (a if isinstance(a, Tensor) else b).session
    found = session.apply("floor_divide", (a, b), {})
    if found.dtype.kind != "f":
        return found
    finite_a, finite_b = (session.apply("isfinite", (v,), {}) for v in (a, b))
    infinite_a, infinite_b = (session.apply("isinf", (v,), {}) for v in (a, b))
    special = session.apply("logical_or", (
        session.apply("logical_and", (infinite_a, session.apply("logical_and", (
            finite_b, session.apply("not_equal", (b, 0), {})), {})), {}),
        session.apply("logical_and", (infinite_b, session.apply("logical_and", (
            finite_a, session.apply("not_equal", (a, 0), {})), {})), {})), {})
    return session.apply("where", (special, session.apply("divide", (a, b), {}), found), {})


def round(x: Tensor, /) -> Tensor:  # noqa: A001  (the standard's name)
    """Each element rounded to the nearest integer, halves to even (complex: both parts)."""
    return tensor_argument(x, "round").round()


def clip(x: Tensor, /, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
    """Each element limited to [min, max] (tensors or Python scalars, either may be None); the
    result has ``x``'s dtype, as the standard says."""
    x = tensor_argument(x, "clip")
    if min is None and max is None:
        return x.copy()
    bounds = [bound if bound is None else operand(bound) for bound in (min, max)]
    clipped = x.session.apply("clip", (x, *bounds), {})
    return clipped if clipped.dtype == x.dtype else clipped.astype(x.dtype)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{name: _unary(name, op) for name, op in UNARY.items()},
    **{name: _binary(name, op) for name, op in BINARY.items()},
    "round": round, "clip": clip, "sign": sign, "expm1": expm1, "floor_divide": floor_divide,
}
