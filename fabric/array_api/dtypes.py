"""The standard's data types, constants and data type functions (``isdtype``, ``result_type``,
``can_cast``, ``finfo``, ``iinfo``), and how a function's operands become tensors.

Rule: a dtype of the namespace is numpy's ``np.dtype`` (a tensor's ``dtype`` compares equal to
it). Promotion is the standard's table: numpy 2's own wherever the standard defines a result
(array with array, and a Python scalar taking the array's dtype), numpy's beyond it (int with
float arrays, which the standard leaves to the library). Nothing here sends an op.
"""

from __future__ import annotations

import builtins
import math
from typing import Any, NamedTuple

import numpy as np

from fabric.arrays.tensor import Tensor
from fabric.core.errors import named

bool = np.dtype(np.bool_)  # noqa: A001  (the standard's name)
int8, int16, int32, int64 = (np.dtype(f"int{n}") for n in (8, 16, 32, 64))
uint8, uint16, uint32, uint64 = (np.dtype(f"uint{n}") for n in (8, 16, 32, 64))
float32, float64 = np.dtype("float32"), np.dtype("float64")
complex64, complex128 = np.dtype("complex64"), np.dtype("complex128")

DTYPES = {str(dtype): dtype for dtype in (
    bool, int8, int16, int32, int64, uint8, uint16, uint32, uint64, float32, float64,
    complex64, complex128)}
DEFAULT_DTYPES = {"real floating": float64, "complex floating": complex128,
                  "integral": int64, "indexing": int64}

e, inf, nan, pi = math.e, math.inf, math.nan, math.pi
newaxis = None

# The standard's kinds (``isdtype``), by numpy's kind letters
_KINDS = {"bool": "b", "signed integer": "i", "unsigned integer": "u", "integral": "iu",
          "real floating": "f", "complex floating": "c", "numeric": "iufc"}


def dtype_of(value: Any) -> np.dtype:
    """The namespace's dtype of ``value``: a dtype of the standard's thirteen, or an array's;
    TypeError for anything else."""
    # (numpy's scalar types, np.float32, name their dtype as Python's float does float64;
    # their class attribute ``dtype`` is no dtype)
    dtype = value if isinstance(value, (np.dtype, type)) else getattr(value, "dtype", value)
    try:
        found = np.dtype(dtype) if dtype is not None else None
    except TypeError:
        found = None
    if found is None or str(found) not in DTYPES:
        raise TypeError(f"{named(value)} is not a dtype of the array API standard: use one of "
                        f"fabric.array_api's ({', '.join(DTYPES)}).")
    return found


def isdtype(dtype: np.dtype, kind: Any) -> builtins.bool:
    """Whether ``dtype`` is of ``kind``: a dtype, one of the standard's kind names ('bool',
    'signed integer', 'unsigned integer', 'integral', 'real floating', 'complex floating',
    'numeric'), or a tuple of them."""
    dtype = dtype_of(dtype)
    if isinstance(kind, tuple):
        return any(isdtype(dtype, each) for each in kind)
    if isinstance(kind, str):
        if kind not in _KINDS:
            raise ValueError(f"{kind!r} is not a dtype kind of the standard: use one of "
                             f"{', '.join(map(repr, _KINDS))}, a dtype, or a tuple of them.")
        return dtype.kind in _KINDS[kind]
    return dtype == dtype_of(kind)


def _promotable(a: np.dtype, b: np.dtype) -> builtins.bool:
    """Whether the standard defines the promotion of ``a`` and ``b`` (within one kind:
    bool, integers, floating)."""
    if a.kind == "b" or b.kind == "b":
        return a.kind == b.kind
    return (a.kind in "iu") == (b.kind in "iu")


