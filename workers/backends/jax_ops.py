"""The ops ``jax.numpy`` spells otherwise than numpy, written so that they compute numpy's.

Rule: each function here gives numpy's result (dtype, shape, values within rounding, and
numpy's errors) where ``Op.over(jnp)`` would not; the jax device uses the table's build for
every other op. What numpy decides from the data (an index out of bounds, an integer to a
negative power, a singular matrix, an eigenvalue that is real) is checked on the data, so
those ops cannot be traced into a compiled graph: ``NEEDS_DATA`` says which, and a graph
that holds one runs op by op.

What differs and why:
- updates (``setitem``, ``ufunc_at``): jax arrays never change, so an update is ``.at[]``'s
  new array (a fabric device array never changes either: the client rebinds its handle);
  the values are cast to the target's dtype as numpy's assignment casts them; a ``setitem``
  whose index repeats a position is numpy's own on a host copy (numpy stores the last value
  given for it, XLA's scatter on a GPU any one);
- integer array indices: jax clamps one out of bounds, numpy raises IndexError: the index is
  checked by numpy itself, on a stand-in of the target (no copy of its data);
- ``astype`` from a float to an integer (XLA's saturates), ``floor_divide`` and
  ``remainder`` (an integer divided by zero, a float's signed zeros), ``power`` of an
  integer to a negative power, ``bincount`` of a negative value and ``repeat`` by a negative
  count (numpy refuses these): ``numpy_values``, shared with the cupy device; ``sign`` of
  -0.0 is +0.0; ``searchsorted`` with a sorter is numpy's own on host copies;
- numpy's reductions and scans take axis 0 (or -1) of a 0-d array, jax's refuse it;
- ``eig`` is real where every eigenvalue is (jax's is always complex); ``inv`` and ``solve``
  of a singular matrix raise ``LinAlgError`` as LAPACK's exact zero pivot makes numpy do,
  and ``svd``, ``pinv`` and ``lstsq`` of a matrix holding a nan as LAPACK's SVD, which does
  not converge then, makes numpy do (XLA's gives nans);
- ``sort`` and ``argsort`` take numpy's ``kind`` (jax's refuse it): a stable sort for each;
- a quantile's methods that pick a value (lower, higher, nearest, inverted_cdf,
  closest_observation) keep the input's dtype (a bool's too) and round nearest's ties to
  even, as numpy's (jax's compute in a float); the methods jnp.quantile lacks (numpy's other
  Hyndman and Fan estimators) are numpy's, step by step;
- what numpy refuses on the values, jax computes: ``nanargmin`` of an all-nan slice,
  ``average`` of weights that sum to zero, a histogram's edges that do not increase are
  refused here as numpy refuses them; ``lstsq``'s residuals are numpy's (none unless the
  rank is full).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fabric.core.op_indexing import bind_index
from fabric.core.ops import OPS, QUANTILES, ufunc_named
from fabric.core.ops_functions import (cut_off, decomposition, lstsq as lstsq_over,
                                       pinv as pinv_over)
from fabric.core.ops_statistics import average as average_over, histogram as histogram_of

from . import numpy_values
from .index_checks import checked_index, fitted_value, repeats_a_position

astype, floor_divide, remainder = (functools.partial(function, jnp) for function in (
    numpy_values.astype, numpy_values.floor_divide, numpy_values.remainder))

# ufunc.at as jax's .at[] methods; the others run numpy's ufunc.at on a host copy
_AT_METHODS = {"add": "add", "multiply": "multiply", "minimum": "min", "maximum": "max",
               "divide": "divide", "power": "power"}


def _cast(value: Any, dtype: np.dtype) -> Any:
    """An update's value as its target's dtype holds it (numpy's assignment casting)."""
    if isinstance(value, jax.Array):
        return value if value.dtype == dtype else astype(value, dtype)
    return np.asarray(value).astype(dtype)


def getitem(array: Any, *arrays: Any, index: tuple[Any, ...]) -> Any:
    """``array[index]``."""
    return array[checked_index(array, index, arrays)]


def setitem(array: Any, value: Any, *arrays: Any, index: tuple[Any, ...]) -> Any:
    """A copy of ``array`` with ``array[index] = value`` (the value's leading lengths of one
    beyond the selection's dimensions dropped, as numpy drops them; jax's ``.at`` refuses)."""
    key = checked_index(array, index, arrays, value)
    host_arrays = [np.asarray(a) for a in arrays]
    if arrays and repeats_a_position(array.shape, bind_index(index, host_arrays)):
        # (numpy stores the last of the values given for a position; XLA's scatter, on a
        # GPU, any one of them): numpy's own, on a host copy
        host = OPS["setitem"].impl(np.asarray(array), np.asarray(value), *host_arrays,
                                   index=index)
        return jax.device_put(host, next(iter(array.devices())))
    return array.at[key].set(fitted_value(array, _cast(value, array.dtype), index, arrays))


def ufunc_at(array: Any, *operands: Any, ufunc: str, index: tuple[Any, ...]) -> Any:
    """A copy of ``array`` after ``np.<ufunc>.at(array, index, *values)``: computed in the
    dtype numpy's loop takes, and cast back as numpy's ``at`` casts (repeated indices
    accumulate in that dtype, where numpy rounds at each)."""
    function = ufunc_named(ufunc)
    values, arrays = operands[:function.nin - 1], operands[function.nin - 1:]
    key = checked_index(array, index, arrays)
    method = _AT_METHODS.get(ufunc)
    if method is None or ufunc == "power" and array.dtype.kind in "iu":  # (numpy's checks)
        host = np.array(array)  # a host copy: numpy's own ufunc.at, moved back
        function.at(host, bind_index(index, [np.asarray(a) for a in arrays]),
                    *[np.asarray(v) for v in values])
        return jax.device_put(host, next(iter(array.devices())))
    loop = function.resolve_dtypes((array.dtype, *[_descriptor(v) for v in values], None))[-1]
    widened = array.astype(loop)
    updated = getattr(widened.at[key], method)(*[_cast(v, loop) for v in values])
    return updated.astype(array.dtype)


def _descriptor(value: Any) -> Any:
    """How numpy's promotion sees an operand: a dtype, or a Python scalar's type (weak)."""
    if isinstance(value, (jax.Array, np.ndarray, np.generic)):
        return value.dtype
    return np.dtype(bool) if type(value) is bool else type(value)


def sign(a: Any) -> Any:
    """numpy's ``sign``: of a zero (-0.0 too) +0, of nan nan."""
    result = jnp.sign(a)
    return jnp.where(a == 0, jnp.zeros((), a.dtype), result) if a.dtype.kind == "f" else result


def power(a: Any, b: Any) -> Any:
    """numpy's ``power``: an integer to a negative integer power is refused."""
    numpy_values.refuse_negative_power(jnp, a, b)
    return jnp.power(a, b)


def bincount(x: Any, *weights: Any, minlength: int = 0) -> Any:
    """numpy's ``bincount``: a negative value is refused (jax's would drop it)."""
    numpy_values.refuse_negative_counts(jnp, x)
    return jnp.bincount(x, *weights, minlength=minlength)


def _nonsingular(a: Any) -> None:
    """LAPACK's test, which numpy's ``inv`` and ``solve`` raise on: an exact zero pivot."""
    lu, _ = jax.scipy.linalg.lu_factor(a)
    if bool(jnp.any(jnp.diagonal(lu, axis1=-2, axis2=-1) == 0)):
        raise np.linalg.LinAlgError("Singular matrix")


def inv(a: Any) -> Any:
    """numpy's ``linalg.inv``."""
    _nonsingular(a)
    return jnp.linalg.inv(a)


def solve(a: Any, b: Any) -> Any:
    """numpy's ``linalg.solve``."""
    _nonsingular(a)
    return jnp.linalg.solve(a, b)


_packed_eig = decomposition("eig")(jnp)


def eig(a: Any) -> Any:
    """numpy's ``linalg.eig``, packed: real where every eigenvalue is, as numpy's."""
    packed = _packed_eig(a)
    if a.dtype.kind != "c" and not bool(jnp.any(packed[..., 0, :].imag != 0)):
        return packed.real
    return packed


def axis_of_0d(name: str, scan: bool) -> Callable[..., Any]:
    """jnp's reduction or scan ``name`` with numpy's quirk: axis 0 (or -1) of a 0-d array is
    taken (a reduction's result is then 0-d, a scan's of shape (1,))."""
    function = getattr(jnp, name)

    def run(a: Any, *where: Any, axis: Any = None, **params: Any) -> Any:
        if a.ndim == 0 and isinstance(axis, int) and axis in (0, -1):
            a, axis = (a.reshape(1), 0) if scan else (a, None)
        if where:
            params["where"] = where[0]
        return jnp.asarray(function(a, axis=axis, **params))
    return run


def nan_index(name: str) -> Callable[..., Any]:
    """numpy's ``nanargmin`` or ``nanargmax``: an all-nan slice is refused (jax's gives an
    index of a nan)."""
    run = axis_of_0d(name, scan=False)

    def checked(a: Any, axis: Any = None, **params: Any) -> Any:
        if a.size and bool(jnp.any(jnp.all(jnp.isnan(a), axis=axis if a.ndim else None))):
            raise ValueError("All-NaN slice encountered")
        return run(a, axis=axis, **params)
    return checked


_average = average_over(jnp)


def average(a: Any, *weights: Any, **params: Any) -> Any:
    """numpy's ``average``: weights that sum to zero are refused."""
    if weights and bool(jnp.any(jnp.sum(weights[0], axis=params.get("axis")
                                        if weights[0].shape == a.shape else None) == 0)):
        raise ZeroDivisionError("Weights sum to zero, can't be normalized")
    return _average(a, *weights, **params)


def histogram(part: str) -> Callable[..., Any]:
    """numpy's ``histogram`` or ``histogram_bin_edges``: edges that do not increase are
    refused."""
    run = histogram_of(part)(jnp)

    def checked(a: Any, *given: Any, bins: int | None = None, **params: Any) -> Any:
        if bins is None and bool(jnp.any(jnp.diff(given[0]) < 0)):
            raise ValueError("`bins` must increase monotonically, when an array")
        return run(a, *given, bins=bins, **params)
    return checked


def _converging(a: Any, message: str) -> None:
    """LAPACK's SVD does not converge on a nan, and numpy raises: ``LinAlgError`` with
    numpy's ``message`` where ``a`` holds one (XLA's SVD gives nans)."""
    if a.dtype.kind in "fc" and bool(jnp.any(jnp.isnan(a))):
        raise np.linalg.LinAlgError(message)


_svd, _pinv, _lstsq = decomposition("svd")(jnp), pinv_over(jnp), lstsq_over(jnp)


def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True,
        hermitian: bool = False) -> Any:
    """numpy's ``linalg.svd``, packed: of a matrix holding a nan, numpy's ``LinAlgError``
    (a hermitian one's goes through eigh, whose convergence on nans numpy's data decides:
    computed as it is)."""
    if not hermitian:
        _converging(a, "SVD did not converge")
    return _svd(a, full_matrices=full_matrices, compute_uv=compute_uv, hermitian=hermitian)


