"""numpy's functions on tensors (``np.where``, ``np.concatenate``, ``np.roll``, ...): NEP 18's
``__array_function__`` handlers, registered in ``fabric.arrays.tensor.ARRAY_FUNCTIONS``.

Rule: everything stays on the device. A handler is one op of the table (``session.apply``) or
a composite of tensor ops and numpy functions on tensors (``_roll``, ``_tile``, ``_triangle``,
...), never a read (but ``np.copyto`` into a numpy array, which asks for one, as
``np.asarray(t)`` does); where the result's shape depends on the data (``np.nonzero``,
``np.unique``, ``np.bincount``), the device says it in one small round trip
(``resolve_shape``). A form fabric does not take is refused with numpy's error type and a
sentence that says what to do. (Linear algebra and ``np.cov``: ``fabric.arrays.numpy_linalg``;
statistics, ``np.histogram`` and the like: ``fabric.arrays.numpy_statistics``; ``np.fft``:
``fabric.arrays.numpy_fft``.)
"""

from __future__ import annotations

import operator
from typing import Any, Iterable, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from fabric.arrays import read_target
from fabric.arrays.indexing import as_shape
from fabric.arrays.tensor import ARRAY_FUNCTIONS, UFUNC_METHODS, Tensor, given_params
from fabric.arrays.views import check_writable, link, root, store_into
from fabric.core.ops import QUANTILES, REDUCTIONS


def session_of(tensors: Iterable[Any]) -> Any:
    """The session of the first tensor among ``tensors`` (TypeError where none is one)."""
    for t in tensors:
        if isinstance(t, Tensor):
            return t.session
    raise TypeError("At least one argument must be a fabric tensor.")


def _where(condition: Any, *xy: Any) -> Any:
    if not xy:  # np.where(condition): numpy's np.nonzero(condition)
        return _nonzero(condition)
    if len(xy) != 2:
        raise ValueError("either both or neither of x and y should be given")
    return session_of((condition, *xy)).apply("where", (condition, *xy), {})


def _nonzero(a: Any) -> tuple[Tensor, ...]:
    if not isinstance(a, Tensor):  # (a tensor among x and y only: numpy's own answer)
        return np.nonzero(a)
    return a.nonzero()


def _argwhere(a: Tensor) -> Tensor:
    found = a.session.apply("argwhere", (a,), {})
    a.session.resolve_shape(found)
    return found


def _unique(ar: Tensor, return_index: bool = False, return_inverse: bool = False,
            return_counts: bool = False, axis: Any = None, *,
            equal_nan: bool = True) -> Tensor | tuple[Tensor, ...]:
    # numpy's own np.unique on the device; each result its own op, whose shape the device
    # says (one small round trip each)
    flags = {"return_index": return_index, "return_inverse": return_inverse,
             "return_counts": return_counts}
    params: dict[str, Any] = {"axis": axis, "equal_nan": equal_nan}
    parts = [None] if not any(flags.values()) else range(1 + sum(flags.values()))
    found = []
    for part in parts:
        result = ar.session.apply("unique", (ar,), params if part is None else {
            **params, **flags, "part": part})
        ar.session.resolve_shape(result)
        found.append(result)
    return found[0] if parts == [None] else tuple(found)


def _reduction_function(name: str) -> Any:
    def function(a: Tensor, axis: Any = None, *, keepdims: bool = False, **extra: Any) -> Tensor:
        return a._reduce(name, axis, keepdims, **extra)
    return function


def _atleast(a: Any, ndim: int) -> Any:
    # np.atleast_1d/2d/3d for tensors and arrays alike: new axes of length one, as numpy
    # puts them (a view, as numpy's)
    if not isinstance(a, Tensor):
        return getattr(np, f"atleast_{ndim}d")(a)
    if ndim == 3:
        index = {0: (None, None, None), 1: (None, slice(None), None), 2: (..., None)}.get(a.ndim)
    else:
        index = (None,) * (ndim - a.ndim) if a.ndim < ndim else None
    return a if index is None else a[index]


def _atleast_function(ndim: int) -> Any:
    def function(*arys: Any) -> Any:
        results = tuple(_atleast(a, ndim) for a in arys)
        return results[0] if len(results) == 1 else results
    return function


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
    return session_of((a, b)).apply("isclose", (a, b),
                                   {"rtol": rtol, "atol": atol, "equal_nan": equal_nan})


