"""The standard's functions of tensors that are not elementwise: statistics, manipulation,
searching, sorting, sets, indexing, ``astype``, and the main namespace's linear algebra
(``matmul``, ``matrix_transpose``, ``tensordot``, ``vecdot``).

Rule: each function is an op of the table or a composite of the ops numpy's protocols already
reach on tensors (``fabric.arrays.numpy_functions``), under the standard's name and keywords;
where numpy's answer differs from the standard's (``sort`` descending, ``unique_*``'s NaNs,
``cumulative_sum``'s ``include_initial``, ``astype`` of complex to real), the standard's is
built here. Nothing is read but what the device must say: the length of a result whose shape
depends on the data (``nonzero``, ``unique_*``), one small round trip each.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from fabric.array_api.dtypes import dtype_of, operand, operands, result_type, session_of
from fabric.array_api.elementwise import tensor_argument
from fabric.arrays.numpy_linalg import contract
from fabric.arrays.tensor import Tensor

Axis = int | tuple[int, ...] | None


# -- data types ------------------------------------------------------------------------------

def astype(x: Tensor, dtype: Any, /, *, copy: builtins.bool = True,
           device: Any = None) -> Tensor:
    """``x`` cast to ``dtype`` (a new tensor, unless ``copy=False`` and nothing changes);
    ``device``: moved there too (``Tensor.to_device``). Casting complex to real is refused,
    as the standard says: take ``real``, ``imag`` or ``abs`` first."""
    x, dtype = tensor_argument(x, "astype"), dtype_of(dtype)
    if x.dtype.kind == "c" and dtype.kind != "c":
        raise TypeError(f"astype does not cast {x.dtype} to {dtype}: take xp.real(x), "
                        "xp.imag(x) or xp.abs(x) first.")
    if dtype != x.dtype:
        x = x.astype(dtype)
    elif copy:
        x = x.copy()
    return x if device is None else x.to_device(device)


# -- statistics and utility ------------------------------------------------------------------

def _reduction(name: str, doc: str) -> Callable[..., Tensor]:
    def function(x: Tensor, /, *, axis: Axis = None, keepdims: builtins.bool = False) -> Tensor:
        return tensor_argument(x, name)._reduce(name, axis, keepdims)
    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc
    return function


def _with_dtype(name: str, doc: str) -> Callable[..., Tensor]:
    def function(x: Tensor, /, *, axis: Axis = None, dtype: Any = None,
                 keepdims: builtins.bool = False) -> Tensor:
        x = tensor_argument(x, name)
        return x._reduce(name, axis, keepdims, dtype=None if dtype is None else dtype_of(dtype))
    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc
    return function


def _spread(name: str, doc: str) -> Callable[..., Tensor]:
    def function(x: Tensor, /, *, axis: Axis = None, correction: float = 0.0,
                 keepdims: builtins.bool = False) -> Tensor:
        return tensor_argument(x, name)._reduce(name, axis, keepdims, ddof=correction)
    function.__name__ = function.__qualname__ = name
    function.__doc__ = doc
    return function


def _scan(name: str, numpy_name: str, initial: str) -> Callable[..., Tensor]:
    def function(x: Tensor, /, *, axis: int | None = None, dtype: Any = None,
                 include_initial: builtins.bool = False) -> Tensor:
        x = tensor_argument(x, name)
        if axis is None:
            if x.ndim > 1:
                raise ValueError(f"{name} of a {x.ndim}-d tensor needs axis=.")
            axis = 0
        axis = normalize_axis_index(axis, max(x.ndim, 1))
        result = getattr(x, numpy_name)(axis, None if dtype is None else dtype_of(dtype))
        if include_initial:
            shape = tuple(1 if n == axis else size for n, size in enumerate(result.shape))
            first = getattr(x.session, initial)(shape, result.dtype)
            result = x.session.apply("concatenate", (first, result), {"axis": axis})
        return result
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"numpy's ``{numpy_name}`` along ``axis`` (needed beyond 1-d), "
                        f"``include_initial``: starting with the {initial[:-1]} before the "
                        "first element.")
    return function


def diff(x: Tensor, /, *, axis: int = -1, n: int = 1, prepend: Tensor | None = None,
         append: Tensor | None = None) -> Tensor:
    """The ``n``-th differences along ``axis``, ``prepend`` and ``append`` joined first."""
    x = tensor_argument(x, "diff")
    if prepend is not None or append is not None:
        parts = [part for part in (prepend, x, append) if part is not None]
        x = concat(parts, axis=axis)
    return np.diff(x, n=n, axis=axis)


def count_nonzero(x: Tensor, /, *, axis: Axis = None,
                  keepdims: builtins.bool = False) -> Tensor:
    """How many elements are not zero (not False) along ``axis``: an int64 tensor."""
    x = tensor_argument(x, "count_nonzero")
    found = x if x.dtype == np.bool_ else x != 0
    return found._reduce("sum", axis, keepdims, dtype=np.int64)


# -- manipulation ------------------------------------------------------------------------------

def _tensors(arrays: Sequence[Tensor], name: str) -> tuple[Tensor, ...]:
    if not isinstance(arrays, (list, tuple)) or not all(isinstance(a, Tensor) for a in arrays):
        raise TypeError(f"{name} takes a list or tuple of fabric tensors.")
    return tuple(arrays)


def concat(arrays: Sequence[Tensor], /, *, axis: int | None = 0) -> Tensor:
    """The tensors joined along ``axis`` (flattened first with None), dtypes promoted."""
    arrays = _tensors(arrays, "concat")
    return session_of(arrays).apply("concatenate", arrays, {"axis": axis})


def stack(arrays: Sequence[Tensor], /, *, axis: int = 0) -> Tensor:
    """The tensors, of one shape, joined along a new axis."""
    arrays = _tensors(arrays, "stack")
    return session_of(arrays).apply("stack", arrays, {"axis": axis})


def unstack(x: Tensor, /, *, axis: int = 0) -> tuple[Tensor, ...]:
    """The tensor's slices along ``axis``, each a view."""
    x = tensor_argument(x, "unstack")
    axis = normalize_axis_index(axis, x.ndim)
    return tuple(x[(slice(None),) * axis + (i,)] for i in range(x.shape[axis]))


