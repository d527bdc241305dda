"""The op table shared by the client and the workers.

Rule: an op is defined once, here: its name, its numpy implementation, and how its result's
shape and dtype follow from its inputs. The client infers every result from this table, so a
bad shape raises numpy's own error at the call site before anything is sent; the numpy
device runs the very same implementation, so the inference cannot drift from execution.

Each implementation is written once against an array module: numpy's own function of the
op's name (a ufunc, ``np.sum``), which another module ``xp`` spells by the same name, or a
``build`` that makes the op's function for any module (``Op.over``); ``impl`` is numpy's. A
device over another array module (``workers.backends``) runs ``over(xp)`` and overrides only
what its module spells otherwise.

Inference reuses numpy's rules instead of restating them:
- shapes of views (indexing, reshape, transpose, ...) come from applying the op to a
  zero-strided stand-in of the real shape, which costs nothing and raises numpy's errors;
  an index with integer arrays (a copy, as large as its arrays say: 40,000 zeros make 3.2 GB
  of a (1, 10000) tensor) is applied to a stand-in of zero-byte elements, its arrays shrunk
  to one element each, and their broadcast shape put back where numpy put the one element:
  no check ever allocates, or loops over, the result it measures (``index_shape``);
- elementwise shapes come from ``np.broadcast_shapes``;
- dtypes come from applying the op to tiny stand-ins (all dimensions 1) of the real dtypes,
  so type promotion, Python-scalar weak typing and unsupported dtype combinations behave
  exactly as numpy's do. Results are cached per signature.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from fabric.core import ops_functions as functions

Shape = tuple[int, ...]
# An implementation written against an array module: ``build(xp)`` is the op's function
# with module ``xp`` (numpy's, the table's ``impl``, is ``build(np)``).
Build = Callable[[Any], Callable[..., Any]]
# The params of an op that takes none, shared by every such op (one dict less to make and
# free per op): never written into, by rule.
NO_PARAMS: dict[str, Any] = {}


class Spec:
    """What inference needs to know of a tensor argument: its shape and dtype.

    ``fabric.Tensor`` is a Spec, so inference takes tensors as they are.
    """

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Shape, dtype: np.dtype) -> None:
        self.shape = shape
        self.dtype = dtype


# The one element every stand-in's elements are (zero bytes: a zero of any numeric dtype;
# as large as the largest, clongdouble's)
_ZERO_ELEMENT = bytes(32)


def _stand_in(arg: Any, tiny: bool) -> Any:
    """A zero-cost numpy stand-in for a Spec (tiny: every dimension 1); scalars as they are.
    (Read-only zeros, every stride 0, as ``np.broadcast_to`` makes, at a seventh of its cost.)"""
    if not isinstance(arg, Spec):
        return arg
    ndim = len(arg.shape)
    return np.ndarray((1,) * ndim if tiny else arg.shape, arg.dtype, _ZERO_ELEMENT, 0,
                      (0,) * ndim)


def _apply(impl: Callable[..., Any], args: Sequence[Any], params: dict[str, Any],
           tiny: bool) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(impl(*[_stand_in(a, tiny) for a in args], **params))


# -- shape rules ---------------------------------------------------------------------------

def _elementwise_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    first = None
    for arg in args:
        if isinstance(arg, Spec):
            if first is None:
                first = arg.shape
            elif arg.shape != first:  # the rare case pays for numpy's full rule
                return np.broadcast_shapes(*[a.shape for a in args if isinstance(a, Spec)])
    return () if first is None else first


def _view_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    if op.name == "getitem":
        return index_shape(args[0], args[1:], params["index"])
    return _apply(op.impl, args, params, tiny=False).shape


_NO_BYTES = np.dtype([])  # elements of zero bytes: an array of any shape holds nothing


def _empty_stand_in(shape: Shape, dtype: Any = _NO_BYTES) -> np.ndarray:
    """A stand-in of ``shape`` whose elements are zeros of ``dtype`` (by default of zero
    bytes, so that what numpy makes of it holds nothing either), every stride 0."""
    return np.ndarray(shape, dtype, _ZERO_ELEMENT, 0, (0,) * len(shape))


def index_shape(target: Any, arrays: Sequence[Any], index: tuple[Any, ...]) -> Shape:
    """The shape of ``target[index]`` (its ``IndexArray`` items standing for ``arrays``),
    with numpy's errors, found without making the result or looping over it.

    numpy copies what integer arrays select, and iterates over every element it selects
    even where elements are empty; so each integer array (all of them Specs, whose values
    are zeros) is shrunk to one element of as many dimensions as their broadcast, the index
    applied to a stand-in of zero-byte elements, and the broadcast shape put back where the
    selected element stands (found by a second pass with a last dimension of 2). Boolean
    arrays (their stand-ins select nothing), arrays with real values (on the client: their
    bounds are checked) and indexes whose arrays select nothing are applied as they are,
    still to zero-byte elements."""
    shape = target.shape if isinstance(target, Spec) else np.shape(target)
    source = _empty_stand_in(shape)
    spread = [a for a in arrays if isinstance(a, Spec) and a.dtype.kind in "iu"]
    if not spread or len(spread) < len(arrays):
        return _index(source, *[_stand_in(a, False) for a in arrays], index=index).shape
    try:
        together = np.broadcast_shapes(*[a.shape for a in spread])
    except ValueError:  # numpy's own IndexError, from the arrays as they are (none is built)
        return _index(source, *[_stand_in(a, False) for a in arrays], index=index).shape
    if math.prod(together) == 0 or not together:
        return _index(source, *[_stand_in(a, False) for a in arrays], index=index).shape
    ones = (1,) * len(together)
    first = _index(source, *[_empty_stand_in(ones, a.dtype) for a in arrays], index=index).shape
    marked = _index(source, *[_empty_stand_in(ones[:-1] + (2,), a.dtype) for a in arrays],
                    index=index).shape
    last = next(i for i, (one, two) in enumerate(zip(first, marked)) if one != two)
    start = last - len(together) + 1
    return (*first[:start], *together, *first[last + 1:])


def selects_by_data(arrays: Sequence[Any]) -> bool:
    """Whether an index's arrays hold a boolean tensor: how many elements it selects is known
    only on the device (its stand-in selects none)."""
    return any(isinstance(a, Spec) and a.dtype == np.bool_ for a in arrays)


def _update_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # setitem and ufunc_at: the target's shape. The index is checked on a stand-in of the
    # target, and each value must broadcast to the part it selects (numpy drops a value's
    # leading ones), unless a boolean tensor selects it (checked on the device).
    target = args[0]
    values = 1 if op.name == "setitem" else ufunc_named(params["ufunc"]).nin - 1
    arrays = args[1 + values:]
    region = index_shape(target, arrays, params["index"])
    if not selects_by_data(arrays):
        for value in args[1:1 + values]:
            shape = np.shape(value) if not isinstance(value, Spec) else value.shape
            while len(shape) > len(region) and shape[0] == 1:
                shape = shape[1:]
            if len(shape) > len(region) or np.broadcast_shapes(shape, region) != region:
                raise ValueError(f"could not broadcast input array from shape {shape} into "
                                 f"shape {region}")
    return target.shape


def _unknown_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # argwhere, unique, bincount, repeat: how many rows depends on the data; the client
    # learns it from the device (Session.resolve_shape); until then, none.
    if op.name == "argwhere":
        return (0, len(args[0].shape))
    if op.name == "repeat" and params.get("axis") is not None:  # (the repeated axis's)
        shape = list(args[0].shape)
        shape[normalize_axis_index(params["axis"], len(shape))] = 0
        return tuple(shape)
    if op.name == "unique":  # (as many axes as numpy's result for a stand-in has)
        return (0,) * _apply(op.impl, args, params, tiny=True).ndim
    return (0,)


def _axis_of_0d(shape: Shape, axis: Any) -> bool:
    # numpy's quirk: most of its reductions and scans take axis 0 (or -1) of a 0-d array
    return not shape and isinstance(axis, (int, np.integer)) and axis in (0, -1)


def _reduce_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    shape = args[0].shape
    if len(args) > 1 and np.broadcast_shapes(np.shape(args[1]) if not isinstance(
            args[1], Spec) else args[1].shape, shape) != shape:  # where=, numpy's error
        raise ValueError(f"operands could not be broadcast together: where= of shape "
                         f"{np.shape(args[1])} and the array's {shape}")
    axis = params.get("axis")
    if _axis_of_0d(shape, axis) and op.name not in ("mean", "std", "var"):
        return ()
    if axis is None:
        axes = tuple(range(len(shape)))
    elif op.single_axis:
        axes = (normalize_axis_index(axis, len(shape)),)
    else:
        axes = normalize_axis_tuple(axis, len(shape))
    if (op.single_axis or op.name in ("min", "max") and "initial" not in params) \
            and any(shape[a] == 0 for a in axes):
        raise ValueError(f"zero-size array to reduction operation {op.name} which has "
                         "no identity")
    if params.get("keepdims"):
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _quantile_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # percentile, quantile: one reduction per q, q's axes first
    return np.shape(params["q"]) + _reduce_shape(op, args, params)


def _core_mismatch(a: Shape, b: Shape, k_a: int, k_b: int) -> ValueError:
    return ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with "
                      f"gufunc signature (n?,k),(k,m?)->(n?,m?) (size {b[k_b]} is different "
                      f"from {a[k_a]})")


def _matmul_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    a, b = (x.shape if isinstance(x, Spec) else () for x in args)
    if not a or not b:
        raise ValueError("matmul: Input operand does not have enough dimensions (has 0, "
                         "gufunc core with signature (n?,k),(k,m?)->(n?,m?) requires 1)")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise _core_mismatch(a2, b2, -1, -2)
    batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    return batch + (() if len(a) == 1 else (a2[-2],)) + (() if len(b) == 1 else (b2[-1],))


def _dot_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    a, b = (x.shape if isinstance(x, Spec) else () for x in args)  # a scalar multiplies
    if not a or not b:
        return np.broadcast_shapes(a, b)
    k_b = -1 if len(b) == 1 else -2
    if a[-1] != b[k_b]:
        raise ValueError(f"shapes {a} and {b} not aligned: {a[-1]} (dim {len(a) - 1}) != "
                         f"{b[k_b]} (dim {len(b) + k_b})")
    return a[:-1] + b[:-2] + b[-1:] if len(b) > 1 else a[:-1]


def _join_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    shapes = [a.shape for a in args]
    if not shapes:
        raise ValueError("need at least one array to concatenate")
    axis = params.get("axis", 0)
    if axis is None and op.name == "concatenate":  # numpy flattens every array first
        return (sum(math.prod(s) for s in shapes),)
    if op.name == "stack":
        if any(s != shapes[0] for s in shapes):
            raise ValueError("all input arrays must have the same shape")
        axis = normalize_axis_index(axis, len(shapes[0]) + 1)
        return shapes[0][:axis] + (len(shapes),) + shapes[0][axis:]
    first = shapes[0]
    if not first:
        raise ValueError("zero-dimensional arrays cannot be concatenated")
    axis = normalize_axis_index(axis, len(first))
    for i, shape in enumerate(shapes[1:], 1):
        if len(shape) != len(first):
            raise ValueError(
                f"all the input array dimensions except for the concatenation axis must match "
                f"exactly, but the array at index 0 has {len(first)} dimension(s) and the "
                f"array at index {i} has {len(shape)} dimension(s)")
        for d, (m, n) in enumerate(zip(first, shape)):
            if d != axis and m != n:
                raise ValueError(
                    f"all the input array dimensions except for the concatenation axis must "
                    f"match exactly, but along dimension {d}, the array at index 0 has size "
                    f"{m} and the array at index {i} has size {n}")
    return first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1:]


def _scan_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # cumsum, cumprod, sort, argsort: the input's shape, or its size flat with axis None
    shape = args[0].shape
    axis = params.get("axis")
    if axis is None or _axis_of_0d(shape, axis) and op.name != "sort":
        return (math.prod(shape),)
    normalize_axis_index(axis, len(shape))
    return shape


def _einsum_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # The subscripts' syntax, the operand count and each operand's dimension count were
    # checked by the dtype rule (numpy's einsum on stand-ins); here the labels get sizes:
    # a label's sizes broadcast (1 and n give n), except repeated within one operand.
    lhs, arrow, rhs = params["subscripts"].replace(" ", "").partition("->")
    sizes: dict[str, int] = {}
    ellipses = []
    for term, arg in zip(lhs.split(","), args):
        shape = arg.shape if isinstance(arg, Spec) else ()
        before, dots, after = term.partition("...")
        ellipses.append(shape[len(before):len(shape) - len(after)] if dots else ())
        own: dict[str, int] = {}
        for label, n in zip(before + after, shape[:len(before)] + shape[len(shape) - len(after):]):
            if own.setdefault(label, n) != n:
                raise ValueError(f"dimensions in operand for collapsing index '{label}' don't "
                                 f"match ({own[label]} != {n})")
            sizes[label] = np.broadcast_shapes((sizes.get(label, 1),), (n,))[0]
    if not arrow:  # numpy's implicit output: the labels used once, in order, after '...'
        rhs = ("..." if "..." in lhs else "") + "".join(
            sorted(label for label in sizes if lhs.count(label) == 1))
    before, dots, after = rhs.partition("...")
    middle = np.broadcast_shapes(*ellipses) if dots else ()
    return tuple(sizes[label] for label in before) + middle + tuple(sizes[label] for label in after)


def _creation_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    if op.name == "arange":
        start, stop, step = params["start"], params["stop"], params["step"]
        if step == 0:
            raise ZeroDivisionError("arange: step must not be zero")
        return (max(0, math.ceil((stop - start) / step)),)
    if op.name == "linspace":
        if params["num"] < 0:
            raise ValueError(f"Number of samples, {params['num']}, must be non-negative.")
        return (params["num"],)
    if op.name == "eye":
        shape = (params["n"], params["n"] if params["m"] is None else params["m"])
        if any(n < 0 for n in shape):
            raise ValueError("negative dimensions are not allowed")
        return shape
    shape = tuple(params["shape"])
    if any(n < 0 for n in shape):
        raise ValueError("negative dimensions are not allowed")
    return shape


# -- dtype rules ---------------------------------------------------------------------------

def _tiny_dtype(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    with warnings.catch_warnings():  # size-1 stand-ins warn where real data may not
        warnings.simplefilter("ignore")  # (std with ddof=1: "Degrees of freedom <= 0")
        return _apply(op.impl, args, params, tiny=True).dtype


def _same_dtype(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    return args[0].dtype


def _param_dtype(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    return np.dtype(params["dtype"])


def _update_dtype(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    # The target's dtype; a scalar value that it cannot hold (300 into int8, nan into an
    # int) is refused with numpy's error, by storing it into a stand-in; ufunc.at's own
    # casting rule is numpy's, on stand-ins of one element.
    target, dtype = args[0], args[0].dtype
    if op.name == "setitem":
        if not isinstance(args[1], Spec):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (complex into real: numpy warns, as here)
                np.empty((), dtype)[()] = args[1]
        return dtype
    function = ufunc_named(params["ufunc"])
    values = [np.zeros((), v.dtype) if isinstance(v, Spec) else v
              for v in args[1:function.nin]]
    with np.errstate(all="ignore"):
        function.at(np.zeros(1, dtype), np.zeros((), np.intp), *values)
    return target.dtype


def _index_dtype(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    return np.dtype(np.intp)


# -- the table -----------------------------------------------------------------------------

def _not_in(xp: Any, name: str) -> Callable[..., Any]:
    """The implementation of an op that array module ``xp`` does not run (yet): it refuses,
    saying so, and its outputs are poisoned with that sentence as any failed op's are."""
    def refuse(*_: Any, **__: Any) -> Any:
        raise NotImplementedError(f"{name} does not run on a device of {xp.__name__} yet: run "
                                  "it on a numpy device (move the tensor there with .to()).")
    return refuse


