"""numpy's NaN-skipping functions on tensors (``np.nansum``, ``nanprod``, ``nanmean``,
``nanvar``, ``nanstd``, ``nanmin``, ``nanmax``, ``nanargmin``, ``nanargmax``, ``nancumsum``,
``nancumprod``): NEP 18 handlers, registered in ``fabric.arrays.tensor.ARRAY_FUNCTIONS`` as
``fabric.arrays.numpy_functions``'s are. xarray's reductions of floating data reach them
(``da.mean("time")`` skips NaNs through ``np.nanmean``).

Rule: numpy's own formulas (``numpy/lib/_nanfunctions_impl.py``) in tensor ops, with numpy's
values and dtypes: the NaNs replaced by the reduction's identity, the values that are not NaN
counted where the result divides by their count, and NaN where a slice held nothing else.
Integer and bool tensors hold no NaN: theirs are the plain functions. Nothing is read, but
by ``nanargmin``/``nanargmax``, which raise numpy's ValueError for a slice of NaNs alone and
so read whether there is one (one byte); numpy's RuntimeWarnings for such slices ("Mean of
empty slice", "All-NaN slice encountered") would need that read too, and are not issued.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from fabric.arrays.numpy_functions import _no_out
from fabric.arrays.tensor import ARRAY_FUNCTIONS, Tensor


def _nan_mask(a: Tensor) -> Tensor | None:
    """Where ``a`` is NaN; None where its dtype holds no NaN."""
    return np.isnan(a) if a.dtype.kind in "fc" else None


def _filled(a: Tensor, mask: Tensor | None, value: complex) -> Tensor:
    return a if mask is None else np.where(mask, value, a)


def _cast(a: Tensor, dtype: np.dtype) -> Tensor:
    return a if a.dtype == dtype else a.astype(dtype)


def _divide_by_count(a: Tensor, count: Tensor) -> Tensor:
    # numpy's: the quotient in a's dtype, NaN where the count is not positive (numpy divides
    # by it and then writes NaN there; here no division by zero warns on the device)
    quotient = _cast(a / np.maximum(count, 1), a.dtype)
    return np.where(count > 0, quotient, np.nan)


def _skipping(name: str, identity: int) -> Callable[..., Tensor]:
    # np.nansum, np.nanprod: the reduction of the values with each NaN its identity
    def function(a: Tensor, axis: Any = None, dtype: Any = None, out: Any = None,
                 keepdims: bool = False) -> Tensor:
        _no_out(f"nan{name}", out)
        return _filled(a, _nan_mask(a), identity)._reduce(name, axis, keepdims, dtype=dtype)
    return function


def _scan(name: str, identity: int) -> Callable[..., Tensor]:
    # np.nancumsum, np.nancumprod
    def function(a: Tensor, axis: int | None = None, dtype: Any = None,
                 out: Any = None) -> Tensor:
        _no_out(f"nan{name}", out)
        return getattr(_filled(a, _nan_mask(a), identity), name)(axis, dtype)
    return function


def _nanmean(a: Tensor, axis: Any = None, dtype: Any = None, out: Any = None,
             keepdims: bool = False) -> Tensor:
    _no_out("nanmean", out)
    mask = _nan_mask(a)
    if mask is None:
        return a.mean(axis, keepdims, dtype)
    total = np.where(mask, 0, a)._reduce("sum", axis, keepdims, dtype=dtype)
    return _divide_by_count(total, (~mask)._reduce("sum", axis, keepdims, dtype=np.intp))


def _nanvar(a: Tensor, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0,
            keepdims: bool = False) -> Tensor:
    _no_out("nanvar", out)
    mask = _nan_mask(a)
    if mask is None:
        return a.var(axis, keepdims, ddof, dtype)
    count = (~mask)._reduce("sum", axis, True, dtype=np.intp)
    mean = _divide_by_count(np.where(mask, 0, a)._reduce("sum", axis, True, dtype=dtype),
                            count)
    deviation = np.where(mask, 0, _cast(a - mean, a.dtype))
    if a.dtype.kind == "c":  # (numpy's |x|^2: the real part of x times its conjugate)
        squares = a.session.apply("real", (deviation * np.conjugate(deviation),), {})
    else:
        squares = deviation * deviation
    variance = squares._reduce("sum", axis, keepdims, dtype=dtype)
    return _divide_by_count(variance, count.reshape(variance.shape) - ddof)


def _nanstd(a: Tensor, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0,
            keepdims: bool = False) -> Tensor:
    return np.sqrt(_nanvar(a, axis, dtype, out, ddof, keepdims))


def _extreme(name: str, fill: float) -> Callable[..., Tensor]:
    # np.nanmin, np.nanmax: the NaNs made the values no other passes (for complex values,
    # compared as numpy does, real part first, both parts), NaN where there was none else
    def function(a: Tensor, axis: Any = None, out: Any = None,
                 keepdims: bool = False) -> Tensor:
        _no_out(f"nan{name}", out)
        mask = _nan_mask(a)
        if mask is None:
            return a._reduce(name, axis, keepdims)
        filled = np.where(mask, complex(fill, fill) if a.dtype.kind == "c" else fill, a)
        return np.where(mask._reduce("all", axis, keepdims), np.nan,
                        filled._reduce(name, axis, keepdims))
    return function


def _arg_extreme(name: str, fill: float) -> Callable[..., Tensor]:
    # np.nanargmin, np.nanargmax: numpy's ValueError for a slice of NaNs alone
    def function(a: Tensor, axis: int | None = None, out: Any = None, *,
                 keepdims: bool = False) -> Tensor:
        _no_out(f"nan{name}", out)
        mask = _nan_mask(a)
        if mask is not None:
            if a.size and bool(mask._reduce("all", axis, False).any()):  # (one byte read)
                raise ValueError("All-NaN slice encountered")
            a = np.where(mask, fill, a)
        return a._reduce(name, axis, keepdims)
    return function


ARRAY_FUNCTIONS.update({
    np.nansum: _skipping("sum", 0),
    np.nanprod: _skipping("prod", 1),
    np.nancumsum: _scan("cumsum", 0),
    np.nancumprod: _scan("cumprod", 1),
    np.nanmean: _nanmean,
    np.nanvar: _nanvar,
    np.nanstd: _nanstd,
    np.nanmin: _extreme("min", math.inf),
    np.nanmax: _extreme("max", -math.inf),
    np.nanargmin: _arg_extreme("argmin", math.inf),
    np.nanargmax: _arg_extreme("argmax", -math.inf),
})