def broadcast_to(x: Tensor, /, shape: tuple[int, ...]) -> Tensor:
    """``x`` broadcast to ``shape``: a read-only view."""
    return np.broadcast_to(tensor_argument(x, "broadcast_to"), tuple(shape))


def broadcast_arrays(*arrays: Tensor) -> tuple[Tensor, ...]:
    """The tensors broadcast against each other: read-only views (a tuple, as 2025.12 says;
    2024.12 said a list)."""
    arrays = _tensors(arrays, "broadcast_arrays")
    shape = np.broadcast_shapes(*[a.shape for a in arrays])
    return tuple(a if a.shape == shape else broadcast_to(a, shape) for a in arrays)


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape that arrays of ``shapes`` broadcast to (2025.12), on the client."""
    return np.broadcast_shapes(*shapes)


def expand_dims(x: Tensor, /, axis: int) -> Tensor:
    """``x`` with a new axis of length one at ``axis``: a view."""
    return tensor_argument(x, "expand_dims").view_op("expand_dims", axis=axis)


def squeeze(x: Tensor, /, axis: int | tuple[int, ...]) -> Tensor:
    """``x`` without the axes of length one named by ``axis``: a view."""
    return tensor_argument(x, "squeeze").squeeze(axis)


def permute_dims(x: Tensor, /, axes: tuple[int, ...]) -> Tensor:
    """``x`` with its axes in the order ``axes``: a view."""
    return tensor_argument(x, "permute_dims").transpose(tuple(axes))


def moveaxis(x: Tensor, source: int | tuple[int, ...], destination: int | tuple[int, ...],
             /) -> Tensor:
    """``x`` with axes ``source`` moved to ``destination``: a view."""
    return np.moveaxis(tensor_argument(x, "moveaxis"), source, destination)


def reshape(x: Tensor, /, shape: tuple[int, ...], *,
            copy: builtins.bool | None = None) -> Tensor:
    """``x`` in a new ``shape`` (one size may be -1); ``copy=True``: a new tensor."""
    reshaped = tensor_argument(x, "reshape").reshape(tuple(shape))
    return reshaped.copy() if copy else reshaped


def flip(x: Tensor, /, *, axis: Axis = None) -> Tensor:
    """``x`` reversed along ``axis`` (every axis with None): a view."""
    return np.flip(tensor_argument(x, "flip"), axis)


def roll(x: Tensor, /, shift: int | tuple[int, ...], *, axis: Axis = None) -> Tensor:
    """``x``'s elements shifted by ``shift`` along ``axis`` (flattened with None), wrapping."""
    return np.roll(tensor_argument(x, "roll"), shift, axis)