def result_type(*arrays_and_dtypes: Any) -> np.dtype:
    """The dtype the standard's promotion gives ``arrays_and_dtypes`` (arrays, dtypes, and
    Python scalars, which take the others' dtype); numpy's where the standard defines none
    (integers with floating, bool with numbers)."""
    dtypes = [dtype_of(a) for a in arrays_and_dtypes
              if not isinstance(a, (builtins.bool, int, float, complex))]
    scalars = [a for a in arrays_and_dtypes if isinstance(a, (builtins.bool, int, float, complex))]
    if not dtypes:  # (a TypeError, as numpy's protocols refuse operands: xarray asks of each
        # operand alone, and takes one for "no dtype of its own")
        raise TypeError("result_type needs at least one array or dtype (Python scalars alone "
                        "have no dtype in the standard).")
    found = np.result_type(*dtypes)
    return np.result_type(found, *scalars) if scalars else found


def can_cast(from_: Any, to: np.dtype, /) -> builtins.bool:
    """Whether ``from_`` (a dtype or an array) casts to ``to`` by the standard's promotion:
    within its kind, to a dtype that holds every value (integers never to floating)."""
    source, target = dtype_of(from_), dtype_of(to)
    if source == target:
        return True
    if not _promotable(source, target):
        return False
    return np.result_type(source, target) == target


class FInfo(NamedTuple):
    """Machine limits of a floating dtype (of a complex dtype's real part), as Python floats."""

    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: np.dtype


class IInfo(NamedTuple):
    """Machine limits of an integer dtype."""

    bits: int
    max: int
    min: int
    dtype: np.dtype


def finfo(type: Any, /) -> FInfo:  # noqa: A002  (the standard's name)
    """The limits of a floating dtype, or an array's."""
    dtype = dtype_of(type)
    if dtype.kind not in "fc":
        raise TypeError(f"finfo takes a floating dtype, not {dtype}: use iinfo for integers.")
    found = np.finfo(dtype)
    return FInfo(found.bits, float(found.eps), float(found.max), float(found.min),
                 float(found.smallest_normal), found.dtype)


def iinfo(type: Any, /) -> IInfo:  # noqa: A002  (the standard's name)
    """The limits of an integer dtype, or an array's."""
    dtype = dtype_of(type)
    if dtype.kind not in "iu":
        raise TypeError(f"iinfo takes an integer dtype, not {dtype}: use finfo for floating.")
    found = np.iinfo(dtype)
    return IInfo(found.bits, int(found.max), int(found.min), found.dtype)


def session_of(*values: Any) -> Any:
    """The session of the first tensor among ``values`` (lists and tuples looked into);
    TypeError where there is none."""
    for value in values:
        if isinstance(value, Tensor):
            return value.session
        if isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, Tensor):
                    return item.session
    raise TypeError("fabric.array_api's functions take fabric tensors: make them with the "
                    "namespace's creation functions (xp.asarray, xp.zeros, ...).")


def operand(value: Any) -> Any:
    """A scalar operand of a function of a tensor: a Python scalar as it is (numpy's weak
    scalar takes the tensor's dtype, as the standard's does; a complex one travels as a 0-d
    tensor of that dtype, ``session.apply``'s rule); a numpy scalar of the standard's dtypes
    as numpy 2 takes it, its dtype promoted as an array's (xarray's fill values are such, as
    ``result_type`` takes them); numpy arrays refused."""
    if isinstance(value, np.generic):
        dtype_of(value)  # (TypeError for a dtype the standard has not)
        return value
    if isinstance(value, np.ndarray):
        raise TypeError("fabric.array_api's functions take fabric tensors and Python scalars, "
                        "not numpy arrays: upload them with xp.asarray first.")
    return value


def operands(x1: Any, x2: Any) -> tuple[Tensor | Any, Tensor | Any]:
    """Two operands of an elementwise function, at least one a tensor, scalars as ``operand``
    makes them; TypeError where both are scalars, or the standard's kinds do not mix."""
    if isinstance(x1, Tensor):
        if isinstance(x2, Tensor):
            return x1, x2
        return x1, operand(x2)
    if isinstance(x2, Tensor):
        return operand(x1), x2
    raise TypeError("An elementwise function of fabric.array_api takes at least one fabric "
                    "tensor: make one with xp.asarray.")
