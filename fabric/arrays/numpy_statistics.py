"""numpy's statistics and signal functions on tensors (``np.average``, ``np.corrcoef``,
``np.histogram``, ``np.searchsorted``, ``np.lexsort``, ``np.interp``, ``np.convolve``,
``np.array_equal``): NEP 18 handlers, registered in ``fabric.arrays.tensor.ARRAY_FUNCTIONS``
as ``fabric.arrays.numpy_functions``'s are (the nan-ignoring reductions and quantiles, and
``np.ptp``, are there, with the others).

Rule: each is one op of the table on the device (``fabric.core.ops_statistics``: numpy's own
function, its errors at the call where numpy raises them before computing), or a composite of
tensor ops (``corrcoef``). Nothing is read, but where numpy answers with a Python bool
(``array_equal``, as ``allclose``): one small read of the answer.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from fabric.arrays.numpy_functions import session_of
from fabric.arrays.tensor import ARRAY_FUNCTIONS, Tensor


def placed_weights(weights: Any, axis: Any, ndim: int) -> Any:
    """numpy's ``average``'s weights of the axes averaged (in their order) placed along them,
    a length of one along the others (a view: of a tensor, a sharded one or an array)."""
    axes = normalize_axis_tuple(axis, ndim)
    order = tuple(np.argsort(axes).tolist())
    return np.transpose(weights, order)[tuple(slice(None) if d in axes else None
                                              for d in range(ndim))]


def _average(a: Any, axis: Any = None, weights: Any = None, returned: bool = False, *,
             keepdims: bool = False) -> Any:
    session = session_of((a, weights))
    a = session.asarray(a)
    axis = tuple(axis) if isinstance(axis, list) else axis
    params = {"axis": axis, "keepdims": bool(keepdims)}
    average = session.apply("average", (a,) if weights is None else (a, weights), params)
    if not returned:
        return average
    if weights is None:  # (numpy's: the count of elements averaged, in the average's dtype)
        scale = session.full(average.shape, a.size / average.size, average.dtype)
    else:  # (numpy's: the weights' sum, spread along the axes averaged)
        weights = session.asarray(weights)
        if weights.shape != a.shape:
            weights = placed_weights(weights, axis, a.ndim)
        scale = weights.sum(axis=axis, dtype=average.dtype, keepdims=keepdims)
        if scale.shape != average.shape:
            scale = np.broadcast_to(scale, average.shape).copy()
    return average, scale


def _corrcoef(x: Any, y: Any = None, rowvar: bool = True, *, dtype: Any = None) -> Tensor:
    # numpy's formula: the covariances over the product of the standard deviations,
    # clipped to [-1, 1] (each part of a complex one)
    c = np.cov(x, y, rowvar, dtype=dtype)
    if c.ndim == 0:  # (one variable: numpy's c / c)
        return c / c
    session = c.session
    deviations = np.sqrt(np.diag(c) if c.dtype.kind != "c"
                         else session.apply("real", (np.diag(c),), {}))
    c = c / deviations[:, None] / deviations[None, :]
    if c.dtype.kind != "c":
        return np.clip(c, -1, 1)
    real, imag = (np.clip(session.apply(part, (c,), {}), -1, 1) for part in ("real", "imag"))
    return real + imag * 1j


def _bins(bins: Any, name: str) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """A histogram's bins as its ops take them: a count as a param, or edges as an input."""
    if isinstance(bins, str):
        raise TypeError(f"numpy.{name} on fabric tensors takes bins as a count or as edges: "
                        f"a rule's name ({bins!r}) picks the count from the values. Give a "
                        "count (bins=20), or edges (a list, an array or a tensor).")
    if isinstance(bins, (Tensor, list, tuple, np.ndarray)):
        return {}, (bins,)
    return {"bins": operator.index(bins)}, ()


def _histogram_params(range: Any, weights: Any) -> dict[str, Any]:
    return {"range": None if range is None else np.asarray(range).tolist(),
            "weighted": weights is not None}


def _histogram(a: Any, bins: Any = 10, range: Any = None, density: Any = None,
               weights: Any = None) -> tuple[Tensor, Tensor]:
    session = session_of((a, bins, weights))
    count, edges = _bins(bins, "histogram")
    edges = tuple(session.asarray(e) for e in edges)  # (numpy gives these edges back)
    extra = () if weights is None else (weights,)
    params = _histogram_params(range, weights)
    counts = session.apply("histogram", (a, *edges, *extra), {**count, **params,
                                                              "density": density})
    return counts, edges[0] if edges else session.apply("histogram_bin_edges",
                                                        (a, *extra), {**count, **params})


def _histogram_bin_edges(a: Any, bins: Any = 10, range: Any = None,
                         weights: Any = None) -> Tensor:
    count, edges = _bins(bins, "histogram_bin_edges")
    return session_of((a, bins, weights)).apply(
        "histogram_bin_edges", (a, *edges, *(() if weights is None else (weights,))),
        {**count, **_histogram_params(range, weights)})


def _searchsorted(a: Any, v: Any, side: str = "left", sorter: Any = None) -> Tensor:
    return session_of((a, v, sorter)).apply(
        "searchsorted", (a, v) if sorter is None else (a, v, sorter), {"side": side})


def _lexsort(keys: Any, axis: int = -1) -> Tensor:
    # keys: a sequence of keys, or an array whose rows are the keys (the last the primary)
    keys = tuple(keys) if not isinstance(keys, Tensor) else tuple(
        keys[i] for i in range(len(keys)))
    return session_of(keys).apply("lexsort", keys, {"axis": operator.index(axis)})


def _interp(x: Any, xp: Any, fp: Any, left: Any = None, right: Any = None,
            period: Any = None) -> Tensor:
    given = {"left": left, "right": right, "period": period}
    return session_of((x, xp, fp)).apply("interp", (x, xp, fp), {
        key: value for key, value in given.items() if value is not None})


def array_equal(a1: Any, a2: Any, equal_nan: bool = False) -> bool:
    """numpy's ``array_equal``: True where the shapes and every element agree (with
    ``equal_nan``, nan at the same places counts as equal), compared on the device and the
    answer read, a Python bool as numpy's."""
    if np.shape(a1) != np.shape(a2):
        return False
    same = np.equal(a1, a2)
    if equal_nan:
        same = same | np.isnan(a1) & np.isnan(a2)
    return bool(same.all())


ARRAY_FUNCTIONS.update({
    np.average: _average,
    np.corrcoef: _corrcoef,
    np.histogram: _histogram,
    np.histogram_bin_edges: _histogram_bin_edges,
    np.searchsorted: _searchsorted,
    np.lexsort: _lexsort,
    np.interp: _interp,
    np.convolve: lambda a, v, mode="full": session_of((a, v)).apply("convolve", (a, v),
                                                                     {"mode": mode}),
    np.array_equal: array_equal,
})