def repeat(x: Tensor, repeats: int | Tensor, /, *, axis: int | None = None) -> Tensor:
    """Each element ``repeats`` times along ``axis`` (flattened first with None): one count
    for all, or a tensor of counts, one per element along the axis (the result's length
    then learned from the device, one small round trip)."""
    x = tensor_argument(x, "repeat")
    if not isinstance(repeats, Tensor):
        return np.repeat(x, operator.index(repeats), axis)
    if repeats.dtype.kind not in "iu" or repeats.ndim > 1:
        raise TypeError(f"repeat takes a 0-d or 1-d integer tensor of counts, not a "
                        f"{repeats.ndim}-d {repeats.dtype} one.")
    repeated = x.session.apply("repeat", (x, repeats), {"axis": axis})
    x.session.resolve_shape(repeated)
    return repeated


def tile(x: Tensor, repetitions: tuple[int, ...], /) -> Tensor:
    """``x`` repeated ``repetitions`` times along each axis."""
    return np.tile(tensor_argument(x, "tile"), tuple(repetitions))


# -- searching, sorting, sets, indexing --------------------------------------------------------

def argmax(x: Tensor, /, *, axis: int | None = None, keepdims: builtins.bool = False) -> Tensor:
    """The index of the first maximum along ``axis`` (of the flattened tensor with None)."""
    return tensor_argument(x, "argmax").argmax(axis, keepdims)


def argmin(x: Tensor, /, *, axis: int | None = None, keepdims: builtins.bool = False) -> Tensor:
    """The index of the first minimum along ``axis`` (of the flattened tensor with None)."""
    return tensor_argument(x, "argmin").argmin(axis, keepdims)


def nonzero(x: Tensor, /) -> tuple[Tensor, ...]:
    """The indices of the non-zero elements, one tensor per axis (their length learned from
    the device)."""
    return tensor_argument(x, "nonzero").nonzero()


def where(condition: Tensor, x1: Tensor | complex, x2: Tensor | complex, /) -> Tensor:
    """``x1`` where ``condition`` holds, else ``x2`` (tensors or Python scalars), broadcast."""
    condition = tensor_argument(condition, "where")
    if isinstance(x1, Tensor) or isinstance(x2, Tensor):
        x1, x2 = operands(x1, x2)
    return condition.session.apply("where", (condition, x1, x2), {})


def searchsorted(x1: Tensor, x2: Tensor | complex, /, *, side: str = "left",
                 sorter: Tensor | None = None) -> Tensor:
    """Where each of ``x2`` would go in the sorted 1-d ``x1`` (``sorter``: the indices that
    sort it), as numpy's ``searchsorted``."""
    x1 = tensor_argument(x1, "searchsorted")
    inputs = (x1, operand(x2)) if sorter is None else (x1, operand(x2), sorter)
    return x1.session.apply("searchsorted", inputs, {"side": side})


def sort(x: Tensor, /, *, axis: int = -1, descending: builtins.bool = False,
         stable: builtins.bool = True) -> Tensor:
    """``x`` sorted along ``axis`` (numpy's stable sort; NaNs last, first when descending)."""
    x = tensor_argument(x, "sort")
    found = x.session.apply("sort", (x,), {"axis": axis, "kind": "stable"})
    return np.flip(found, axis) if descending else found


def argsort(x: Tensor, /, *, axis: int = -1, descending: builtins.bool = False,
            stable: builtins.bool = True) -> Tensor:
    """The indices that sort ``x`` along ``axis``, equal elements kept in their order (also
    when ``descending``)."""
    x = tensor_argument(x, "argsort")
    if not descending:
        return x.argsort(axis, "stable")
    axis = normalize_axis_index(axis, x.ndim)
    backwards = np.flip(np.flip(x, axis).argsort(axis, "stable"), axis)
    return (x.shape[axis] - 1) - backwards