@dataclass(frozen=True)
class Op:
    """One op: numpy implementation, shape rule, dtype rule, and how it may be fused; its
    ``build`` where its implementation is written against an array module (else another
    module's is that module's function of the op's name, as numpy's is)."""

    name: str
    impl: Callable[..., Any]
    shape_rule: Callable[["Op", Sequence[Any], dict[str, Any]], Shape]
    dtype_rule: Callable[["Op", Sequence[Any], dict[str, Any]], np.dtype]
    elementwise: bool = False
    single_axis: bool = False  # argmin/argmax take one axis, not a tuple
    build: Build | None = None

    def over(self, xp: Any) -> Callable[..., Any]:
        """This op's implementation with array module ``xp`` (numpy's is ``impl``)."""
        if xp is np:
            return self.impl
        if self.build is not None:
            return self.build(xp)
        return getattr(xp, self.name, None) or _not_in(xp, self.name)

    def infer(self, args: Sequence[Any], params: dict[str, Any]) -> tuple[Shape, np.dtype]:
        """Result shape and dtype, or numpy's own error for these arguments (a dtype error
        before a shape error, as numpy resolves types before it broadcasts)."""
        dtype = self.result_dtype(args, params)
        return self.shape_rule(self, args, params), dtype

    def result_dtype(self, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
        """``infer``'s result dtype alone, or numpy's own error for these arguments."""
        if self.dtype_rule is _tiny_dtype:  # the only rule worth caching
            try:
                return _cached_dtype(self.name, _signature(args),
                                     _freeze(params) if params else ())
            except Exception:  # numpy's refusal, raised again with the user's own values
                pass  # (the signature's stand-ins would name a stand-in, not theirs)
        return self.dtype_rule(self, args, params)


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    # Tensors count by dtype and ndim; scalars by their type (Python scalars are weak in
    # numpy's promotion, numpy scalars are not), Python ints also by their range and sign.
    # (A loop, the commonest kinds first: this runs once per op.)
    signature = []
    for arg in args:
        kind = type(arg)
        if kind is float or kind is bool or kind is complex or arg is None:
            signature.append((kind, None))
        elif kind is int:
            signature.append((int, weak_int(arg)))
        elif isinstance(arg, Spec):
            signature.append((len(arg.shape), arg.dtype))
        else:
            signature.append((kind, arg if isinstance(arg, np.generic) else None))
    return tuple(signature)


_POSITIVE_BOUNDS = (255, 2**15 - 1, 2**16 - 1, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1)
_NEGATIVE_BOUNDS = (-2**15, -2**31, -2**63)


def weak_int(value: int) -> int:
    """A stand-in for a Python int: same sign, and out of bounds for the same integer dtypes.

    A weak Python int keeps the tensor's dtype, but numpy raises OverflowError when it does
    not fit that dtype and ValueError when it is a negative power of an integer: the stand-in
    makes inference raise exactly when numpy would (1, not 0, so no division by zero).
    """
    if -128 <= value <= 127:
        return 1 if value >= 0 else -1
    if value > 0:
        return next((bound for bound in _POSITIVE_BOUNDS if value <= bound), value)
    return next((bound for bound in _NEGATIVE_BOUNDS if value >= bound), value)


def _freeze(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in params.items()))


