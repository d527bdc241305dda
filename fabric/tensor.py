"""Tensors: handles to arrays that live on a session's device, and the op stream behind them.

Rule: a tensor's shape and dtype are known on the client from the op table (``fabric.ops``)
before anything is sent; ops are fire-and-forget and batched; only reads and syncs wait.
An op that fails on the worker poisons its outputs, and the error comes back at the next read
or sync that depends on it, naming the op and the line of user code that created it.
"""

from __future__ import annotations

import itertools
import math
import operator
import os
import sys
import time
from collections import OrderedDict, deque
from threading import get_ident as _get_ident
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from .errors import ProtocolError, RemoteError, RequestTimeout, error_from_wire
from .flow import SUBMIT_WINDOW
from .ops import BINARY_UFUNCS, OPS, UNARY_UFUNCS, Spec, weak_int
from .protocol import Kind, Message
from .wire import (INT_RANGE, array_from_frame, device_dtype, dtype_name, encode_index,
                   encode_param, encode_scalar)

# Flush the op batch at this many entries: ops, and the ids of tensors freed between them
# (the worker frees each where the client let it go, so the next result can take its memory;
# a loop like bench W1's frees one per op) ... The worker cannot start on ops it has not been
# sent, and a read waits for the last batch to run: small batches keep the worker busy while
# the client builds more, and the wait short (10,000 tiny ops, bench W1: 4096 ops a batch
# took a quarter longer than 256; below ~128, each message's own cost starts to show).
MAX_BATCH_ENTRIES = 512
MAX_BATCH_BYTES = 4 << 20  # ... or when its uploaded buffers reach this many bytes,
# ... or when its ops touch this many array elements (each op's inputs and output): about a
# millisecond of device work, against a message's tenth of one. A heavy op is then sent at
# once, and runs while the user's code goes on, instead of waiting for the next read.
MAX_BATCH_ELEMENTS = 1 << 20
# The result dtype of an elementwise op on one tensor, on two tensors of one shape, or on a
# tensor and a Python scalar (``_elementwise_single``, ``_elementwise_pair``): at most a few
# thousand entries, as ops, numeric dtypes, ndims and the stand-ins of ints in 64 bits are few.
_ELEMENTWISE_DTYPES: dict[tuple[Any, ...], np.dtype] = {}
_REMEMBERED_ORIGINS = 4096  # at least this many freed tensors' origins, for late errors


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


_new_object = object.__new__
Origin = tuple[Any, int]  # where the user issued an op: (code object or None, byte offset)


def _origin(depth: int = 2) -> Origin:
    """Where the user issued the op: the first frame outside fabric, as its code and the
    offset of the instruction that called into fabric.

    ``depth``: how far up to start looking, when the caller knows that the frames below are
    fabric's own. Each frame looked at costs a frame object, on every op. The line number is
    looked up only when an error names it (``origin_line``): ``frame.f_lineno`` scans the
    code's line table, which takes microseconds in a long function or script.

    The origin found last is kept and given again for an op from the same call site (a loop
    issuing ops): that skips the file test and a tuple per op, about a tenth of the client's
    work per op.
    """
    global _last_origin
    while True:
        try:
            frame = sys._getframe(depth)
        except ValueError:  # fabric all the way down (its own demo, say)
            return (None, 0)
        code, offset = frame.f_code, frame.f_lasti
        last = _last_origin
        if code is last[0] and offset == last[1]:
            return last
        if not code.co_filename.startswith(_PACKAGE_DIR):
            _last_origin = (code, offset)
            return _last_origin
        depth += 1


_last_origin: Origin = (None, 0)


def origin_line(origin: Origin) -> tuple[str, int]:
    """The file and line number of an ``Origin``."""
    code, offset = origin
    if code is None:
        return ("?", 0)
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return (code.co_filename, line)
    return (code.co_filename, code.co_firstlineno)