def pinv(a: Any, *rtol: Any, hermitian: bool = False, **params: Any) -> Any:
    """numpy's ``linalg.pinv`` (through an SVD: nans refused as ``svd`` refuses them)."""
    if not hermitian:
        _converging(a, "SVD did not converge")
    return _pinv(a, *rtol, hermitian=hermitian, **params)


def lstsq(a: Any, b: Any, rcond: float | None = None) -> Any:
    """numpy's ``linalg.lstsq`` without its residuals, packed: ``a`` holding a nan refused
    as numpy's SVD refuses it (a nan in ``b`` alone is computed)."""
    _converging(a, "SVD did not converge in Linear Least Squares")
    return _lstsq(a, b, rcond=rcond)


def lstsq_residuals(a: Any, b: Any, rcond: float | None = None) -> Any:
    """numpy's residuals of ``lstsq``: none unless the rank is full and a has more rows than
    columns."""
    _converging(a, "SVD did not converge in Linear Least Squares")
    return jnp.linalg.lstsq(a, b, rcond=cut_off(a, rcond), numpy_resid=True)[1]


def convolve(a: Any, v: Any, mode: str = "full") -> Any:
    """numpy's ``convolve``: of integers, in their dtype (jax's convolution is float's)."""
    return jnp.convolve(a, v, mode=mode,
                        preferred_element_type=a.dtype if a.dtype.kind in "iu" else None)


