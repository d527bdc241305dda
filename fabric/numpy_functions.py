"""numpy's functions on tensors (``np.where``, ``np.concatenate``, ``np.roll``, ...): NEP 18's
``__array_function__`` handlers, registered in ``fabric.tensor.ARRAY_FUNCTIONS``.

Rule: everything stays on the device. A handler is one op of the table (``session.apply``) or
a composite of tensor ops and numpy functions on tensors (``_roll``, ``_tile``, ``_triangle``,
...), never a read; where the result's shape depends on the data (``np.nonzero``,
``np.unique``), the device says it in one small round trip (``resolve_shape``). A form fabric
does not take is refused with numpy's error type and a sentence that says what to do.
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from .tensor import ARRAY_FUNCTIONS, Tensor, as_shape


def _session_of(tensors: Iterable[Any]) -> Any:
    for t in tensors:
        if isinstance(t, Tensor):
            return t.session
    raise TypeError("At least one argument must be a fabric tensor.")


def _where(condition: Any, *xy: Any) -> Any:
    if not xy:  # np.where(condition): numpy's np.nonzero(condition)
        return _nonzero(condition)
    if len(xy) != 2:
        raise ValueError("either both or neither of x and y should be given")
    return _session_of((condition, *xy)).apply("where", (condition, *xy), {})


def _nonzero(a: Any) -> tuple[Tensor, ...]:
    if not isinstance(a, Tensor):  # (a tensor among x and y only: numpy's own answer)
        return np.nonzero(a)
    return a.nonzero()


def _argwhere(a: Tensor) -> Tensor:
    found = a.session.apply("argwhere", (a,), {})
    a.session.resolve_shape(found)
    return found


def _unique(ar: Tensor, return_index: bool = False, return_inverse: bool = False,
            return_counts: bool = False, axis: Any = None, *, equal_nan: bool = True) -> Tensor:
    if return_index or return_inverse or return_counts or axis is not None or not equal_nan:
        raise TypeError("numpy.unique on fabric tensors takes its plain form only (sorted "
                        "unique values of the flattened tensor); read the tensor with "
                        ".numpy() first for indices, inverses, counts or an axis.")
    found = ar.session.apply("unique", (ar,), {})
    ar.session.resolve_shape(found)
    return found


def _reduction_function(name: str) -> Any:
    def function(a: Tensor, axis: Any = None, *, keepdims: bool = False, **extra: Any) -> Tensor:
        return a._reduce(name, axis, keepdims, **extra)
    return function


def _atleast(a: Any, ndim: int) -> Any:
    # np.atleast_1d/2d for tensors and arrays alike: ones put in front of the shape
    missing = ndim - np.ndim(a)
    return a if missing <= 0 else np.reshape(a, (1,) * missing + np.shape(a))


def _moveaxis(a: Tensor, source: Any, destination: Any) -> Tensor:
    source = normalize_axis_tuple(source, a.ndim, "source")
    destination = normalize_axis_tuple(destination, a.ndim, "destination")
    if len(source) != len(destination):
        raise ValueError("`source` and `destination` arguments must have the same number "
                         "of elements")
    order = [n for n in range(a.ndim) if n not in source]
    for axis, moved in sorted(zip(destination, source)):
        order.insert(axis, moved)
    return a.transpose(order)


def _isclose(a: Any, b: Any, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> Tensor:
    return _session_of((a, b)).apply("isclose", (a, b),
                                   {"rtol": rtol, "atol": atol, "equal_nan": equal_nan})


def _like(name: str) -> Any:
    # np.zeros_like and friends: a new tensor on the prototype's session
    def function(prototype: Tensor, *fill: Any, dtype: Any = None, shape: Any = None) -> Tensor:
        create = getattr(prototype.session, name)
        return create(prototype.shape if shape is None else shape, *fill,
                      dtype=prototype.dtype if dtype is None else dtype)
    return function


def _flip(m: Any, axis: Any = None) -> Tensor:
    axes = range(m.ndim) if axis is None else normalize_axis_tuple(axis, m.ndim)
    return m[tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(m.ndim))]


def _along(a: Tensor, axis: int, start: int | None, stop: int | None) -> Tensor:
    # a[..., start:stop] on axis ``axis`` (counted from the front)
    return a[(slice(None),) * axis + (slice(start, stop),)]


def _diff(a: Tensor, n: int = 1, axis: int = -1) -> Tensor:
    axis = normalize_axis_index(axis, a.ndim)
    subtract = np.not_equal if a.dtype == np.bool_ else np.subtract  # numpy's choice
    if operator.index(n) < 0:
        raise ValueError(f"order must be non-negative but got {n!r}")
    for _ in range(n):
        a = subtract(_along(a, axis, 1, None), _along(a, axis, None, -1))
    return a


def _roll(a: Tensor, shift: Any, axis: Any = None) -> Tensor:
    if axis is None:
        return _roll(a.ravel(), shift, 0).reshape(a.shape)
    shifts, axes = np.broadcast_arrays(shift, axis)  # numpy pairs them alike
    for step, ax in zip(shifts.ravel().tolist(), axes.ravel().tolist()):
        ax = normalize_axis_index(ax, a.ndim)
        length = a.shape[ax]
        if length:
            cut = -step % length
            a = np.concatenate([_along(a, ax, cut, None), _along(a, ax, None, cut)], axis=ax)
    return a


def _triangle(lower: bool) -> Any:
    def function(m: Tensor, k: int = 0) -> Tensor:
        if not m.shape:  # (numpy's error type; a 1-d tensor is a row of a square, as numpy's)
            raise TypeError(f"numpy.{'tril' if lower else 'triu'} needs at least 1 dimension")
        rows, cols = m.shape[-2:] if m.ndim > 1 else m.shape * 2
        session = m.session
        above = session.arange(rows)[:, None] + k - session.arange(cols)[None, :]
        keep = above >= 0 if lower else above <= 0  # (numpy: tril keeps j <= i + k)
        return np.where(keep, m, session.zeros((), m.dtype))
    return function


def _norm(x: Tensor, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Tensor:
    if ord is not None:
        raise TypeError("numpy.linalg.norm on fabric tensors takes ord=None (the 2-norm of a "
                        "vector, Frobenius of a matrix) only; read the tensor with .numpy() "
                        "first for other norms.")
    if x.dtype.kind not in "fc":
        x = x.astype(float)
    return np.sqrt((x * x).sum(axis=axis, keepdims=keepdims))


def _repeat(a: Tensor, repeats: int, axis: int | None = None) -> Tensor:
    if axis is None or not a.shape:  # (numpy repeats a 0-d array as a 1-d one)
        a, axis = a.ravel(), 0 if axis is None else axis
    axis = normalize_axis_index(axis, a.ndim)
    shape = a.shape[:axis + 1] + (operator.index(repeats),) + a.shape[axis + 1:]
    spread = np.broadcast_to(np.expand_dims(a, axis + 1), shape)
    return spread.reshape(a.shape[:axis] + (a.shape[axis] * shape[axis + 1],) + a.shape[axis + 1:])


def _tile(a: Tensor, reps: Any) -> Tensor:
    reps = as_shape(reps)
    if a.ndim < len(reps):
        a = a.reshape((1,) * (len(reps) - a.ndim) + a.shape)
    reps = (1,) * (a.ndim - len(reps)) + reps
    # each axis n becomes (1, n), broadcast to (r, n), then merged to r * n
    spread = np.broadcast_to(a.reshape(tuple(d for n in a.shape for d in (1, n))),
                             tuple(d for r, n in zip(reps, a.shape) for d in (r, n)))
    return spread.reshape(tuple(r * n for r, n in zip(reps, a.shape)))


def _einsum(subscripts: str, *operands: Any, optimize: Any = False) -> Tensor:
    if not isinstance(subscripts, str):
        raise TypeError("numpy.einsum on fabric tensors takes its subscripts as a string "
                        "('ij,jk->ik'), not as lists of axes.")
    params = {"subscripts": subscripts, **({"optimize": optimize} if optimize else {})}
    return _session_of(operands).apply("einsum", operands, params)


def _join_function(name: str) -> Any:
    def function(arrays: Sequence[Any], axis: int = 0) -> Tensor:
        return _session_of(arrays).apply(name, tuple(arrays), {"axis": axis})
    return function


ARRAY_FUNCTIONS.update({
    **{getattr(np, name): _reduction_function(name)
       for name in ["sum", "prod", "mean", "std", "var", "min", "max", "any", "all",
                    "argmin", "argmax"]},
    np.amin: _reduction_function("min"),
    np.amax: _reduction_function("max"),
    np.where: _where,
    np.clip: lambda a, a_min=None, a_max=None, **bounds: a.clip(a_min, a_max, **bounds),
    np.dot: lambda a, b: _session_of((a, b)).apply("dot", (a, b), {}),
    np.reshape: lambda a, shape: a.reshape(shape),
    np.transpose: lambda a, axes=None: a.transpose(*(axes or ())),
    np.swapaxes: lambda a, axis1, axis2: a.swapaxes(axis1, axis2),
    np.squeeze: lambda a, axis=None: a.squeeze(axis),
    np.expand_dims: lambda a, axis: a.view_op("expand_dims", axis=axis),
    np.concatenate: _join_function("concatenate"),
    np.stack: _join_function("stack"),
    np.copy: lambda a: a.copy(),
    np.ravel: lambda a: a.ravel(),
    np.moveaxis: _moveaxis,
    np.hstack: lambda arrays: np.concatenate([_atleast(a, 1) for a in arrays],
                                             axis=0 if np.ndim(arrays[0]) <= 1 else 1),
    np.vstack: lambda arrays: np.concatenate([_atleast(a, 2) for a in arrays]),
    np.outer: lambda a, b: np.multiply(np.ravel(a)[:, None], np.ravel(b)[None, :]),
    np.round: lambda a, decimals=0: a.round(decimals),
    np.around: lambda a, decimals=0: a.round(decimals),
    np.isclose: _isclose,
    np.allclose: lambda a, b, rtol=1e-05, atol=1e-08, equal_nan=False:
        bool(_isclose(a, b, rtol, atol, equal_nan).all()),
    np.nan_to_num: lambda x, copy=True, nan=0.0, posinf=None, neginf=None:
        x.session.apply("nan_to_num", (x,), {"nan": nan, "posinf": posinf, "neginf": neginf}),
    np.cumsum: lambda a, axis=None, dtype=None: a.cumsum(axis, dtype),
    np.cumprod: lambda a, axis=None, dtype=None: a.cumprod(axis, dtype),
    np.sort: lambda a, axis=-1, kind=None: a.session.apply("sort", (a,),
                                                          {"axis": axis, "kind": kind}),
    np.argsort: lambda a, axis=-1, kind=None: a.argsort(axis, kind),
    np.zeros_like: _like("zeros"),
    np.ones_like: _like("ones"),
    np.empty_like: _like("empty"),
    np.full_like: _like("full"),
    np.broadcast_to: lambda array, shape: array.view_op("broadcast_to", "read-only",
                                                        shape=as_shape(shape)),
    np.nonzero: _nonzero,
    np.argwhere: _argwhere,
    np.unique: _unique,
    np.flip: _flip,
    np.diff: _diff,
    np.roll: _roll,
    np.tril: _triangle(lower=True),
    np.triu: _triangle(lower=False),
    np.linalg.norm: _norm,
    np.repeat: _repeat,
    np.tile: _tile,
    np.einsum: _einsum,
    np.shape: lambda a: a.shape,
    np.ndim: lambda a: a.ndim,
    np.size: lambda a: a.size,
})
