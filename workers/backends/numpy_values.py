"""numpy's results where another array module computes otherwise from the same values,
written once against that module (``xp``) for the jax and the cupy devices.

Rule: each function takes the module first and uses only what numpy, ``jax.numpy`` and CuPy
share (``where``, ``trunc``, ``fmod``, ``copysign``, ``astype``, comparisons, ``any``), so
that the same lines run on jax (``tests/unit/test_jax_differences.py``) and with numpy
standing in for CuPy (``tests/unit/test_cupy_ops.py``). A check that decides one of numpy's
errors reads one reduction's value from the device (a bool), never the data. Operands are
of numpy's loop dtype already (the devices cast them first).

- ``astype`` from a float (or complex) to an integer: numpy's loops convert as this x86
  CPU does, through its truncating conversion: a value out of range (nan, inf) becomes the
  most negative int32 or int64, and narrower integers wrap from int32. To uint32 and uint64
  numpy's vector loop converts ``x >= 2**(N-1)`` as ``x - 2**(N-1)`` and sets the top bit:
  ``[-2**(N-1), 2**N)`` wraps, above it gives 0, below it (and nan) ``2**(N-1)``. (Its
  scalar loop, for the last few elements of an array, gives other values to uint32 out of
  that range: those are left undefined.) XLA saturates (``-1.0`` to uint32 is 0, nan is 0,
  inf the maximum) and so does CUDA (CuPy documents ``-1.0`` to uint32 as 0, and inf to
  int32 as 2147483647): both compute numpy's here;
- ``floor_divide``, ``remainder``: of integers, 0 where the divisor is (XLA's ``7 // 0``
  is -2 here), and the most negative integer divided by -1 itself (C leaves it undefined);
  of floats numpy's ``npy_divmod``, step by step (CuPy's is ``floor(a / b)`` and
  ``a - floor(a / b) * b``: ``1.0 // 0.1`` is 10.0 where numpy's is 9.0, and ``-1.0 % inf``
  nan where numpy's is inf);
- ``fmod`` of integers: exact (CuPy's converts them to double: an int64 past 2**53 loses its
  last digits);
- ``refuse_negative_power``: an integer to a negative integer power is numpy's ValueError
  (CuPy gives 0, 1 or -1; XLA's ``2 ** -1`` is the most negative int64 here);
- ``refuse_negative_counts``: ``bincount`` of a negative value is numpy's ValueError (jax's
  counts it at 0);
- ``refuse_negative_repeats``: ``repeat`` by a negative count is numpy's ValueError (jax's
  drops the element, or fails with a TypeError for a single count).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The integer numpy's loop truncates a float through, for a target of 32 bits or fewer (uint32
# aside) or int64
_TRUNCATED_THROUGH = {np.dtype(t): np.dtype(through) for t, through in [
    ("int8", "int32"), ("int16", "int32"), ("int32", "int32"), ("uint8", "int32"),
    ("uint16", "int32"), ("int64", "int64")]}


def astype(xp: Any, a: Any, dtype: Any) -> Any:
    """numpy's ``a.astype(dtype)``; a float (or complex) to an integer as numpy converts."""
    dtype = np.dtype(dtype)
    if a.dtype.kind not in "fc" or dtype.kind not in "iu":
        return a.astype(dtype)
    whole = xp.trunc(xp.real(a).astype(np.float64))
    through = _TRUNCATED_THROUGH.get(dtype)
    if through is not None:
        bound = 2.0 ** (8 * through.itemsize - 1)
        valid = (whole >= -bound) & (whole < bound)  # (nan is neither)
        converted = xp.where(valid, whole, 0).astype(through)
        return xp.where(valid, converted, np.iinfo(through).min).astype(dtype)
    bits = 8 * dtype.itemsize  # (uint32, uint64: numpy's vector loop)
    top, signed = 2.0 ** (bits - 1), np.dtype(f"int{bits}")
    valid = (whole >= -top) & (whole < 2 * top)
    high = whole >= top
    below = xp.where(valid & ~high, whole, 0).astype(signed).astype(dtype)
    above = xp.where(valid & high, whole - top, 0).astype(signed).astype(dtype) | dtype.type(
        1 << (bits - 1))
    return xp.where(valid, xp.where(high, above, below),
                    xp.where(high, dtype.type(0), dtype.type(1 << (bits - 1))))