class Tensor(Spec):
    """An array on a session's device. Nothing is read back until ``numpy()``.

    Sessions make tensors (``session.asarray``, ``session.zeros``, the ops on tensors); a
    tensor is not made by calling this class.
    """

    __slots__ = ("session", "id", "size", "__weakref__")
    __array_priority__ = 1000  # numpy defers binary operators to us

    def __init__(self, *_: Any, **__: Any) -> None:
        raise TypeError("Tensors are made by a session: use session.asarray(array), "
                        "session.zeros(shape) and the other creation methods, or ops on "
                        "tensors.")

    def __del__(self) -> None:
        try:  # freed at this point of the op stream (a list append is thread-safe); its
            session = self.session  # origin is kept a while, for a late error of its op
            session._batch.append(self.id)
            session._freed.append(self.id)
        except AttributeError:  # no session: made by a Tensor() call, which refused it
            pass

    # -- description, without reading ----------------------------------------------------

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes the array takes on the device."""
        return self.size * self.dtype.itemsize

    @property
    def itemsize(self) -> int:
        """The bytes of one element."""
        return self.dtype.itemsize

    @property
    def T(self) -> "Tensor":
        """The tensor with its axes reversed."""
        return self.transpose()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator["Tensor"]:
        """The tensor's rows (each a tensor on the device), as iterating an array gives."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        return (f"<fabric.Tensor shape={self.shape} dtype={self.dtype} id={self.id} "
                f"device={self.session.device.index}>")

    # -- reading ---------------------------------------------------------------------------

    def to(self, session: "TensorSession") -> "Tensor":
        """This array on another session's device, sent worker to worker (in memory when
        both devices are on one worker), never through this client."""
        return self if session is self.session else session._receive_from(self)

    def numpy(self) -> np.ndarray:
        """Read the array back: an ordinary, writable numpy array."""
        return self.session._read(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def item(self) -> Any:
        """Read the tensor's one element, as a Python scalar."""
        return self.numpy().item()

    def tolist(self) -> Any:
        """Read the tensor back as nested Python lists (a scalar for a 0-d tensor)."""
        return self.numpy().tolist()

    def __contains__(self, value: Any) -> bool:
        """``value in t``: whether any element equals it, as numpy's (compared on the device,
        one bool read)."""
        return bool((self == value).any())

    def __bool__(self) -> bool:
        return bool(self.numpy())

    def __float__(self) -> float:
        return float(self.numpy())

    def __int__(self) -> int:
        return int(self.numpy())

    def __index__(self) -> int:
        if self.dtype.kind not in "iub":
            raise TypeError("only integer tensors can be used as an index")
        return int(self.numpy())

    # -- ops -------------------------------------------------------------------------------

    def _op(self, name: str, *args: Any, **params: Any) -> "Tensor":
        return self.session._op(name, (self, *args), params)

    def __getitem__(self, index: Any) -> "Tensor":
        wire = {"index": encode_index(index)}
        return self.session._op("getitem", (self,), {"index": index}, wire)

    def reshape(self, *shape: Any) -> "Tensor":
        """The same values in a new shape (one dimension may be -1), as numpy's."""
        return self._op("reshape", shape=_shape(shape[0] if len(shape) == 1 else shape))

    def transpose(self, *axes: Any) -> "Tensor":
        """The axes permuted (reversed without arguments), as numpy's."""
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return self._op("transpose", axes=tuple(axes) if axes else None)

    def ravel(self) -> "Tensor":
        """The tensor flat (tensors never change, so this is also ``flatten``)."""
        return self.reshape(-1)

    flatten = ravel

    def swapaxes(self, axis1: int, axis2: int) -> "Tensor":
        """Two axes interchanged."""
        return self._op("swapaxes", axis1=axis1, axis2=axis2)

    def squeeze(self, axis: int | tuple[int, ...] | None = None) -> "Tensor":
        """Axes of length one removed (all, or those named)."""
        return self._op("squeeze", axis=axis)

    def astype(self, dtype: Any) -> "Tensor":
        """The values cast to ``dtype``, as numpy's (unsafe) casting does."""
        return self._op("astype", dtype=device_dtype(dtype).str)

    def copy(self) -> "Tensor":
        """A new tensor on the device with this one's values."""
        return self._op("copy")

    # copy.copy and copy.deepcopy copy the values, as numpy's do: a copy of the handle alone
    # would free the device's array when either handle is let go.
    def __copy__(self) -> "Tensor":
        return self.copy()

    def __deepcopy__(self, memo: dict[int, Any]) -> "Tensor":
        return self.copy()

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("A fabric.Tensor is a handle to an array on a device and cannot be "
                        "pickled: pickle t.numpy() instead, and upload it again with "
                        "session.asarray(...).")

    def clip(self, a_min: Any = None, a_max: Any = None, *, min: Any = None,
             max: Any = None) -> "Tensor":
        """Limit values to [a_min, a_max] (``min=``/``max=`` as in NumPy 2 also work)."""
        lower = a_min if min is None else min
        upper = a_max if max is None else max
        return self.session._op("clip", (self, lower, upper), {})

    def round(self, decimals: int = 0) -> "Tensor":
        """Round to ``decimals`` decimals (halves to even), as ``np.round``."""
        return self._op("round", decimals=decimals)

    def __divmod__(self, other: Any) -> tuple["Tensor", "Tensor"]:
        return _divmod(self, other)

    def __rdivmod__(self, other: Any) -> tuple["Tensor", "Tensor"]:
        return _divmod(other, self)

    def dot(self, other: Any) -> "Tensor":
        """The dot product with ``other``, as ``np.dot``."""
        return self._op("dot", other)

    def __matmul__(self, other: Any) -> "Tensor":
        return self._op("matmul", other)

    def __rmatmul__(self, other: Any) -> "Tensor":
        return self.session._op("matmul", (other, self), {})

    def _reduce(self, name: str, axis: Any = None, keepdims: bool = False,
                **extra: Any) -> "Tensor":
        # ``extra``: numpy's other keywords of the reduction (ddof, dtype, initial), those
        # given as None left out, as numpy's defaults.
        if extra.pop("out", None) is not None or extra.pop("where", True) is not True:
            raise TypeError(f"numpy.{name} with out= or where= is not supported on fabric "
                            "tensors: the result is a new tensor on the device; select with "
                            "np.where(condition, t, ...) before reducing.")
        axis = tuple(axis) if isinstance(axis, list) else axis
        return self._op(name, axis=axis, keepdims=keepdims, **_given(extra))

    def sum(self, axis: Any = None, keepdims: bool = False, dtype: Any = None,
            initial: Any = None) -> "Tensor":
        """The sum over ``axis`` (all axes with None), starting from ``initial``."""
        return self._reduce("sum", axis, keepdims, dtype=dtype, initial=initial)

    def prod(self, axis: Any = None, keepdims: bool = False, dtype: Any = None,
             initial: Any = None) -> "Tensor":
        """The product over ``axis`` (all axes with None), starting from ``initial``."""
        return self._reduce("prod", axis, keepdims, dtype=dtype, initial=initial)

    def mean(self, axis: Any = None, keepdims: bool = False, dtype: Any = None) -> "Tensor":
        """The mean over ``axis`` (all axes with None)."""
        return self._reduce("mean", axis, keepdims, dtype=dtype)

    def std(self, axis: Any = None, keepdims: bool = False, ddof: int = 0,
            dtype: Any = None) -> "Tensor":
        """The standard deviation over ``axis``, with ``ddof`` degrees of freedom."""
        return self._reduce("std", axis, keepdims, ddof=ddof, dtype=dtype)

    def var(self, axis: Any = None, keepdims: bool = False, ddof: int = 0,
            dtype: Any = None) -> "Tensor":
        """The variance over ``axis``, with ``ddof`` degrees of freedom."""
        return self._reduce("var", axis, keepdims, ddof=ddof, dtype=dtype)

    def min(self, axis: Any = None, keepdims: bool = False, initial: Any = None) -> "Tensor":
        """The minimum over ``axis`` (all axes with None), ``initial`` included."""
        return self._reduce("min", axis, keepdims, initial=initial)

    def max(self, axis: Any = None, keepdims: bool = False, initial: Any = None) -> "Tensor":
        """The maximum over ``axis`` (all axes with None), ``initial`` included."""
        return self._reduce("max", axis, keepdims, initial=initial)

    def any(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        """Whether any element over ``axis`` is true."""
        return self._reduce("any", axis, keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> "Tensor":
        """Whether every element over ``axis`` is true."""
        return self._reduce("all", axis, keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> "Tensor":
        """The index of the minimum along ``axis`` (of the flattened tensor with None)."""
        return self._reduce("argmin", axis, keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> "Tensor":
        """The index of the maximum along ``axis`` (of the flattened tensor with None)."""
        return self._reduce("argmax", axis, keepdims)

    def cumsum(self, axis: int | None = None, dtype: Any = None) -> "Tensor":
        """Cumulative sum along ``axis`` (None: over the flattened tensor)."""
        return self._op("cumsum", axis=axis, **_given({"dtype": dtype}))

    def cumprod(self, axis: int | None = None, dtype: Any = None) -> "Tensor":
        """Cumulative product along ``axis`` (None: over the flattened tensor)."""
        return self._op("cumprod", axis=axis, **_given({"dtype": dtype}))

    def argsort(self, axis: int | None = -1, kind: str | None = None) -> "Tensor":
        """The indices that sort the tensor along ``axis``, as ``np.argsort``. (There is no
        ``t.sort()``: tensors never change; ``np.sort(t)`` gives a sorted tensor.)"""
        return self._op("argsort", axis=axis, kind=kind)

    # -- numpy interoperability: everything stays remote ------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any,
                        **kwargs: Any) -> Any:
        if ufunc is np.divmod and method == "__call__" and not kwargs:
            return _divmod(*inputs)
        if method != "__call__" or kwargs or ufunc.__name__ not in OPS:
            raise TypeError(f"numpy.{ufunc.__name__}"
                            f"{'' if method == '__call__' else '.' + method}"
                            f"{' with ' + ', '.join(kwargs) if kwargs else ''} is not "
                            "supported on fabric tensors; read the tensor with .numpy() "
                            "first if you mean to compute locally.")
        elementwise = _PAIRS.get(ufunc.__name__) or _SINGLES.get(ufunc.__name__)
        if elementwise is not None:
            return elementwise(*inputs)
        return self.session._op(ufunc.__name__, inputs, {})  # (np.matmul)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        handler = ARRAY_FUNCTIONS.get(func)
        if handler is None:
            raise TypeError(f"numpy.{func.__name__} is not supported on fabric tensors; read "
                            "the tensor with .numpy() first if you mean to compute locally.")
        try:
            return handler(*args, **kwargs)
        except TypeError as exc:
            if exc.__traceback__ is None or exc.__traceback__.tb_next is not None:
                raise  # raised inside: the handler took the arguments
            # The handler refused the arguments themselves (a keyword fabric does not take):
            # say so in numpy's terms, not the handler's name.
            reason = str(exc).split("() ", 1)[-1]
            raise TypeError(f"numpy.{func.__name__} on fabric tensors: {reason}; read the "
                            "tensor with .numpy() first if you mean to compute locally.") from None


def _elementwise_pair(name: str) -> Callable[[Any, Any], Tensor]:
    """Elementwise op ``name`` on two operands, a tensor among them (``+``, ``<``,
    ``np.maximum``, ...): the commonest call in user code. The function is the operator
    itself (``Tensor.__add__``), so no frame stands between the user's ``a + b`` and the op
    (one frame costs about 4% of the client's work per op, bench W1).

    Its commonest operands, a tensor with a Python float or int or with a tensor of its shape
    and session, go the short way: the result has the tensor's shape, its dtype is remembered
    by what inference's signature would hold (the operands' dtypes, floats as float, ints by
    ``weak_int``), and the wire args are made here, not in _emit's loop (a tenth of the
    client's instructions per op). Anything else goes through ``_op``'s inference."""
    def pair(left: Any, right: Any) -> Tensor:
        if type(left) is Tensor:
            session = left.session
            shape, kind, size = left.shape, type(right), left.size
            if kind is float:
                key, wire = (name, len(shape), left.dtype, float), (left.id, right)
            elif kind is int and INT_RANGE[0] <= right < INT_RANGE[1]:
                key = (name, len(shape), left.dtype, weak_int(right))
                wire = (left.id, session._wire_arg(right))
            elif kind is Tensor and right.shape == shape and right.session is session:
                key, wire = (name, len(shape), left.dtype, right.dtype), (left.id, right.id)
            else:
                return session._op(name, (left, right), {})
        else:  # the tensor is on the right: a reflected operator, or numpy's ufunc
            session = right.session
            shape, kind, size = right.shape, type(left), right.size
            if kind is float:
                key, wire = (name, len(shape), float, right.dtype), (left, right.id)
            elif kind is int and INT_RANGE[0] <= left < INT_RANGE[1]:
                key = (name, len(shape), weak_int(left), right.dtype)
                wire = (session._wire_arg(left), right.id)
            else:
                return session._op(name, (left, right), {})
        dtype = _ELEMENTWISE_DTYPES.get(key)  # (looked up here: a call costs a twentieth)
        if dtype is None:
            dtype = _infer_elementwise(key, name, (left, right))
        inputs = 2 * size if kind is Tensor else size  # (elements read: one or two tensors)
        return session._push(name, wire, inputs, shape, dtype, {}, _origin(2), size)
    pair.__name__ = pair.__qualname__ = name
    return pair


def _elementwise_single(name: str) -> Callable[[Tensor], Tensor]:
    """Elementwise op ``name`` on one tensor (``-t``, ``np.exp(t)``), the operator itself as
    in ``_elementwise_pair``: the result has its shape, and a dtype remembered by op, ndim and
    dtype."""
    def single(operand: Tensor) -> Tensor:
        shape = operand.shape
        key = (name, len(shape), operand.dtype)
        dtype = _ELEMENTWISE_DTYPES.get(key)
        if dtype is None:
            dtype = _infer_elementwise(key, name, (operand,))
        return operand.session._push(name, (operand.id,), operand.size, shape, dtype, {},
                                     _origin(2), operand.size)
    single.__name__ = single.__qualname__ = name
    return single


def _reflected(pair: Callable[[Any, Any], Tensor]) -> Callable[[Tensor, Any], Tensor]:
    def method(self: Tensor, other: Any) -> Tensor:
        return pair(other, self)
    return method


# The elementwise ufuncs, by name, as the operators and numpy's ufuncs on tensors run them
_PAIRS = {ufunc.__name__: _elementwise_pair(ufunc.__name__) for ufunc in BINARY_UFUNCS}
_SINGLES = {ufunc.__name__: _elementwise_single(ufunc.__name__) for ufunc in UNARY_UFUNCS}

for _dunder, _name in [("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                       ("truediv", "divide"), ("floordiv", "floor_divide"), ("mod", "remainder"),
                       ("pow", "power"), ("and", "bitwise_and"), ("or", "bitwise_or"),
                       ("xor", "bitwise_xor"), ("lshift", "left_shift"),
                       ("rshift", "right_shift")]:
    setattr(Tensor, f"__{_dunder}__", _PAIRS[_name])
    setattr(Tensor, f"__r{_dunder}__", _reflected(_PAIRS[_name]))
for _dunder, _name in [("lt", "less"), ("le", "less_equal"), ("eq", "equal"),
                       ("ne", "not_equal"), ("ge", "greater_equal"), ("gt", "greater")]:
    setattr(Tensor, f"__{_dunder}__", _PAIRS[_name])
for _dunder, _name in [("neg", "negative"), ("pos", "positive"), ("abs", "absolute"),
                       ("invert", "invert")]:
    setattr(Tensor, f"__{_dunder}__", _SINGLES[_name])
Tensor.__hash__ = object.__hash__  # type: ignore[method-assign]  # __eq__ is elementwise


def _divmod(left: Any, right: Any) -> tuple[Tensor, Tensor]:
    return _PAIRS["floor_divide"](left, right), _PAIRS["remainder"](left, right)


def _given(params: dict[str, Any]) -> dict[str, Any]:
    """numpy keywords as given: those given as None left out (numpy's defaults), a dtype
    checked and named as the device names it."""
    params = {key: value for key, value in params.items() if value is not None}
    if "dtype" in params:
        params["dtype"] = device_dtype(params["dtype"]).str
    return params


def _holds_tensor(items: Sequence[Any]) -> bool:
    return any(isinstance(item, Tensor)
               or isinstance(item, (list, tuple)) and _holds_tensor(item) for item in items)


def _session_of(tensors: Iterable[Any]) -> "TensorSession":
    for t in tensors:
        if isinstance(t, Tensor):
            return t.session
    raise TypeError("At least one argument must be a fabric tensor.")


def _where(condition: Any, *xy: Any) -> Tensor:
    if len(xy) != 2:  # np.where(condition): the indices where it holds, as many as the data
        raise TypeError("numpy.where needs x and y on fabric tensors: the indices where a "
                        "condition holds (np.where(condition), np.nonzero) depend on the data, "
                        "so their shape cannot be known before it is read; read the condition "
                        "with .numpy() first.")
    return _session_of((condition, *xy))._op("where", (condition, *xy), {})


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
    return _session_of((a, b))._op("isclose", (a, b),
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
    reps = _shape(reps)
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
    return _session_of(operands)._op("einsum", operands, params)


def _join_function(name: str) -> Any:
    def function(arrays: Sequence[Any], axis: int = 0) -> Tensor:
        return _session_of(arrays)._op(name, tuple(arrays), {"axis": axis})
    return function


ARRAY_FUNCTIONS: dict[Any, Any] = {
    **{getattr(np, name): _reduction_function(name)
       for name in ["sum", "prod", "mean", "std", "var", "min", "max", "any", "all",
                    "argmin", "argmax"]},
    np.amin: _reduction_function("min"),
    np.amax: _reduction_function("max"),
    np.where: _where,
    np.clip: lambda a, a_min=None, a_max=None, **bounds: a.clip(a_min, a_max, **bounds),
    np.dot: lambda a, b: _session_of((a, b))._op("dot", (a, b), {}),
    np.reshape: lambda a, shape: a.reshape(shape),
    np.transpose: lambda a, axes=None: a.transpose(*(axes or ())),
    np.swapaxes: lambda a, axis1, axis2: a.swapaxes(axis1, axis2),
    np.squeeze: lambda a, axis=None: a.squeeze(axis),
    np.expand_dims: lambda a, axis: a._op("expand_dims", axis=axis),
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
        x._op("nan_to_num", nan=nan, posinf=posinf, neginf=neginf),
    np.cumsum: lambda a, axis=None, dtype=None: a.cumsum(axis, dtype),
    np.cumprod: lambda a, axis=None, dtype=None: a.cumprod(axis, dtype),
    np.sort: lambda a, axis=-1, kind=None: a._op("sort", axis=axis, kind=kind),
    np.argsort: lambda a, axis=-1, kind=None: a.argsort(axis, kind),
    np.zeros_like: _like("zeros"),
    np.ones_like: _like("ones"),
    np.empty_like: _like("empty"),
    np.full_like: _like("full"),
    np.broadcast_to: lambda array, shape: array._op("broadcast_to", shape=_shape(shape)),
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
}


class Random:
    """Seeded random tensors on the device: ``seed``, ``uniform``, ``normal``."""

    def __init__(self, session: "TensorSession") -> None:
        self._session = session

    def seed(self, seed: int) -> None:
        """Reset the session's generator on the device; later draws are reproducible.
        ``seed``: an integer from 0 to 2**64 - 1."""
        seed = operator.index(seed)
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed {seed} is out of range: use an integer from 0 to 2**64 - 1.")
        self._session._enqueue(["seed", 0, [], {"seed": seed}])

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = (),
                dtype: Any = "float64") -> Tensor:
        """Uniform draws from [low, high), of shape ``size``."""
        return self._session._create("uniform", size, dtype, low=low, high=high)

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = (),
               dtype: Any = "float64") -> Tensor:
        """Normal draws of mean ``loc`` and deviation ``scale``, of shape ``size``."""
        return self._session._create("normal", size, dtype, loc=loc, scale=scale)

    def random(self, size: Any = (), dtype: Any = "float64") -> Tensor:
        """Uniform draws from [0, 1), of shape ``size``, as numpy's ``Generator.random``."""
        return self.uniform(0.0, 1.0, size, dtype)

    def integers(self, low: int, high: int | None = None, size: Any = (),
                 dtype: Any = "int64", endpoint: bool = False) -> Tensor:
        """Integers drawn uniformly from [low, high) ([low, high] with ``endpoint``; from
        [0, low) without ``high``), as numpy's ``Generator.integers``."""
        low, high = (0, low) if high is None else (low, high)
        low, high = operator.index(low), operator.index(high)
        if high < low or high == low and not endpoint:
            raise ValueError(f"low >= high: no integer lies in [{low}, {high}"
                             f"{']' if endpoint else ')'}; give a low below high.")
        dtype = device_dtype(dtype)
        if dtype.kind not in "biu":
            raise TypeError(f"integers draws integers: dtype {dtype} is not an integer "
                            "dtype; use uniform for floats.")
        bounds = (0, 1) if dtype.kind == "b" else (np.iinfo(dtype).min, np.iinfo(dtype).max)
        if low < bounds[0] or (high if endpoint else high - 1) > bounds[1]:
            raise ValueError(f"{'low' if low < bounds[0] else 'high'} is out of bounds for "
                             f"{dtype}: its values lie in [{bounds[0]}, {bounds[1]}].")
        return self._session._create("integers", size, dtype, low=low, high=high,
                                     endpoint=endpoint)


def _infer_elementwise(key: tuple[Any, ...], name: str, args: tuple[Any, ...]) -> np.dtype:
    """The result dtype of elementwise op ``name`` on ``args``, inferred and remembered by
    ``key`` (what inference's signature holds). A refusal (numpy's error) is not remembered."""
    dtype = _ELEMENTWISE_DTYPES[key] = OPS[name].infer(args, {})[1]
    return dtype


def _shape(shape: Any) -> tuple[int, ...]:
    """A shape as numpy takes one: an integer or a sequence of them (numpy's too, not floats)."""
    try:
        return (operator.index(shape),)
    except TypeError:
        pass
    try:
        return tuple(operator.index(n) for n in shape)
    except TypeError:
        raise TypeError(f"expected a sequence of integers or a single integer, got {shape!r}"
                        ) from None


class TensorSession:
    """The op stream of a session: creation, batching, reads, releases. Mixed into Session."""

    tracing = False  # True for fabric.graph.Tracer, which records ops instead of sending them

    def _init_stream(self) -> None:
        self._thread = _get_ident()  # the one thread that issues its ops; None once closed
        self._ids = itertools.count(1)
        self._batch: list[Any] = []  # ops, and ids of tensors freed
        self._buffers: list[Any] = []
        self._batch_bytes = 0
        self._batch_elements = 0  # array elements the batch's ops touch
        self._batch_graph_ops = 0  # ops of the batch's graph calls (fabric.graph)
        # Where each tensor's op was issued: live tensors', and the last freed ones' (at least
        # _REMEMBERED_ORIGINS of them), whose ops may still fail after the user let them go.
        self._origins: dict[int, Origin | None] = {}  # (None: a traced function's input)
        self._freed: list[int] = []  # the freed tensors whose origins are kept, oldest first
        self._freed_counted = 0  # the length of _freed after the last batch was sent
        # (batches_sent counts SUBMITs: the device's CREDIT says how many of them it ran)
        self._counts = {"ops_sent": 0, "batches_sent": 0, "bytes_uploaded": 0}
        self._captures: list[Any] = []  # open fabric.capture traces
        self._graphs: OrderedDict[int, Any] = OrderedDict()  # fabric.graph: held by the worker
        self.random = Random(self)

    # -- building ops ------------------------------------------------------------------------

    def _tensor(self, shape: tuple[int, ...], dtype: np.dtype, origin: Origin | None) -> Tensor:
        """A new tensor of this session, whose op the caller queues (or that has none: a traced
        function's input), issued at ``origin`` (None: by no op)."""
        return self._push(None, (), 0, shape, dtype, {}, origin)

    def _wire_arg(self, arg: Any) -> Any:
        if isinstance(arg, Tensor):
            if arg.session is not self:
                if self.tracing or arg.session.tracing:  # a traced function's mix-up
                    raise (self if self.tracing else arg.session)._refuse_capture(arg)
                raise ValueError(f"{arg!r} lives on another session: move it with "
                                 ".to(session) first.")
            return arg.id
        return encode_scalar(arg)

    def _op(self, name: str, args: Sequence[Any], params: dict[str, Any],
            wire_params: dict[str, Any] | None = None) -> Tensor:
        # Arrays and lists among the arguments are uploaded, as numpy would coerce them.
        # (A tensor, the commonest argument, is let through before the costlier isinstance.)
        for arg in args:
            if type(arg) is not Tensor and isinstance(arg, (np.ndarray, list)):
                args = [self.asarray(a) if isinstance(a, (np.ndarray, list)) else a
                        for a in args]
                break
        shape, dtype = OPS[name].infer(args, params)  # numpy's error, here, before sending
        # Whoever called this method is fabric's own, so the user is further up.
        return self._emit(name, args, shape, dtype,
                          params if wire_params is None else wire_params, _origin(3))

    def _emit(self, name: str, args: Sequence[Any], shape: tuple[int, ...], dtype: np.dtype,
              params: dict[str, Any], origin: Origin) -> Tensor:
        # Every op but the elementwise operators' short way (``_elementwise_pair``) comes
        # through here, its args' common cases inline. The op is made of tuples, which the
        # garbage collector stops tracking once it has seen them: the ops waiting in a batch
        # would otherwise reach its oldest generation, and bring on its full collections
        # (milliseconds each) every few thousand ops.
        if params:  # (what the user gave, checked here: a value msgpack cannot carry would
            # stop the whole batch when it is sent, and every batch after it)
            params = {key: encode_param(name, key, value) for key, value in params.items()}
        wire_args = []
        inputs = 0  # the elements the op reads
        for arg in args:
            if type(arg) is Tensor and arg.session is self:
                wire_args.append(arg.id)
                inputs += arg.size
            else:
                wire_args.append(arg if type(arg) is float else self._wire_arg(arg))
        return self._push(name, tuple(wire_args), inputs, shape, dtype, params, origin)

    def _push(self, name: str | None, wire_args: tuple[Any, ...], inputs: int,
              shape: tuple[int, ...], dtype: np.dtype, params: dict[str, Any], origin: Origin,
              size: int | None = None) -> Tensor:
        """Make a tensor of this session, the result of op ``name`` issued at ``origin``, and
        queue the op (its args already in wire form; ``inputs``: the elements it reads,
        counted with those it writes as its work; ``size``: the result's elements, when the
        caller knows them). With ``name`` None, only the tensor is made (``_tensor``).

        The tensor is made here, not by calling the class (whose call with an ``__init__``
        adds about 800 instructions to each op) nor another method (a frame, 3%)."""
        tensor = _new_object(Tensor)
        tensor.shape = shape
        tensor.dtype = dtype
        tensor.size = size = math.prod(shape) if size is None else size  # (counted as work)
        tensor.session = self
        tensor.id = tensor_id = next(self._ids)
        self._origins[tensor_id] = origin
        if name is not None:
            self._batch_elements += inputs + size
            self._enqueue((name, tensor_id, wire_args, params), None, tensor)
        return tensor

    def _enqueue(self, op: Sequence[Any], buffer: Any = None, result: Spec | None = None) -> None:
        if _get_ident() != self._thread:  # another thread's op, or closed (_thread None)
            if result is not None:  # never made on the device, so never to be freed there
                del result.session, self._origins[result.id]
            self._check_open()
        if self._captures:  # fabric.capture: record the op as it is sent
            for trace in self._captures:
                trace.record(op, buffer, result)
        self._batch.append(op)
        if buffer is not None:  # (the bytes grow only here: an op without one skips the test)
            self._buffers.append(buffer)
            self._batch_bytes += buffer.nbytes
            if self._batch_bytes >= MAX_BATCH_BYTES:
                self.flush()
                return
        if len(self._batch) >= MAX_BATCH_ENTRIES or self._batch_elements >= MAX_BATCH_ELEMENTS:
            self.flush()

    def _create(self, name: str, shape: Any, dtype: Any, **params: Any) -> Tensor:
        params = {"shape": list(_shape(shape)), "dtype": device_dtype(dtype).str, **params}
        shape, dtype = OPS[name].infer((), params)
        return self._emit(name, (), shape, dtype, params, _origin(3))  # (called by fabric)

    # -- creation ----------------------------------------------------------------------------

    def asarray(self, array: Any, dtype: Any = None) -> Tensor:
        """Upload an array (any layout or byte order) to the device, as ``np.asarray`` makes
        one. A nested list or tuple that holds tensors is built on the device, where they
        are, with their dtypes promoted as numpy would.

        Raises ``MessageTooLarge``, sending nothing, when the array is bigger than the largest
        message the way to the device takes (``session.max_upload_bytes``).
        """
        if isinstance(array, Tensor):
            if array.session is not self:
                raise ValueError(f"{array!r} lives on another session: read it with .numpy() "
                                 "and upload that, or move it with .to(session).")
            return array if dtype is None else array.astype(dtype)
        if isinstance(array, (list, tuple)) and _holds_tensor(array):
            stacked = self._stack_nested(array)  # (numpy's asarray would read each tensor back)
            return stacked if dtype is None else stacked.astype(dtype)
        return self._upload(np.asarray(array, dtype=dtype))

    def _upload(self, array: np.ndarray) -> Tensor:
        device_dtype(array.dtype)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        array = np.ascontiguousarray(array).reshape(array.shape)  # (keeps 0-d arrays 0-d)
        tensor = self._tensor(array.shape, array.dtype, _origin())
        self._enqueue(["put", tensor.id, [], {"dtype": array.dtype.str,
                                              "shape": list(array.shape),
                                              "buffer": len(self._buffers)}],
                      array.reshape(-1).view(np.uint8), tensor)
        return tensor

    def _stack_nested(self, items: Sequence[Any]) -> Tensor:
        """A nested list or tuple of tensors (and of anything asarray takes), built on the
        device as numpy builds an array of one: each level stacked, dtypes promoted."""
        return self._op("stack", [self.asarray(item) for item in items], {"axis": 0})

    def zeros(self, shape: Any, dtype: Any = "float64") -> Tensor:
        """A tensor of zeros, made on the device."""
        return self._create("zeros", shape, dtype)

    def ones(self, shape: Any, dtype: Any = "float64") -> Tensor:
        """A tensor of ones, made on the device."""
        return self._create("ones", shape, dtype)

    def empty(self, shape: Any, dtype: Any = "float64") -> Tensor:
        """A tensor whose values are whatever its memory held, made on the device."""
        return self._create("empty", shape, dtype)

    def full(self, shape: Any, fill_value: Any, dtype: Any = None) -> Tensor:
        """A tensor of ``fill_value`` (its dtype by numpy's rule without ``dtype``)."""
        dtype = device_dtype(np.asarray(fill_value).dtype if dtype is None else dtype)
        if np.ndim(fill_value) == 0:  # cast here, as numpy's copy casts it (an int past 64
            fill_value = dtype.type(fill_value).item()  # bits fills a float tensor)
        return self._create("full", shape, dtype, fill_value=fill_value)

    def arange(self, start: float, stop: float | None = None, step: float = 1,
               dtype: Any = None) -> Tensor:
        """Evenly spaced values in [start, stop), as ``np.arange``."""
        if stop is None:
            start, stop = 0, start
        if dtype is None:  # numpy's rule: the types of all three, at least an intp
            dtype = np.result_type(np.intp, start, stop, step)
        params = {"start": start, "stop": stop, "step": step,
                  "dtype": device_dtype(dtype).str}
        shape, dtype = OPS["arange"].infer((), params)
        return self._emit("arange", (), shape, dtype, params, _origin())

    def linspace(self, start: float, stop: float, num: int = 50, endpoint: bool = True,
                 dtype: Any = None) -> Tensor:
        """``num`` evenly spaced values from start to stop, as ``np.linspace``."""
        if dtype is None:  # numpy's rule: the types of start and stop, made inexact
            dtype = np.result_type(start, stop, 1.0)
        params = {"start": start, "stop": stop, "num": operator.index(num), "endpoint": endpoint,
                  "dtype": device_dtype(dtype).str}
        shape, dtype = OPS["linspace"].infer((), params)
        return self._emit("linspace", (), shape, dtype, params, _origin())

    def eye(self, n: int, m: int | None = None, k: int = 0, dtype: Any = "float64") -> Tensor:
        """A 2-D tensor with ones on diagonal ``k``, zeros elsewhere."""
        params = {"n": operator.index(n), "m": None if m is None else operator.index(m),
                  "k": operator.index(k), "dtype": device_dtype(dtype).str}
        shape, dtype = OPS["eye"].infer((), params)
        return self._emit("eye", (), shape, dtype, params, _origin())

    # -- the stream --------------------------------------------------------------------------

    def _receive_from(self, source: Tensor) -> Tensor:
        tensor = self._tensor(source.shape, source.dtype, _origin())
        source.session._enqueue(["send", 0, [source.id], {"session": self.id, "id": tensor.id}])
        source.session.flush()
        self._call({"op": "await", "id": tensor.id})  # later ops here may then use it
        return tensor

    def flush(self, timeout: float | None = None) -> None:
        """Send the batched ops now (reads, syncs and close do this for you). If the device
        has not yet run the session's last batches (``fabric.flow.SUBMIT_WINDOW`` of them),
        wait for it first, up to ``timeout`` (default: the session's)."""
        if not self._batch or self.closed:  # (closed: tensors freed since, nothing to send)
            return
        sent = self._counts["batches_sent"]
        if sent - self.connection.pending.done.get(self.id, 0) >= SUBMIT_WINDOW:
            self._wait_for_device(sent, self.timeout if timeout is None else timeout)
        batch, self._batch = self._batch, []  # (first: a free made meanwhile goes next time)
        freed = len(self._freed)  # (each free in the batch is in both lists)
        try:
            self.connection.send(Message(Kind.SUBMIT, self.id, 0, {"ops": batch}, self._buffers))
        except BaseException:
            self._batch = batch + self._batch  # nothing is lost: sent next time
            raise
        self._counts["ops_sent"] += len(batch) - (freed - self._freed_counted)
        if freed >= 2 * _REMEMBERED_ORIGINS:  # the older half goes, at once, in C
            forgotten = self._freed[:-_REMEMBERED_ORIGINS]
            del self._freed[:-_REMEMBERED_ORIGINS]
            deque(map(self._origins.pop, forgotten, itertools.repeat(None)), 0)
            freed -= len(forgotten)
        self._freed_counted = freed
        self._counts["batches_sent"] += 1
        self._counts["bytes_uploaded"] += self._batch_bytes
        self._buffers, self._batch_bytes, self._batch_elements, self._batch_graph_ops = [], 0, 0, 0

    def _wait_for_device(self, sent: int, timeout: float) -> None:
        """Backpressure: wait until the device has run enough of this session's batches for
        one more to be sent (``fabric.flow.SUBMIT_WINDOW``)."""
        def busy(deadline: float) -> RequestTimeout:
            return RequestTimeout(
                f"Device {self.device.index} ran none of this session's {SUBMIT_WINDOW} "
                f"waiting batches of ops in {timeout:g} s: it is busy with long ops, or "
                "stuck. Wait for it with session.sync(timeout=...) before sending more, or "
                "raise timeout=.", device=self.device.index, waiting=SUBMIT_WINDOW)
        self.connection.wait_for_credit(self.id, sent - SUBMIT_WINDOW + 1,
                                        time.monotonic() + timeout, busy)

    def _remote_error(self, wire: dict[str, Any]) -> Exception:
        error = error_from_wire(wire)
        tensor_id = error.details.get("tensor")
        origin = self._origins.get(tensor_id)
        if isinstance(error, RemoteError) and origin is not None:
            file, line = origin_line(origin)
            error.details["origin"] = f"{file}:{line}"
            error.args = (f"{error.message}\n  the op was issued at {file}, line {line}",)
        graph, index = self._graphs.get(error.details.get("graph")), error.details.get("graph_op")
        if graph is not None and type(index) is int and 0 <= index < len(graph.origins):
            file, line = graph.origins[index]
            error.args = (f"{error.args[0]}\n  inside {graph.name}, at {file}, line {line}",)
        return error

    def _call(self, body: dict[str, Any], timeout: float | None = None) -> Message:
        """Flush, send a request to the device and return its reply (raising its error)."""
        if self._batch:  # (a read with nothing batched skips the call)
            self.flush(timeout)
        reply = self._request(body, timeout)
        if "error" in reply.body:
            raise self._remote_error(reply.body["error"])
        return reply

    def _read(self, tensor: Tensor) -> np.ndarray:
        # The worker checks what this client inferred, and answers with the bytes alone.
        reply = self._call({"op": "read", "id": tensor.id, "dtype": dtype_name(tensor.dtype),
                            "shape": tensor.shape})
        if len(reply.buffers) != 1:
            raise ProtocolError("A read reply must carry exactly one buffer.")
        return array_from_frame(reply.buffers[0], tensor.dtype, tensor.shape)

    def sync(self, timeout: float | None = None) -> None:
        """Wait until the device has run everything sent so far; raise its first error."""
        self._call({"op": "sync"}, timeout)

    def compile(self, fn: Any) -> Any:
        """``fn`` traced once per input signature and replayed on this session's device.

        Like ``@fabric.function``, bound to this session: numpy array arguments are
        uploaded to it, and tensors of other sessions are refused.
        """
        from .graph import Function  # graph builds on this module
        return Function(fn, session=self)

    def stats(self) -> dict[str, int]:
        """Counts for this session: what the client sent, what the device holds and ran.

        ``ops`` counts the ops the worker received (a graph call is one); the device adds
        ``ops_fused`` and ``expressions_evaluated`` (0 on numpy), and the session's graphs
        ``graphs`` held, ``graph_registrations``, ``graph_replays`` and
        ``bytes_saved_by_replay`` (the op lists replays did not send, less the calls sent).
        """
        device = self._call({"op": "stats"}).body  # flushes first, so counts are current
        return {**self._counts, **device}
