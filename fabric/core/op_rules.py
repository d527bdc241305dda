"""How an op's result shape and dtype follow from its inputs: numpy's rules, reused.

Rule: inference restates none of numpy's rules that numpy can apply itself:
- shapes of views come from applying the op to a zero-strided stand-in of the real shape,
  which costs nothing and raises numpy's errors (indexes: ``fabric.core.op_indexing``);
- elementwise shapes come from ``np.broadcast_shapes``;
- dtypes come from applying the op to tiny stand-ins (all dimensions 1) of the real dtypes,
  so type promotion, Python-scalar weak typing and unsupported dtype combinations behave
  exactly as numpy's do (``fabric.core.ops`` caches them per signature); an op whose numpy
  function refuses an empty axis before it resolves types (``Op.empty_first``: a quantile,
  ``ptp``, ``pad``) keeps the real zero lengths in them, so numpy's own check raises first.
Where a rule must restate numpy (a reduction's axes, matmul's core dimensions), it raises
numpy's own error type and words. Each rule is ``rule(op, args, params)``: ``op`` an
``fabric.core.ops.Op`` (its ``name``, ``impl``, ``single_axis``), ``args`` Specs and scalars.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

Shape = tuple[int, ...]


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


def small_shape(shape: Shape) -> Shape:
    """``shape`` with every length past 1 made 1: what numpy's checks of empty axes see of
    it, at no cost."""
    return tuple(min(n, 1) for n in shape)


def stand_in(arg: Any, tiny: bool, keep_empty: bool = False) -> Any:
    """A zero-cost numpy stand-in for a Spec (tiny: every dimension 1, or with
    ``keep_empty`` 0 where the real one is 0); scalars as they are. (Read-only zeros, every
    stride 0, as ``np.broadcast_to`` makes, at a seventh of its cost.)"""
    if not isinstance(arg, Spec):
        return arg
    ndim = len(arg.shape)
    shape = arg.shape if not tiny else small_shape(arg.shape) if keep_empty else (1,) * ndim
    return np.ndarray(shape, arg.dtype, _ZERO_ELEMENT, 0, (0,) * ndim)


def apply_to_stand_ins(impl: Callable[..., Any], args: Sequence[Any], params: dict[str, Any],
                       tiny: bool, keep_empty: bool = False) -> np.ndarray:
    """``impl`` applied to stand-ins of ``args`` (``stand_in``), numpy's warnings silenced."""
    with np.errstate(all="ignore"):
        return np.asarray(impl(*[stand_in(a, tiny, keep_empty) for a in args], **params))


_NO_BYTES = np.dtype([])  # elements of zero bytes: an array of any shape holds nothing


def empty_stand_in(shape: Shape, dtype: Any = _NO_BYTES) -> np.ndarray:
    """A stand-in of ``shape`` whose elements are zeros of ``dtype`` (by default of zero
    bytes, so that what numpy makes of it holds nothing either), every stride 0."""
    return np.ndarray(shape, dtype, _ZERO_ELEMENT, 0, (0,) * len(shape))


# -- shape rules ---------------------------------------------------------------------------

def elementwise_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    first = None
    for arg in args:
        if isinstance(arg, Spec):
            if first is None:
                first = arg.shape
            elif arg.shape != first:  # the rare case pays for numpy's full rule
                return np.broadcast_shapes(*[a.shape for a in args if isinstance(a, Spec)])
    return () if first is None else first


def unknown_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # argwhere, unique, bincount, repeat: how many rows depends on the data; the client
    # learns it from the device (Session.resolve_shape); until then, none.
    if op.name == "argwhere":
        return (0, len(args[0].shape))
    if op.name == "repeat" and params.get("axis") is not None:  # (the repeated axis's)
        shape = list(args[0].shape)
        shape[normalize_axis_index(params["axis"], len(shape))] = 0
        return tuple(shape)
    if op.name == "unique":  # (as many axes as numpy's result for a stand-in has)
        return (0,) * apply_to_stand_ins(op.impl, args, params, tiny=True).ndim
    return (0,)


def _axis_of_0d(shape: Shape, axis: Any) -> bool:
    # numpy's quirk: most of its reductions and scans take axis 0 (or -1) of a 0-d array
    return not shape and isinstance(axis, (int, np.integer)) and axis in (0, -1)


def reduce_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
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
    no_identity = op.single_axis or op.name.removeprefix("nan") in ("min", "max", "ptp") \
        and "initial" not in params
    if no_identity and any(shape[a] == 0 for a in axes):
        raise ValueError(f"zero-size array to reduction operation {op.name} which has "
                         "no identity")
    if params.get("keepdims"):
        return tuple(1 if i in axes else n for i, n in enumerate(shape))
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def quantile_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # percentile, quantile: one reduction per q, q's axes first
    return np.shape(params["q"]) + reduce_shape(op, args, params)


def _core_mismatch(a: Shape, b: Shape, k_a: int, k_b: int) -> ValueError:
    return ValueError(f"matmul: Input operand 1 has a mismatch in its core dimension 0, with "
                      f"gufunc signature (n?,k),(k,m?)->(n?,m?) (size {b[k_b]} is different "
                      f"from {a[k_a]})")


def matmul_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
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


def dot_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    a, b = (x.shape if isinstance(x, Spec) else () for x in args)  # a scalar multiplies
    if not a or not b:
        return np.broadcast_shapes(a, b)
    k_b = -1 if len(b) == 1 else -2
    if a[-1] != b[k_b]:
        raise ValueError(f"shapes {a} and {b} not aligned: {a[-1]} (dim {len(a) - 1}) != "
                         f"{b[k_b]} (dim {len(b) + k_b})")
    return a[:-1] + b[:-2] + b[-1:] if len(b) > 1 else a[:-1]


def join_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
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


def scan_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # cumsum, cumprod, sort, argsort: the input's shape, or its size flat with axis None
    shape = args[0].shape
    axis = params.get("axis")
    if axis is None or _axis_of_0d(shape, axis) and op.name != "sort":
        return (math.prod(shape),)
    normalize_axis_index(axis, len(shape))
    return shape


def einsum_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
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
    return (tuple(sizes[label] for label in before) + middle
            + tuple(sizes[label] for label in after))


def creation_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
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


def searchsorted_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # one index per value; numpy's checks: a sorted 1-d array, a sorter of its length
    a = args[0].shape
    if len(a) != 1:
        raise ValueError(f"searchsorted takes a 1-d sorted array, not one of shape {a}")
    if len(args) > 2 and (not isinstance(args[2], Spec) or args[2].shape != a):
        raise ValueError("sorter.size must equal a.size")
    if params.get("side", "left") not in ("left", "right"):
        raise ValueError(f"side must be 'left' or 'right' (got {params['side']!r})")
    return args[1].shape if isinstance(args[1], Spec) else ()


# -- dtype rules ---------------------------------------------------------------------------

def tiny_dtype(op: Any, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    with warnings.catch_warnings():  # size-1 stand-ins warn where real data may not
        warnings.simplefilter("ignore")  # (std with ddof=1: "Degrees of freedom <= 0")
        return apply_to_stand_ins(op.impl, args, params, tiny=True,
                                  keep_empty=op.empty_first).dtype


def same_dtype(op: Any, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    return args[0].dtype


def param_dtype(op: Any, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    return np.dtype(params["dtype"])


def index_dtype(op: Any, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
    return np.dtype(np.intp)