def searchsorted(a: Any, v: Any, *sorter: Any, side: str = "left") -> Any:
    """numpy's ``searchsorted``: its sorter, where given, a third input, and then numpy's own
    on host copies (numpy refuses a sorter index past the array where its search reads it;
    jax's reads there)."""
    if sorter:
        return jnp.asarray(np.searchsorted(np.asarray(a), np.asarray(v), side=side,
                                           sorter=np.asarray(sorter[0])))
    return jnp.searchsorted(a, v, side=side)


def repeat(a: Any, repeats: Any, axis: int | None = None) -> Any:
    """numpy's ``repeat``: a negative count refused, as numpy refuses it."""
    numpy_values.refuse_negative_repeats(jnp, repeats)
    return jnp.repeat(a, repeats, axis)


def ufunc_method(method: str) -> Callable[..., Any]:
    """numpy's ``ufunc.reduce`` or ``.accumulate``: of jnp's ufunc of that name, or of one
    made of jnp's function where jnp has none (``jnp.frompyfunc``, numpy's identity); axis 0
    of a 0-d array taken, as numpy's reductions take it."""
    def run(a: Any, *where: Any, ufunc: str, axis: Any = 0, **params: Any) -> Any:
        own, numpys = getattr(jnp, ufunc), ufunc_named(ufunc)
        if not isinstance(own, jnp.ufunc):
            own = jnp.frompyfunc(own, numpys.nin, numpys.nout, identity=numpys.identity)
        if a.ndim == 0 and isinstance(axis, int) and axis in (0, -1):
            axis = None
        if where:
            params["where"] = where[0]
        return jnp.asarray(getattr(own, method)(a, axis=axis, **params))
    return run