def floor_divide(xp: Any, a: Any, b: Any) -> Any:
    """numpy's ``floor_divide`` (operands of one dtype, numpy's loop's)."""
    if a.dtype.kind in "iu":
        safe = _safe_divisor(xp, a, b)
        return xp.where(b == 0, 0, xp.where(safe == b, xp.floor_divide(a, safe), a)).astype(
            a.dtype)
    return _float_divmod(xp, a, b)[0]


def remainder(xp: Any, a: Any, b: Any) -> Any:
    """numpy's ``remainder`` (operands of one dtype, numpy's loop's)."""
    if a.dtype.kind in "iu":
        safe = _safe_divisor(xp, a, b)
        return xp.where(safe == b, xp.remainder(a, safe), 0).astype(a.dtype)
    return _float_divmod(xp, a, b)[1]


def fmod(xp: Any, a: Any, b: Any) -> Any:
    """numpy's ``fmod`` (operands of one dtype, numpy's loop's): of integers exact, in their
    dtype (0 where the divisor is), the remainder taking the dividend's sign."""
    if a.dtype.kind not in "iu":
        return xp.fmod(a, b)
    mod = remainder(xp, a, b)
    return xp.where((mod != 0) & ((mod < 0) != (a < 0)), mod - b, mod).astype(a.dtype)


def _safe_divisor(xp: Any, a: Any, b: Any) -> Any:
    """``b`` where C's integer division of ``a`` by it is defined, else 1: by zero, and the
    most negative integer by -1 (numpy's quotient is ``a`` itself then, its remainder 0)."""
    undefined = b == 0
    if a.dtype.kind == "i":
        undefined = undefined | (a == np.iinfo(a.dtype).min) & (b == -1)
    return xp.where(undefined, 1, b).astype(a.dtype)


def _float_divmod(xp: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """numpy's ``npy_divmod`` for floats, step by step (its signed zeros included)."""
    mod = xp.fmod(a, b)
    div = (a - mod) / b
    adjust = (mod != 0) & ((b < 0) != (mod < 0))
    mod = xp.where(adjust, mod + b, xp.where(mod != 0, mod, xp.copysign(0.0, b)))
    div = xp.where(adjust, div - 1, div)
    floor = xp.floor(div)
    floor = xp.where(div - floor > 0.5, floor + 1, floor)
    quotient = xp.where(div != 0, floor, xp.copysign(0.0, a / b))
    quotient = xp.where(b == 0, a / b, quotient)  # (and by zero, fmod's nan: numpy's)
    return quotient.astype(a.dtype), mod.astype(a.dtype)


def refuse_negative_power(xp: Any, a: Any, b: Any) -> None:
    """numpy's ValueError where ``a ** b`` is an integer to a negative integer power."""
    if a.dtype.kind == "i" and b.dtype.kind == "i" and bool(xp.any(b < 0)):
        raise ValueError("Integers to negative integer powers are not allowed.")


def refuse_negative_counts(xp: Any, x: Any) -> None:
    """numpy's ValueError where ``bincount(x)`` is given a negative value."""
    if x.size and bool(xp.any(x < 0)):
        raise ValueError("'list' argument must have no negative elements")


def refuse_negative_repeats(xp: Any, repeats: Any) -> None:
    """numpy's ValueError where ``repeat`` is given a negative count (one, or an array)."""
    if isinstance(repeats, (int, np.integer)):
        if repeats < 0:
            raise ValueError("negative dimensions are not allowed")
    elif bool(xp.any(xp.asarray(repeats) < 0)):
        raise ValueError("repeats may not contain negative values.")