@lru_cache(maxsize=4096)
def _cached_dtype(name: str, signature: tuple[Any, ...],
                  params: tuple[tuple[str, Any], ...]) -> np.dtype:
    op = OPS[name]
    args = [Spec((1,) * ndim_or_type, dtype) if isinstance(ndim_or_type, int)
            else _example_scalar(ndim_or_type, dtype) for ndim_or_type, dtype in signature]
    return op.dtype_rule(op, args, dict(params))


def _example_scalar(kind: type, value: Any) -> Any:
    # A value of the scalar's type that no op can fail on (1, not 0, for division).
    return value if value is not None else (None if kind is type(None) else kind(1))


class IndexArray:
    """An array in an index, standing for the op's index argument number ``position``
    (those after the target and the values): the index's other items travel in its param."""

    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position

    def __eq__(self, other: Any) -> bool:
        return type(other) is IndexArray and other.position == self.position

    def __hash__(self) -> int:
        return hash((IndexArray, self.position))


def bind_index(index: tuple[Any, ...], arrays: Sequence[Any]) -> tuple[Any, ...]:
    """``index`` with each ``IndexArray`` replaced by the array it stands for."""
    return tuple(arrays[item.position] if type(item) is IndexArray else item for item in index)


def _index(array: np.ndarray, *arrays: Any, index: tuple[Any, ...]) -> np.ndarray:
    return array[bind_index(index, arrays) if arrays else index]