# numpy's quantile methods by the index into a slice's ``n`` sorted values that ``q`` takes
# (numpy's ``_QuantileMethods``). Those that pick a value, a whole index: kept in the input's
# dtype (jnp.quantile computes lower, higher and nearest in a float and rounds nearest's ties
# down, where numpy's ``around`` rounds them to even, as ``jnp.round``; it has no other)
def _rounded(rounding: Callable[[Any], Any]) -> Callable[[Any, Any], Any]:
    return lambda n, q: rounding((n - 1) * q)


def _boundary(shift: float, odd_stays: bool) -> Callable[[Any, Any], Any]:
    """numpy's ``_discrete_interpolation_to_boundaries``: ``n * q - 1 - shift``, raised to
    the next whole index unless it is whole (and, for ``odd_stays``, odd)."""
    def index(n: Any, q: Any) -> Any:
        at = n * q - 1 - shift
        before = jnp.floor(at)
        stays = (at == before) & (before % 2 == 1) if odd_stays else at == before
        return jnp.maximum(jnp.where(stays, before, before + 1), 0)
    return index


def _hyndman_fan(alpha: float, beta: float) -> Callable[[Any, Any], Any]:
    """numpy's ``_compute_virtual_index``: Hyndman and Fan's ``alpha`` and ``beta``."""
    return lambda n, q: n * q + (alpha + q * (1 - alpha - beta)) - 1


_PICKING = {"lower": _rounded(jnp.floor), "higher": _rounded(jnp.ceil),
            "nearest": _rounded(jnp.round), "inverted_cdf": _boundary(0, False),
            "closest_observation": _boundary(0.5, True)}
# ...and those that interpolate between the values around a fractional index (linear and
# midpoint are jnp.quantile's own)
_INTERPOLATING = {"averaged_inverted_cdf": lambda n, q: n * q - 1,
                  "interpolated_inverted_cdf": _hyndman_fan(0, 1),
                  "hazen": _hyndman_fan(0.5, 0.5), "weibull": _hyndman_fan(0, 0),
                  "median_unbiased": _hyndman_fan(1 / 3, 1 / 3),
                  "normal_unbiased": _hyndman_fan(3 / 8, 3 / 8)}


def quantile(name: str) -> Callable[..., Any]:
    """numpy's ``percentile`` or ``quantile``: ``q`` a list too (jax takes arrays only); each
    of numpy's methods that jnp's lacks or computes otherwise (``_PICKING``,
    ``_INTERPOLATING``) as numpy computes it."""
    function = getattr(jnp, name)
    skip_nan, percent = name.startswith("nan"), name.endswith("percentile")

    def run(a: Any, q: Any, axis: Any = None, method: str = "linear", keepdims: bool = False,
            **params: Any) -> Any:
        q = jnp.asarray(q)
        if method not in _PICKING and method not in _INTERPOLATING:
            return function(a, q, axis=axis, method=method, keepdims=keepdims, **params)
        q = q.astype(np.float64) / 100 if percent else q.astype(np.float64)
        return _quantiles(a, q, axis, method, keepdims, skip_nan)
    return run