def _sort_kind(kind: str | None, stable: bool | None) -> str | None:
    """numpy's sort ``kind`` from its ``kind`` or its ``stable`` (numpy 2's), as numpy
    reads them: both given is numpy's ValueError."""
    if stable is None:
        return kind
    if kind is not None:
        raise ValueError("`kind` and keyword parameters can't be provided at the same time. "
                         "Use only one of them.")
    return "stable" if stable else None


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
    n = operator.index(n)  # (a 0-d tensor read once, as numpy reads it)
    if n < 0:
        raise ValueError(f"order must be non-negative but got {n!r}")
    for _ in range(n):
        a = subtract(_along(a, axis, 1, None), _along(a, axis, None, -1))
    return a


def _roll(a: Tensor, shift: Any, axis: Any = None) -> Tensor:
    # One op on the device (numpy's own roll). An int shift along one axis (or none), the
    # commonest form, is checked as numpy checks it; any other form's errors come at the
    # call from numpy's roll of a one-element stand-in.
    if type(shift) is int and (axis is None or type(axis) is int):
        axis = axis if axis is None else normalize_axis_index(axis, a.ndim)
    else:
        np.roll(np.empty((1,) * a.ndim), shift, axis)
        shift, axis = np.asarray(shift).tolist(), axis if axis is None else \
            np.asarray(axis).tolist()
    return a.session.apply("roll", (a,), {"shift": shift, "axis": axis})


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
    return session_of(operands).apply("einsum", operands, params)


def no_out(name: str, out: Any) -> None:
    """Refuse numpy function ``name``'s out= (a TypeError that says what to do)."""
    if out is not None:
        raise TypeError(f"numpy.{name} with out= is not supported on fabric tensors: the "
                        "result is a new tensor on the device; assign it where you need it "
                        "(t[...] = result).")


def _copyto(dst: Any, src: Any, casting: str = "same_kind", where: Any = True) -> None:
    """numpy's copyto with a tensor on either side: into a numpy array, ``src``'s values read
    there (``Tensor.numpy(out=)``: straight in where they can be); into a tensor, an update
    in place of it (``dst[...] = src``, copy on write, as every update), on its device.
    ``casting`` and ``where`` as numpy takes them, and ``src`` broadcast to ``dst``."""
    if not isinstance(dst, Tensor):  # (src or where is a tensor: numpy asked here)
        if not isinstance(dst, np.ndarray):
            raise TypeError(f"copyto() argument 1 must be a numpy array or a fabric tensor, "
                            f"not {type(dst).__name__}.")
        if isinstance(src, Tensor):
            read_target.check_cast(src.dtype, dst.dtype, casting)
            if where is True and src.shape == dst.shape and read_target.direct(src, dst):
                src.numpy(out=dst)  # (which refuses a read-only dst, as numpy does)
                return
            src = src.numpy()
        np.copyto(dst, src, casting=casting,
                  where=where.numpy() if isinstance(where, Tensor) else where)
        return
    check_writable(dst)
    values = src if isinstance(src, Tensor) else dst.session.asarray(src)
    read_target.check_cast(values.dtype, dst.dtype, casting)
    if where is not True:
        values = _where(where, values, dst)
    store_into(dst, values)


def _median_function(name: str) -> Any:
    # np.median and np.nanmedian
    def function(a: Tensor, axis: Any = None, out: Any = None, overwrite_input: bool = False,
                 keepdims: bool = False) -> Tensor:
        no_out(name, out)
        return a._reduce(name, axis, keepdims)
    return function


def _quantile_function(name: str) -> Any:
    # np.percentile, np.quantile and their nan-ignoring forms: q travels as numbers, a param
    # of the op
    def function(a: Tensor, q: Any, axis: Any = None, out: Any = None,
                 overwrite_input: bool = False, method: str = "linear", keepdims: bool = False,
                 *, weights: Any = None) -> Tensor:
        no_out(name, out)
        if weights is not None or not isinstance(a, Tensor) or isinstance(q, Tensor):
            raise TypeError(f"numpy.{name} on fabric tensors takes the array as a tensor and q "
                            "as numbers, without weights; read the tensors with .numpy() "
                            "first otherwise.")
        axis = tuple(axis) if isinstance(axis, list) else axis
        return a.session.apply(name, (a,), {"q": np.asarray(q).tolist(), "axis": axis,
                                            "method": method, "keepdims": keepdims})
    return function