def _setitem(array: np.ndarray, value: Any, *arrays: Any, index: tuple[Any, ...]) -> np.ndarray:
    # Copy on write: a device's arrays never change, so views and other tensors made from
    # the old value keep theirs; the client rebinds the handle to this new array.
    return _write_setitem(array.copy(), value, *arrays, index=index)


def _write_setitem(array: np.ndarray, value: Any, *arrays: Any,
                   index: tuple[Any, ...]) -> np.ndarray:
    array[bind_index(index, arrays) if arrays else index] = value
    return array


def ufunc_named(name: str) -> np.ufunc:
    """numpy's ufunc ``name``, one of the op table's (ValueError for any other name)."""
    function = getattr(np, name, None) if name in OPS else None
    if not isinstance(function, np.ufunc):
        raise ValueError(f"{name!r} is not a ufunc of the op table.")
    return function


def _ufunc_at(array: np.ndarray, *operands: Any, ufunc: str, index: tuple[Any, ...]
              ) -> np.ndarray:
    return _write_ufunc_at(array.copy(), *operands, ufunc=ufunc, index=index)


def _write_ufunc_at(array: np.ndarray, *operands: Any, ufunc: str, index: tuple[Any, ...]
                    ) -> np.ndarray:
    function = ufunc_named(ufunc)
    values, arrays = operands[:function.nin - 1], operands[function.nin - 1:]
    function.at(array, bind_index(index, arrays), *values)
    return array