class UniqueAllResult(NamedTuple):
    """``unique_all``'s results."""

    values: Tensor
    indices: Tensor
    inverse_indices: Tensor
    counts: Tensor


class UniqueCountsResult(NamedTuple):
    """``unique_counts``'s results."""

    values: Tensor
    counts: Tensor


class UniqueInverseResult(NamedTuple):
    """``unique_inverse``'s results."""

    values: Tensor
    inverse_indices: Tensor


def _unique(x: Tensor, name: str, **flags: builtins.bool) -> Any:
    # numpy's np.unique with NaNs apart, as the standard's: each result's length learned
    # from the device
    return np.unique(tensor_argument(x, name), equal_nan=False, **flags)


def unique_all(x: Tensor, /) -> UniqueAllResult:
    """The distinct values (NaNs each apart), the index of each one's first occurrence, the
    index of each element's value, and each value's count."""
    values, indices, inverse, counts = _unique(x, "unique_all", return_index=True,
                                               return_inverse=True, return_counts=True)
    return UniqueAllResult(values, indices, inverse.reshape(x.shape), counts)


def unique_counts(x: Tensor, /) -> UniqueCountsResult:
    """The distinct values (NaNs each apart) and how often each occurs."""
    return UniqueCountsResult(*_unique(x, "unique_counts", return_counts=True))


def unique_inverse(x: Tensor, /) -> UniqueInverseResult:
    """The distinct values (NaNs each apart) and, for each element, its value's index."""
    values, inverse = _unique(x, "unique_inverse", return_inverse=True)
    return UniqueInverseResult(values, inverse.reshape(x.shape))


def unique_values(x: Tensor, /) -> Tensor:
    """The distinct values, sorted (NaNs each apart)."""
    return _unique(x, "unique_values")


def isin(x1: Tensor | int, x2: Tensor | int, /, *, invert: builtins.bool = False) -> Tensor:
    """Whether each element of ``x1`` equals an element of ``x2`` (2025.12; either may be a
    Python int): ``x2`` sorted flat on the device, each ``x1`` looked up in it
    (``searchsorted``) and compared with what lies there. NaN is in nothing."""
    x1, x2 = operands(x1, x2)
    tensor = x1 if isinstance(x1, Tensor) else x2
    session = tensor.session
    x1, x2 = (x if isinstance(x, Tensor) else session.asarray(x, tensor.dtype)
              for x in (x1, x2))
    result_type(x1, x2)  # (TypeError for kinds the standard does not mix)
    if not x2.size:
        found = session.zeros(x1.shape, np.bool_)
    else:
        values = sort(reshape(x2, (-1,)))
        at = session.apply("minimum", (searchsorted(values, x1), x2.size - 1), {})
        found = np.take(values, at) == x1
    return session.apply("logical_not", (found,), {}) if invert else found


def take(x: Tensor, indices: Tensor, /, *, axis: int | None = None) -> Tensor:
    """The elements at ``indices`` (a 1-d integer tensor) along ``axis`` (may be left out
    for a 1-d ``x``)."""
    x = tensor_argument(x, "take")
    if axis is None:
        if x.ndim != 1:
            raise ValueError(f"take of a {x.ndim}-d tensor needs axis=.")
        axis = 0
    return np.take(x, indices, axis=axis)


def take_along_axis(x: Tensor, indices: Tensor, /, *, axis: int = -1) -> Tensor:
    """The elements at ``indices`` along ``axis``, ``indices`` of ``x``'s rank (numpy's
    ``take_along_axis``, as one index on the device)."""
    x = tensor_argument(x, "take_along_axis")
    if not isinstance(indices, Tensor) or indices.ndim != x.ndim:
        raise ValueError("take_along_axis takes indices as a tensor of x's rank.")
    axis = normalize_axis_index(axis, x.ndim)
    index = tuple(indices if n == axis else x.session.arange(size).reshape(
        tuple(-1 if m == n else 1 for m in range(x.ndim))) for n, size in enumerate(x.shape))
    return x[index]


# -- linear algebra of the main namespace --------------------------------------------------------

def matmul(x1: Tensor, x2: Tensor, /) -> Tensor:
    """The matrix product (stacks broadcast; a 1-d operand as a vector)."""
    x1, x2 = tensor_argument(x1, "matmul"), tensor_argument(x2, "matmul")
    return x1.session.apply("matmul", (x1, x2), {})