def _pad(array: Tensor, pad_width: Any, mode: Any = "constant", **kwargs: Any) -> Tensor:
    if isinstance(pad_width, Tensor) or not isinstance(mode, str) \
            or any(isinstance(value, Tensor) for value in kwargs.values()):
        raise TypeError("numpy.pad on fabric tensors takes its widths and values as numbers "
                        "and its mode as a name; read the tensor with .numpy() first for a "
                        "mode that is a function.")
    widths = np.asarray(pad_width)
    if widths.dtype.kind not in "iu":
        raise TypeError("`pad_width` must be of integral type.")
    params = {key: np.asarray(value).tolist() for key, value in kwargs.items()}
    return array.session.apply("pad", (array,), {"pad_width": widths.tolist(), "mode": mode,
                                                 **params})


def _bincount(x: Any, weights: Any = None, minlength: int = 0) -> Tensor:
    session = session_of((x, weights))
    counts = session.apply("bincount", (x,) if weights is None else (x, weights),
                           {"minlength": operator.index(minlength)})
    session.resolve_shape(counts)
    return counts


def _meshgrid(*xi: Any, copy: bool = True, sparse: bool = False, indexing: str = "xy") -> Any:
    if indexing not in ("xy", "ij"):
        raise ValueError("Valid values for `indexing` are 'xy' and 'ij'.")
    session, ndim = session_of(xi), len(xi)
    shapes = [(1,) * i + (-1,) + (1,) * (ndim - i - 1) for i in range(ndim)]
    if indexing == "xy" and ndim > 1:  # (the first two axes swapped, as numpy's)
        shapes[0], shapes[1] = shapes[1], shapes[0]
    output: Any = [session.asarray(x).reshape(shape) for x, shape in zip(xi, shapes)]
    if not sparse:
        shape = np.broadcast_shapes(*[grid.shape for grid in output])
        output = tuple(np.broadcast_to(grid, shape) for grid in output)
    return tuple(grid.copy() for grid in output) if copy else output


def _take(a: Tensor, indices: Any, axis: Any = None, out: Any = None,
          mode: str = "raise") -> Tensor:
    no_out("take", out)
    if axis is None or not a.shape:  # (numpy takes from a 0-d array as from a 1-d one)
        a, axis = a.ravel(), 0 if axis is None else axis
    axis = normalize_axis_index(axis, a.ndim)
    size = indices.size if isinstance(indices, Tensor) else np.size(indices)
    if a.shape[axis] == 0 and size:  # (numpy's check, before any mode's)
        raise IndexError("cannot do a non-empty take from an empty axes.")
    if mode != "raise":
        length = a.shape[axis]
        indices = np.mod(indices, length) if mode == "wrap" else np.clip(indices, 0, length - 1)
    taken = a[(slice(None),) * axis + (indices,)]
    return taken.copy() if getattr(taken, "_view_of", None) is not None else taken  # (numpy's
    # take is never a view)


def _diag(v: Tensor, k: int = 0) -> Tensor:
    # (the diagonal's indices made on the device: nothing is uploaded, so a traced function
    # takes it too)
    k = operator.index(k)
    if v.ndim == 1:
        rows = v.session.arange(max(-k, 0), v.shape[0] + max(-k, 0))
        square = v.session.zeros((v.shape[0] + abs(k),) * 2, v.dtype)
        return square._indexed("setitem", (v,), (rows, rows + k))[0]  # (a new tensor)
    if v.ndim != 2:
        raise ValueError("Input must be 1- or 2-d.")
    length = max(0, min(v.shape[0] - max(-k, 0), v.shape[1] - max(k, 0)))
    rows = v.session.arange(max(-k, 0), length + max(-k, 0))
    diagonal, _, arrays, wire = v._indexed("getitem", (), (rows, rows + k))
    # numpy's is a read-only view: a write into the matrix shows in it
    return link(v, diagonal, "getitem", tuple(arrays), wire, "read-only")


def _array_split(ary: Tensor, indices_or_sections: Any, axis: int = 0) -> list[Tensor]:
    axis = normalize_axis_index(axis, ary.ndim)
    length = ary.shape[axis]
    try:
        sections = operator.index(indices_or_sections)
    except TypeError:
        bounds = [0, *indices_or_sections, length]
    else:
        if sections <= 0:
            raise ValueError("number sections must be larger than 0.") from None
        each, extra = divmod(length, sections)
        bounds = np.cumsum([0] + [each + 1] * extra + [each] * (sections - extra)).tolist()
    return [_along(ary, axis, start, stop) for start, stop in zip(bounds, bounds[1:])]


def _split(ary: Tensor, indices_or_sections: Any, axis: int = 0) -> list[Tensor]:
    if np.ndim(indices_or_sections) == 0 and \
            ary.shape[normalize_axis_index(axis, ary.ndim)] % indices_or_sections:
        raise ValueError("array split does not result in an equal division")
    return _array_split(ary, indices_or_sections, axis)