def _quantiles(a: Any, q: Any, axis: Any, method: str, keepdims: bool, skip_nan: bool) -> Any:
    """The quantiles of ``a`` along ``axis`` (None, an int, a tuple) at each ``q`` by numpy's
    ``method``: ``q``'s axes first, as numpy's. A slice holding a nan gives nan (a nan one's:
    its other values, and nan where all are nan)."""
    reduced = tuple(range(a.ndim)) if axis is None else tuple(
        sorted(x % a.ndim for x in np.atleast_1d(axis)))
    kept = [d for d in range(a.ndim) if d not in reduced]
    rows = jnp.transpose(a, kept + list(reduced)).reshape(
        *[a.shape[d] for d in kept], -1)  # (each reduced slice one row)
    nan = jnp.isnan(rows) if a.dtype.kind == "f" else jnp.zeros(rows.shape, bool)
    n = (~nan).sum(-1) if skip_nan else jnp.full(rows.shape[:-1], rows.shape[-1])
    at = q.reshape(q.shape + (1,) * (rows.ndim - 1))
    ordered = jnp.broadcast_to(jnp.sort(rows, axis=-1), q.shape + rows.shape)  # (nans last)

    def value(index: Any) -> Any:
        index = jnp.clip(index, 0, rows.shape[-1] - 1).astype(np.int64)
        return jnp.take_along_axis(ordered, index[..., None], axis=-1)[..., 0]
    if method in _PICKING:
        values = value(_PICKING[method](n, at))
    else:  # (numpy's _get_indexes, _get_gamma and _lerp, step by step)
        virtual = _INTERPOLATING[method](n, at)
        above, below = virtual >= n - 1, virtual < 0
        before = jnp.where(above, -1, jnp.where(below, 0, jnp.floor(virtual)))
        gamma = virtual - before
        if method == "averaged_inverted_cdf":
            gamma = jnp.where(gamma == 0, 0.5, 1.0)
        first = jnp.where(above, n - 1, before)
        low, high = value(first), value(jnp.where(above | below, first, before + 1))
        step = high - low
        values = jnp.where(gamma >= 0.5, high - step * (1 - gamma), low + step * gamma)
        values = values.astype(a.dtype)
    undefined = (n == 0) if skip_nan else nan.any(-1)
    if a.dtype.kind == "f":
        values = jnp.where(undefined, jnp.nan, values).astype(a.dtype)
    if keepdims:
        values = values.reshape(q.shape + tuple(
            1 if d in reduced else a.shape[d] for d in range(a.ndim)))
    return values


def sorting(name: str) -> Callable[..., Any]:
    """numpy's ``sort`` or ``argsort``, numpy's ``kind`` taken (jax's refuses it): every kind
    as jax's stable sort. numpy's 'stable' and 'mergesort' are stable; the order its other
    kinds give ties is unspecified and differs between CPUs (AVX-512's quicksort reorders
    them), and the stable order is one of numpy's."""
    run = axis_of_0d(name, scan=True) if name == "argsort" else getattr(jnp, name)
    return lambda a, axis=-1, kind=None: run(a, axis=axis, stable=True)


# Op name -> its function on the jax device, where it is not the table's build over jnp
SPELLED: dict[str, Callable[..., Any]] = {
    "astype": astype, "getitem": getitem, "setitem": setitem, "ufunc_at": ufunc_at,
    "floor_divide": floor_divide, "remainder": remainder, "sign": sign, "power": power,
    "bincount": bincount, "inv": inv, "solve": solve, "eig": eig, "svd": svd, "pinv": pinv,
    "lstsq": lstsq,
    "average": average, "lstsq_residuals": lstsq_residuals, "searchsorted": searchsorted,
    "repeat": repeat, "convolve": convolve,
    **{f"ufunc_{method}": ufunc_method(method) for method in ("reduce", "accumulate")},
    **{name: quantile(name) for name in QUANTILES},
    **{name: axis_of_0d(name, scan=False) for name in (
        "sum", "prod", "min", "max", "any", "all", "argmin", "argmax", "nansum", "nanprod",
        "nanmean", "nanstd", "nanvar", "nanmin", "nanmax", "ptp")},
    **{name: nan_index(name) for name in ("nanargmin", "nanargmax")},
    **{name: histogram(name) for name in ("histogram", "histogram_bin_edges")},
    **{name: axis_of_0d(name, scan=True) for name in ("cumsum", "cumprod")},
    **{name: sorting(name) for name in ("sort", "argsort")},
}
# Ops that read their data to decide (numpy's errors, a data-dependent dtype): never traced
NEEDS_DATA = frozenset({"setitem", "ufunc_at", "bincount", "inv", "solve", "eig", "nanargmin",
                        "nanargmax", "average", "histogram", "histogram_bin_edges", "svd",
                        "pinv", "lstsq", "lstsq_residuals", "searchsorted", "repeat"})


def needs_data(name: str, args: list[Any], dtype: np.dtype | None) -> bool:
    """Whether op ``name`` on ``args`` (a graph's local ids and constants) making ``dtype``
    reads its data to decide: ``NEEDS_DATA``, an index holding arrays, an integer power."""
    return (name in NEEDS_DATA or name == "getitem" and len(args) > 1
            or name == "power" and dtype is not None and dtype.kind == "i")
