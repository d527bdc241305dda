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

The rules reuse numpy's instead of restating them (``fabric.core.op_rules``; an index's in
``fabric.core.op_indexing``); dtypes inferred on stand-ins are cached here per signature.
Updates (``t[i] = v``, ``np.add.at``) are copy on write, and may write in place where the
device says nobody else sees their target (``WRITES_IN_PLACE``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np

from fabric.core import ops_functions as functions
from fabric.core import ops_statistics as statistics
from fabric.core.op_indexing import bind_index, getitem, index_shape, selects_by_data, view_shape
from fabric.core.op_rules import (Shape, Spec, creation_shape, dot_shape, einsum_shape,
                                  elementwise_shape, index_dtype, join_shape, matmul_shape,
                                  param_dtype, quantile_shape, reduce_shape, same_dtype,
                                  scan_shape, searchsorted_shape, small_shape, stand_in,
                                  tiny_dtype, unknown_shape)

# An implementation written against an array module: ``build(xp)`` is the op's function
# with module ``xp`` (numpy's, the table's ``impl``, is ``build(np)``).
Build = Callable[[Any], Callable[..., Any]]
# The params of an op that takes none, shared by every such op (one dict less to make and
# free per op): never written into, by rule.
NO_PARAMS: dict[str, Any] = {}


# -- ops and their inference ---------------------------------------------------------------

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
    # numpy's function refuses an empty axis before it resolves types (ptp's max before its
    # subtract, a quantile's take, pad's edges, average's 0/0): its dtype's stand-ins keep
    # the zero lengths
    empty_first: bool = False

    def runs_on(self, xp: Any) -> bool:
        """Whether array module ``xp`` has this op's implementation (numpy has every one)."""
        return xp is np or self.build is not None or callable(getattr(xp, self.name, None))

    def over(self, xp: Any) -> Callable[..., Any]:
        """This op's implementation with array module ``xp`` (numpy's is ``impl``)."""
        if xp is np:
            return self.impl
        if self.build is not None:
            return self.build(xp)
        return getattr(xp, self.name) if self.runs_on(xp) else _not_in(xp, self.name)

    def infer(self, args: Sequence[Any], params: dict[str, Any]) -> tuple[Shape, np.dtype]:
        """Result shape and dtype, or numpy's own error for these arguments (a dtype error
        before a shape error, as numpy resolves types before it broadcasts)."""
        dtype = self.result_dtype(args, params)
        return self.shape_rule(self, args, params), dtype

    def result_dtype(self, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
        """``infer``'s result dtype alone, or numpy's own error for these arguments."""
        if self.dtype_rule is tiny_dtype:  # the only rule worth caching
            try:
                return _cached_dtype(self.name, _signature(args),
                                     _freeze(params) if params else ())
            except Exception:  # numpy's refusal, raised again with the user's own values
                pass  # (the signature's stand-ins would name a stand-in, not theirs)
        return self.dtype_rule(self, args, params)


def _signature(args: Sequence[Any]) -> tuple[Any, ...]:
    # Tensors count by dtype and ndim (an empty one by which lengths are 0: ``empty_first``);
    # scalars by their type (Python scalars are weak in numpy's promotion, numpy scalars are
    # not), Python ints also by their range and sign.
    # (A loop, the commonest kinds first: this runs once per op.)
    signature = []
    for arg in args:
        kind = type(arg)
        if kind is float or kind is bool or kind is complex or arg is None:
            signature.append((kind, None))
        elif kind is int:
            signature.append((int, weak_int(arg)))
        elif isinstance(arg, Spec):
            shape = arg.shape
            signature.append((small_shape(shape) if 0 in shape else len(shape), arg.dtype))
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
            else Spec(ndim_or_type, dtype) if isinstance(ndim_or_type, tuple)
            else _example_scalar(ndim_or_type, dtype) for ndim_or_type, dtype in signature]
    return op.dtype_rule(op, args, dict(params))


def _example_scalar(kind: type, value: Any) -> Any:
    # A value of the scalar's type that no op can fail on (1, not 0, for division).
    return value if value is not None else (None if kind is type(None) else kind(1))


# -- updates: copy on write ------------------------------------------------------------

def _update_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
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


def _update_dtype(op: Any, args: Sequence[Any], params: dict[str, Any]) -> np.dtype:
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


def _ufunc_method(method: str) -> Build:
    # ufunc.reduce or .accumulate of a ufunc of the table (named by the param ``ufunc``),
    # its where= mask, where given, a second input
    def build(xp: Any) -> Callable[..., Any]:
        def run(a: Any, *where: Any, ufunc: str, **params: Any) -> Any:
            ufunc_named(ufunc)  # (a name of the table's, or ValueError)
            function = getattr(getattr(xp, ufunc), method)
            return xp.asarray(function(a, where=where[0], **params) if where
                              else function(a, **params))
        return run
    return build


def _ufunc_method_shape(op: Op, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    # ufunc.reduce and .accumulate: numpy's own checks (its axes, an empty reduction with no
    # identity, a ufunc that is not reorderable) on a stand-in whose every length is 0 or 1,
    # which costs nothing; the result's shape from the real one (an accumulation's is its
    # input's)
    target = args[0]
    method = getattr(ufunc_named(params["ufunc"]), op.name.removeprefix("ufunc_"))
    small = Spec(small_shape(target.shape), target.dtype)
    with np.errstate(all="ignore"):
        method(stand_in(small, tiny=False), **{key: value for key, value in params.items()
                                                if key != "ufunc"})
    return reduce_shape(op, args, params) if op.name == "ufunc_reduce" else target.shape


def _ufunc_at(array: np.ndarray, *operands: Any, ufunc: str, index: tuple[Any, ...]
              ) -> np.ndarray:
    return _write_ufunc_at(array.copy(), *operands, ufunc=ufunc, index=index)


def _write_ufunc_at(array: np.ndarray, *operands: Any, ufunc: str, index: tuple[Any, ...]
                    ) -> np.ndarray:
    function = ufunc_named(ufunc)
    values, arrays = operands[:function.nin - 1], operands[function.nin - 1:]
    function.at(array, bind_index(index, arrays), *values)
    return array


# -- other implementations -----------------------------------------------------------------

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
    return Op(ufunc.__name__, ufunc, elementwise_shape, tiny_dtype, elementwise=True)


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
    **{f"nan{name}": getattr(np, f"nan{name}") for name in (
        "sum", "prod", "mean", "std", "var", "min", "max", "argmin", "argmax")},
    "ptp": np.ptp,
}
QUANTILES = ("percentile", "quantile", "nanpercentile", "nanquantile")


def _written(name: str, build: Build, shape_rule: Callable[..., Shape],
             dtype_rule: Callable[..., np.dtype], **flags: Any) -> Op:
    """An op whose implementation is written against an array module (``build``)."""
    return Op(name, build(np), shape_rule, dtype_rule, build=build, **flags)


def _module_free(impl: Callable[..., Any]) -> Build:
    """The build of an implementation that calls no module (the arrays' own methods)."""
    return lambda xp: impl


def _creation(name: str, build: Build) -> Op:
    return _written(name, build, creation_shape, param_dtype)


OPS: dict[str, Op] = {op.name: op for op in [
    *[_elementwise(u) for u in BINARY_UFUNCS + UNARY_UFUNCS],
    Op("where", _where, elementwise_shape, tiny_dtype, elementwise=True),
    Op("clip", _clip, elementwise_shape, tiny_dtype, elementwise=True),
    Op("round", np.round, elementwise_shape, tiny_dtype, elementwise=True),
    Op("real", np.real, elementwise_shape, tiny_dtype, elementwise=True),
    Op("imag", np.imag, elementwise_shape, tiny_dtype, elementwise=True),
    Op("searchsorted", _searchsorted, searchsorted_shape, index_dtype),
    Op("isclose", np.isclose, elementwise_shape, tiny_dtype, elementwise=True),
    Op("nan_to_num", np.nan_to_num, elementwise_shape, tiny_dtype, elementwise=True),
    *[Op(name, func, scan_shape, tiny_dtype) for name, func in SCANS.items()],
    *[_written(name, _reduction(name), reduce_shape, tiny_dtype,
               single_axis="arg" in name, empty_first=True) for name in REDUCTIONS],
    *[_written(name, _reduction(name), reduce_shape, tiny_dtype, empty_first=True)
      for name in ("median", "nanmedian")],
    *[Op(name, getattr(np, name), quantile_shape, tiny_dtype, empty_first=True)
      for name in QUANTILES],
    _written("average", statistics.average, statistics.average_shape, functions.ones_dtype,
             empty_first=True),
    *[_written(f"ufunc_{method}", _ufunc_method(method), _ufunc_method_shape, tiny_dtype)
      for method in ("reduce", "accumulate")],
    *[_written(name, statistics.histogram(name), statistics.histogram_shape, tiny_dtype)
      for name in ("histogram", "histogram_bin_edges")],
    _written("interp", statistics.interp, statistics.interp_shape, tiny_dtype),
    _written("convolve", statistics.convolve, statistics.convolve_shape, tiny_dtype),
    _written("lexsort", statistics.lexsort, statistics.lexsort_shape, index_dtype),
    Op("matmul", np.matmul, matmul_shape, tiny_dtype),
    _written("einsum", lambda xp: lambda *operands, subscripts, optimize=False:
             xp.einsum(subscripts, *operands, optimize=optimize), einsum_shape, tiny_dtype),
    Op("dot", np.dot, dot_shape, tiny_dtype),
    _written("getitem", _module_free(getitem), view_shape, same_dtype),
    _written("setitem", _module_free(_setitem), _update_shape, _update_dtype),
    _written("ufunc_at", _module_free(_ufunc_at), _update_shape, _update_dtype),
    Op("argwhere", _argwhere, unknown_shape, index_dtype),
    _written("unique", _unique, unknown_shape, tiny_dtype),
    Op("bincount", functions.bincount, unknown_shape, tiny_dtype),
    Op("repeat", lambda a, repeats, axis=None: np.repeat(a, repeats, axis), unknown_shape,
       same_dtype),
    Op("pad", functions.pad, functions.pad_shape, tiny_dtype, empty_first=True),
    *[_written(name, functions.fft(name), functions.fft_shape, functions.fft_dtype)
      for name in functions.FFTS],
    *[_written(name, functions.linalg(name), shape, functions.ones_dtype)
      for name, shape in (("inv", functions.square_shape), ("det", functions.det_shape),
                          ("solve", functions.solve_shape),
                          ("eigvalsh", functions.eigenvalues_shape),
                          ("cholesky", functions.square_shape))],
    _written("pinv", functions.pinv, functions.pinv_shape, functions.ones_dtype),
    *[_written(name, functions.decomposition(name), functions.packed_shape,
               functions.ones_dtype) for name in ("eig", "eigh", "svd")],
    *[_written(name, getattr(functions, name), functions.packed_shape, functions.ones_dtype)
      for name in ("qr", "slogdet")],
    _written("lstsq", functions.lstsq, functions.lstsq_shape, functions.ones_dtype),
    Op("lstsq_residuals", functions.lstsq_residuals, functions.lstsq_shape,
       functions.ones_dtype),
    Op("reshape", np.reshape, view_shape, same_dtype),
    Op("transpose", np.transpose, view_shape, same_dtype),
    Op("swapaxes", np.swapaxes, view_shape, same_dtype),
    Op("expand_dims", np.expand_dims, view_shape, same_dtype),
    Op("squeeze", np.squeeze, view_shape, same_dtype),
    Op("broadcast_to", np.broadcast_to, view_shape, same_dtype),
    _written("astype", _module_free(_astype), elementwise_shape, param_dtype,
             elementwise=True),
    _written("copy", lambda xp: lambda a: xp.array(a, copy=True), elementwise_shape,
             same_dtype),
    Op("roll", functions.roll, elementwise_shape, same_dtype),
    _written("concatenate", lambda xp: lambda *arrays, axis=0: xp.concatenate(arrays, axis=axis),
             join_shape, tiny_dtype),
    _written("stack", lambda xp: lambda *arrays, axis=0: xp.stack(arrays, axis=axis),
             join_shape, tiny_dtype),
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
DATA_DEPENDENT_OPS = frozenset({"argwhere", "unique", "bincount", "repeat", "lstsq_residuals"})
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