def _argwhere(a: np.ndarray) -> np.ndarray:
    return np.argwhere(a)


def _unique(xp: Any) -> Callable[..., Any]:
    # np.unique, or its result number ``part`` where flags ask for several (index, inverse,
    # counts): each is an op of its own, its shape learned from the device
    def unique(a: Any, part: int | None = None, **flags: Any) -> Any:
        found = xp.unique(a, **flags)
        return found if part is None else found[part]
    return unique


def _searchsorted(a: np.ndarray, v: Any, *sorter: Any, side: str = "left") -> np.ndarray:
    # np.searchsorted, its sorter (an array of indices) a third input when given
    return np.asarray(np.searchsorted(a, v, side=side, sorter=sorter[0] if sorter else None))


def _searchsorted_shape(op: "Op", args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # one index per value; numpy's checks: a sorted 1-d array, a sorter of its length
    a = args[0].shape
    if len(a) != 1:
        raise ValueError(f"searchsorted takes a 1-d sorted array, not one of shape {a}")
    if len(args) > 2 and (not isinstance(args[2], Spec) or args[2].shape != a):
        raise ValueError("sorter.size must equal a.size")
    if params.get("side", "left") not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right' (got {params['side']!r})")
    return args[1].shape if isinstance(args[1], Spec) else ()


def _where(condition: Any, x: Any, y: Any) -> np.ndarray:
    return np.where(condition, x, y)


def _clip(a: Any, a_min: Any, a_max: Any) -> np.ndarray:
    return np.clip(a, a_min, a_max)


def _astype(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.astype(dtype)


def _reduction(name: str) -> Build:
    # a reduction's input, and its where= mask if it was given one (a second input)
    def build(xp: Any) -> Callable[..., Any]:
        func = getattr(xp, name)

        def run(a: Any, *where: Any, **params: Any) -> Any:
            return xp.asarray(func(a, where=where[0], **params) if where else func(a, **params))
        return run
    return build


def _elementwise(ufunc: np.ufunc) -> Op:
    return Op(ufunc.__name__, ufunc, _elementwise_shape, _tiny_dtype, elementwise=True)


BINARY_UFUNCS = [
    np.add, np.subtract, np.multiply, np.true_divide, np.floor_divide, np.remainder, np.power,
    np.less, np.less_equal, np.equal, np.not_equal, np.greater_equal, np.greater,
    np.bitwise_and, np.bitwise_or, np.bitwise_xor, np.left_shift, np.right_shift,
    np.logical_and, np.logical_or, np.logical_xor, np.maximum, np.minimum, np.fmax, np.fmin,
    np.arctan2, np.hypot, np.fmod, np.copysign, np.logaddexp, np.logaddexp2, np.float_power,
    np.heaviside, np.nextafter,
]
UNARY_UFUNCS = [
    np.negative, np.positive, np.absolute, np.invert, np.logical_not, np.exp, np.exp2,
    np.expm1, np.log, np.log2, np.log10, np.log1p, np.sqrt, np.cbrt, np.square, np.sin,
    np.cos, np.tan, np.arcsin, np.arccos, np.arctan, np.sinh, np.cosh, np.tanh, np.arcsinh,
    np.arccosh, np.arctanh, np.floor, np.ceil, np.rint, np.trunc, np.sign, np.isnan, np.isinf,
    np.isfinite, np.reciprocal, np.conjugate, np.deg2rad, np.rad2deg, np.fabs, np.signbit,
]
SCANS = {"cumsum": np.cumsum, "cumprod": np.cumprod, "sort": np.sort, "argsort": np.argsort}
REDUCTIONS = {
    "sum": np.sum, "prod": np.prod, "mean": np.mean, "std": np.std, "var": np.var,
    "min": np.min, "max": np.max, "any": np.any, "all": np.all,
    "argmin": np.argmin, "argmax": np.argmax,
}


def _written(name: str, build: Build, shape_rule: Callable[..., Shape],
             dtype_rule: Callable[..., np.dtype], **flags: Any) -> Op:
    """An op whose implementation is written against an array module (``build``)."""
    return Op(name, build(np), shape_rule, dtype_rule, build=build, **flags)


def _module_free(impl: Callable[..., Any]) -> Build:
    """The build of an implementation that calls no module (the arrays' own methods)."""
    return lambda xp: impl


def _creation(name: str, build: Build) -> Op:
    return _written(name, build, _creation_shape, _param_dtype)


OPS: dict[str, Op] = {op.name: op for op in [
    *[_elementwise(u) for u in BINARY_UFUNCS + UNARY_UFUNCS],
    Op("where", _where, _elementwise_shape, _tiny_dtype, elementwise=True),
    Op("clip", _clip, _elementwise_shape, _tiny_dtype, elementwise=True),
    Op("round", np.round, _elementwise_shape, _tiny_dtype, elementwise=True),
    Op("real", np.real, _elementwise_shape, _tiny_dtype, elementwise=True),
    Op("imag", np.imag, _elementwise_shape, _tiny_dtype, elementwise=True),
    Op("searchsorted", _searchsorted, _searchsorted_shape, _index_dtype),
    Op("isclose", np.isclose, _elementwise_shape, _tiny_dtype, elementwise=True),
    Op("nan_to_num", np.nan_to_num, _elementwise_shape, _tiny_dtype, elementwise=True),
    *[Op(name, func, _scan_shape, _tiny_dtype) for name, func in SCANS.items()],
    *[_written(name, _reduction(name), _reduce_shape, _tiny_dtype,
               single_axis=name.startswith("arg")) for name in REDUCTIONS],
    _written("median", _reduction("median"), _reduce_shape, _tiny_dtype),
    Op("percentile", np.percentile, _quantile_shape, _tiny_dtype),
    Op("quantile", np.quantile, _quantile_shape, _tiny_dtype),
    Op("matmul", np.matmul, _matmul_shape, _tiny_dtype),
    _written("einsum", lambda xp: lambda *operands, subscripts, optimize=False:
             xp.einsum(subscripts, *operands, optimize=optimize), _einsum_shape, _tiny_dtype),
    Op("dot", np.dot, _dot_shape, _tiny_dtype),
    _written("getitem", _module_free(_index), _view_shape, _same_dtype),
    _written("setitem", _module_free(_setitem), _update_shape, _update_dtype),
    _written("ufunc_at", _module_free(_ufunc_at), _update_shape, _update_dtype),
    Op("argwhere", _argwhere, _unknown_shape, _index_dtype),
    _written("unique", _unique, _unknown_shape, _tiny_dtype),
    Op("bincount", functions.bincount, _unknown_shape, _tiny_dtype),
    Op("repeat", lambda a, repeats, axis=None: np.repeat(a, repeats, axis), _unknown_shape,
       _same_dtype),
    Op("pad", functions.pad, functions.pad_shape, _tiny_dtype),
    *[Op(name, functions.fft(name), functions.fft_shape, functions.fft_dtype)
      for name in functions.FFTS],
    *[_written(name, functions.linalg(name), shape, functions.ones_dtype)
      for name, shape in (("inv", functions.square_shape), ("det", functions.det_shape),
                          ("solve", functions.solve_shape),
                          ("eigvalsh", functions.eigenvalues_shape),
                          ("cholesky", functions.square_shape))],
    Op("pinv", functions.pinv, functions.pinv_shape, functions.ones_dtype),
    *[_written(name, functions.decomposition(name), functions.packed_shape,
               functions.ones_dtype) for name in ("eig", "eigh", "svd")],
    *[Op(name, getattr(functions, name), functions.packed_shape, functions.ones_dtype)
      for name in ("qr", "slogdet")],
    Op("reshape", np.reshape, _view_shape, _same_dtype),
    Op("transpose", np.transpose, _view_shape, _same_dtype),
    Op("swapaxes", np.swapaxes, _view_shape, _same_dtype),
    Op("expand_dims", np.expand_dims, _view_shape, _same_dtype),
    Op("squeeze", np.squeeze, _view_shape, _same_dtype),
    Op("broadcast_to", np.broadcast_to, _view_shape, _same_dtype),
    _written("astype", _module_free(_astype), _elementwise_shape, _param_dtype,
             elementwise=True),
    _written("copy", lambda xp: lambda a: xp.array(a, copy=True), _elementwise_shape,
             _same_dtype),
    Op("roll", functions.roll, _elementwise_shape, _same_dtype),
    _written("concatenate", lambda xp: lambda *arrays, axis=0: xp.concatenate(arrays, axis=axis),
             _join_shape, _tiny_dtype),
    _written("stack", lambda xp: lambda *arrays, axis=0: xp.stack(arrays, axis=axis),
             _join_shape, _tiny_dtype),
    _creation("zeros", lambda xp: lambda shape, dtype: xp.zeros(shape, dtype)),
    _creation("ones", lambda xp: lambda shape, dtype: xp.ones(shape, dtype)),
    _creation("empty", lambda xp: lambda shape, dtype: xp.empty(shape, dtype)),
    _creation("full", lambda xp: lambda shape, dtype, fill_value:
              xp.full(shape, fill_value, dtype)),
    _creation("arange", lambda xp: lambda start, stop, step, dtype:
              xp.arange(start, stop, step, dtype)),
    _creation("linspace", lambda xp: lambda start, stop, num, endpoint, dtype:
              xp.linspace(start, stop, num, endpoint=endpoint, dtype=dtype)),
    _creation("eye", lambda xp: lambda n, m, k, dtype: xp.eye(n, m, k, dtype)),
    # (random values are numpy's, drawn from the session's generator, on every device)
    _creation("uniform", lambda xp: lambda rng, shape, low, high, dtype:
              xp.asarray(rng.uniform(low, high, shape).astype(dtype, copy=False))),
    _creation("normal", lambda xp: lambda rng, shape, loc, scale, dtype:
              xp.asarray(rng.normal(loc, scale, shape).astype(dtype, copy=False))),
    _creation("integers", lambda xp: lambda rng, shape, low, high, endpoint, dtype:
              xp.asarray(rng.integers(low, high, shape, dtype, endpoint=endpoint))),
]}
# The ops the executor passes the session's generator
RANDOM_OPS = frozenset({"uniform", "normal", "integers"})
# The ops whose result's shape depends on the data: the client asks the device for it
DATA_DEPENDENT_OPS = frozenset({"argwhere", "unique", "bincount", "repeat"})
# ... and those whose dtype does (eig's is real where every eigenvalue is)
DATA_DEPENDENT_DTYPE = frozenset({"eig"})


def shape_from_device(name: str, args: Sequence[Any]) -> bool:
    """Whether op ``name`` on ``args`` makes a result whose shape or dtype the device must
    say."""
    return name in DATA_DEPENDENT_OPS or name in DATA_DEPENDENT_DTYPE \
        or name == "getitem" and selects_by_data(args[1:])


# The ops with an index param (``fabric.core.wire.encode_index``)
INDEXED_OPS = frozenset({"getitem", "setitem", "ufunc_at"})
# The updates, and how each writes into its target itself: what a device may run instead of
# the op when the op says ``in_place`` (the client lets the target go right after it: an
# update's old value is never read again) and nothing else on the device sees the target's
# memory (``workers.in_place``).
WRITES_IN_PLACE = {"setitem": _write_setitem, "ufunc_at": _write_ufunc_at}