def _append(arr: Any, values: Any, axis: Any = None) -> Tensor:
    if axis is None:
        return np.concatenate([np.ravel(arr), np.ravel(values)])
    return np.concatenate([arr, values], axis=axis)


def _flip_first(m: Tensor, axes: int) -> Tensor:
    # np.flipud (axes 1), np.fliplr (axes 2): numpy's views
    if m.ndim < axes:
        raise ValueError(f"Input must be >= {axes}-d.")
    return m[(slice(None),) * (axes - 1) + (slice(None, None, -1),)]


def _may_share_memory(a: Any, b: Any, max_work: Any = None) -> bool:
    # True for a view and its base, or two views of one tensor; False for tensors of other
    # handles (whose device arrays never share memory) and for numpy arrays
    return isinstance(a, Tensor) and isinstance(b, Tensor) and root(a) is root(b)


def ufunc_method_params(ufunc: np.ufunc, axis: Any = 0, dtype: Any = None,
                        keepdims: bool = False, initial: Any = None) -> dict[str, Any]:
    """The params of op ``ufunc_reduce`` or ``ufunc_accumulate`` from numpy's keywords."""
    return {"ufunc": ufunc.__name__, "axis": tuple(axis) if isinstance(axis, list) else axis,
            **given_params({"dtype": dtype, "initial": initial}),
            **({"keepdims": True} if keepdims else {})}


def _ufunc_method(method: str) -> Any:
    # np.add.reduce(t, axis=...), np.multiply.accumulate(t, axis=...): one op on the device,
    # numpy's keywords as numpy passes them (where=, a mask, a second input)
    def handler(ufunc: np.ufunc, array: Tensor, where: Any = True, **keywords: Any) -> Tensor:
        return array.session.apply(f"ufunc_{method}", (array,) if where is True else (
            array, where), ufunc_method_params(ufunc, **keywords))
    return handler


def _join_function(name: str) -> Any:
    def function(arrays: Sequence[Any], axis: int = 0) -> Tensor:
        return session_of(arrays).apply(name, tuple(arrays), {"axis": axis})
    return function


ARRAY_FUNCTIONS.update({
    **{getattr(np, name): _reduction_function(name) for name in REDUCTIONS},
    **{getattr(np, name): _median_function(name) for name in ("median", "nanmedian")},
    **{getattr(np, name): _quantile_function(name) for name in QUANTILES},
    np.amin: _reduction_function("min"),
    np.amax: _reduction_function("max"),
    np.where: _where,
    np.clip: lambda a, a_min=None, a_max=None, **bounds: a.clip(a_min, a_max, **bounds),
    np.dot: lambda a, b: session_of((a, b)).apply("dot", (a, b), {}),
    np.reshape: lambda a, shape: a.reshape(shape),
    np.transpose: lambda a, axes=None: a.transpose(*(axes or ())),
    np.swapaxes: lambda a, axis1, axis2: a.swapaxes(axis1, axis2),
    np.squeeze: lambda a, axis=None: a.squeeze(axis),
    np.expand_dims: lambda a, axis: a.view_op("expand_dims", axis=axis),
    np.concatenate: _join_function("concatenate"),
    np.stack: _join_function("stack"),
    np.copy: lambda a: a.copy(),
    np.copyto: _copyto,
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
    np.sort: lambda a, axis=-1, kind=None, *, stable=None: a.session.apply(
        "sort", (a,), {"axis": axis, "kind": _sort_kind(kind, stable)}),
    np.argsort: lambda a, axis=-1, kind=None, *, stable=None: a.argsort(
        axis, _sort_kind(kind, stable)),
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
    np.repeat: _repeat,
    np.tile: _tile,
    np.einsum: _einsum,
    np.pad: _pad,
    np.bincount: _bincount,
    np.meshgrid: _meshgrid,
    np.take: _take,
    np.diag: _diag,
    np.split: _split,
    np.array_split: _array_split,
    np.append: _append,
    np.flipud: lambda m: _flip_first(m, 1),
    np.fliplr: lambda m: _flip_first(m, 2),
    np.atleast_1d: _atleast_function(1),
    np.atleast_2d: _atleast_function(2),
    np.atleast_3d: _atleast_function(3),
    np.may_share_memory: _may_share_memory,
    np.shares_memory: _may_share_memory,
    np.shape: lambda a: a.shape,
    np.ndim: lambda a: a.ndim,
    np.size: lambda a: a.size,
})
UFUNC_METHODS.update({method: _ufunc_method(method) for method in ("reduce", "accumulate")})