def matrix_transpose(x: Tensor, /) -> Tensor:
    """Each matrix of the stack ``x`` transposed: a view."""
    x = tensor_argument(x, "matrix_transpose")
    if x.ndim < 2:
        raise ValueError("matrix_transpose takes a tensor of at least 2 dimensions.")
    return x.swapaxes(-1, -2)


def tensordot(x1: Tensor, x2: Tensor, /, *,
              axes: int | tuple[Sequence[int], Sequence[int]] = 2) -> Tensor:
    """The sum of products over ``axes`` (the last ``axes`` of ``x1`` with the first of
    ``x2``, or two lists of axes), as one ``einsum`` on the device."""
    x1, x2 = tensor_argument(x1, "tensordot"), tensor_argument(x2, "tensordot")
    if isinstance(axes, int):
        if axes < 0:
            raise ValueError("tensordot's axes must not be negative.")
        first = list(range(x1.ndim - axes, x1.ndim))
        second = list(range(axes))
    else:
        first = list(normalize_axis_tuple(tuple(axes[0]), x1.ndim))
        second = list(normalize_axis_tuple(tuple(axes[1]), x2.ndim))
    if len(first) != len(second) or any(x1.shape[a] != x2.shape[b] and 1 not in (
            x1.shape[a], x2.shape[b]) for a, b in zip(first, second)):
        raise ValueError(f"tensordot: shapes {x1.shape} and {x2.shape} do not match along "
                         f"axes {first} and {second}.")
    return contract(x1, x2, first, second)


def vecdot(x1: Tensor, x2: Tensor, /, *, axis: int = -1) -> Tensor:
    """The dot product of the vectors along ``axis`` (the first operand conjugated),
    the other axes broadcast (not that one: its lengths must be equal)."""
    x1, x2 = tensor_argument(x1, "vecdot"), tensor_argument(x2, "vecdot")
    ndim = max(x1.ndim, x2.ndim)
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of bounds for vecdot of {ndim}-d tensors.")
    lengths = [((1,) * (ndim - x.ndim) + x.shape)[axis] for x in (x1, x2)]
    if lengths[0] != lengths[1]:
        raise ValueError(f"vecdot: shapes {x1.shape} and {x2.shape} differ along axis {axis}.")
    x1, x2 = broadcast_arrays(x1, x2)
    if x1.dtype.kind == "c":
        x1 = np.conjugate(x1)
    x1, x2 = np.moveaxis(x1, axis, -1), np.moveaxis(x2, axis, -1)
    return np.einsum("...i,...i->...", x1, x2)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "astype": astype,
    "sum": _with_dtype("sum", "The sum along ``axis`` (all with None); integers summed in "
                              "the default integer dtype of their signedness."),
    "prod": _with_dtype("prod", "The product along ``axis`` (all with None)."),
    "mean": _reduction("mean", "The mean along ``axis`` (all with None)."),
    "max": _reduction("max", "The maximum along ``axis`` (all with None); NaNs propagate."),
    "min": _reduction("min", "The minimum along ``axis`` (all with None); NaNs propagate."),
    "all": _reduction("all", "Whether every element along ``axis`` is true."),
    "any": _reduction("any", "Whether any element along ``axis`` is true."),
    "std": _spread("std", "The standard deviation along ``axis``, ``correction`` subtracted "
                          "from the count (numpy's ddof)."),
    "var": _spread("var", "The variance along ``axis``, ``correction`` subtracted from the "
                          "count (numpy's ddof)."),
    "cumulative_sum": _scan("cumulative_sum", "cumsum", "zeros"),
    "cumulative_prod": _scan("cumulative_prod", "cumprod", "ones"),
    **{f.__name__: f for f in (
        diff, count_nonzero, concat, stack, unstack, broadcast_to, broadcast_arrays,
        expand_dims, squeeze, permute_dims, moveaxis, reshape, flip, roll, repeat, tile,
        broadcast_shapes, argmax, argmin, nonzero, where, searchsorted, sort, argsort, isin,
        unique_all, unique_counts, unique_inverse, unique_values, take, take_along_axis,
        matmul, matrix_transpose, tensordot, vecdot)},
}
