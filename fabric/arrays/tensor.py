"""Tensors: handles to arrays that live on a device, and their operators.

Rule: a tensor's shape and dtype are known on the client from the op table (``fabric.core.ops``)
before anything is sent (or, where they depend on the data, learned from the device at the
op: ``a[mask]``, ``np.unique``). A ``Tensor`` holds no data: every method and operator queues
an op on its session's stream (``session.apply``), the elementwise operators by a short way
straight into the stream (``OpStream.push``), and only ``numpy()``, the conversions and
printing read. Updates (``t[i] = v``, ``t += v``, ``out=t``, ``np.add.at(t, ...)``) are
copy on write, and views are linked to their base so that a write through either reaches the
other as numpy's does: ``fabric.arrays.views`` keeps that rule. numpy's functions on tensors are
looked up in ``ARRAY_FUNCTIONS``, which ``fabric.arrays.numpy_functions`` fills (NEP 18's
registry).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from fabric.arrays import read_target
from fabric.arrays.html_repr import byte_text
from fabric.arrays.indexing import (PreparedIndex, Remembered, as_shape, basic_index_key,
                                    prepare_index, update_key)
from fabric.arrays.operators import elementwise_pair, elementwise_single
from fabric.arrays.origins import issued_at
from fabric.arrays.printing import Printed, summary_index
from fabric.arrays.progress import Progress, read_showing, wanted as progress_wanted
from fabric.arrays.views import (assign, check_out, check_reduction_out, check_writable, link,
                                 store_into, ufunc_at)
from fabric.core.ops import BINARY_UFUNCS, OPS, UNARY_UFUNCS, Spec
from fabric.core.wire import device_dtype, pack_index

# Basic indexes already inferred: (indexed shape, ``basic_index_key``) -> (result's shape,
# params as they travel, whether it is a view); updates: ``update_key`` -> params.
_BASIC_INDEXES, _BASIC_UPDATES = Remembered(), Remembered()
# numpy function -> its handler on tensors; filled by fabric.arrays.numpy_functions, which the
# module that makes every tensor's session (fabric.arrays.creation) imports.
ARRAY_FUNCTIONS: dict[Any, Callable[..., Any]] = {}
# ufunc method (reduce, accumulate) -> its handler on tensors, ``handler(ufunc, *inputs,
# **kwargs)``; filled by fabric.arrays.numpy_functions too
UFUNC_METHODS: dict[str, Callable[..., Any]] = {}
# The array API standard's namespace of a session, ``(session, api_version) -> namespace``
# (``t.__array_namespace__()``): the one function fabric.array_api puts here when loaded, as
# the client's package loads it.
ARRAY_NAMESPACE: list[Callable[[Any, str | None], Any]] = []


class Tensor(Printed, Spec):
    """An array on a session's device. Nothing is read back until ``numpy()``.

    Sessions make tensors (``session.asarray``, ``session.zeros``, the ops on tensors); a
    tensor is not made by calling this class.
    """

    # (_view_of and _views are set only on views and their bases; read with getattr)
    __slots__ = ("session", "id", "size", "_view_of", "_views", "__weakref__")
    __array_priority__ = 1000  # numpy defers binary operators to us

    def __init__(self, *_: Any, **__: Any) -> None:
        raise TypeError("Tensors are made by a session: use session.asarray(array), "
                        "session.zeros(shape) and the other creation methods, or ops on "
                        "tensors.")

    def __del__(self) -> None:
        try:  # freed at this point of the op stream (a list append is thread-safe); its
            stream = self.session.stream  # origin is kept a while, for a late error of its op
            stream.batch.append(self.id)
            stream.freed.append(self.id)
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

    @property
    def mT(self) -> "Tensor":
        """Each matrix of the stack transposed (the last two axes swapped): a view."""
        if len(self.shape) < 2:
            raise ValueError(f"mT needs at least 2 dimensions; this tensor has {self.ndim}.")
        return self.swapaxes(-1, -2)

    @property
    def device(self) -> Any:
        """The device the tensor lives on (its session's, a ``fabric.Device``)."""
        return self.session.device

    def __array_namespace__(self, /, *, api_version: str | None = None) -> Any:
        """The array API standard's namespace of this tensor's session
        (``fabric.array_api``): its functions run on the device."""
        if not ARRAY_NAMESPACE:
            raise RuntimeError("The array API namespace is not loaded: import fabric.array_api "
                               "(fabric.connect and LocalCluster load it).")
        return ARRAY_NAMESPACE[0](self.session, api_version)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self) -> Iterator["Tensor"]:
        """The tensor's rows (each a tensor on the device), as iterating an array gives."""
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def _handle(self) -> str:
        session = self.session
        return (f"<fabric.Tensor shape={self.shape} dtype={self.dtype} id={self.id} "
                f"session={session.stream.session_id:#x} device={session.device.index}>")

    def _fields(self) -> list[tuple[str, Any]]:
        """What the client knows of the tensor without a read (``fabric.arrays.html_repr``)."""
        session, device = self.session, self.device
        return [("shape", self.shape), ("dtype", self.dtype),
                ("device", f"{device.index} ({device.backend})"),
                ("bytes", byte_text(self.nbytes)),
                ("session", f"{session.stream.session_id:#x}")]

    def _shown(self) -> tuple[np.ndarray, bool]:
        """What numpy's printing shows of the values, read (``fabric.arrays.printing``), and
        whether that is a summary's part of them."""
        index = summary_index(self.shape)
        return (self.numpy(), False) if index is None else (self[index].numpy(), True)

    # -- reading ---------------------------------------------------------------------------

    def to(self, session: Any) -> "Tensor":
        """This array on another session's device, sent worker to worker (in memory when
        both devices are on one worker), never through this client."""
        return self if session is self.session else session.receive_from(self)

    def to_device(self, device: Any, /, *, stream: Any = None) -> Any:
        """This array on ``device``: a device of the cluster (moved worker to worker, on a
        session over this one's connection, as ``to``), or ``"cpu"``: read back, as
        ``numpy()`` reads it (the explicit read, never an implicit one)."""
        if stream is not None:
            raise ValueError("to_device takes no stream= on fabric tensors: each session's "
                             "ops already run in the order they were issued.")
        if isinstance(device, str) and device == "cpu":
            return self.numpy()
        return self.to(self.__array_namespace__().session_on(device))

    def numpy(self, copy: bool = True, *, out: np.ndarray | None = None,
              progress: Progress = None) -> np.ndarray:
        """Read the array back: an ordinary, writable numpy array of its own; with
        ``copy=False``, a read-only one that may share memory with the worker. A large array
        that lies in its device's shared memory (an upload or a move written there) is not
        copied either way: the array keeps its slot until collected, mapped copy on write
        (its writes are its own) or, with ``copy=False``, shared.
        ``out``: a writable numpy array of the tensor's shape (and a dtype numpy's
        ``same_kind`` casting takes it into) to read into, and return; a loop that reads into
        one buffer so never faults in new memory. Where its worker shares this host, and
        ``out`` is C-contiguous and of the tensor's dtype, the worker writes it in place.
        A read that waits over a second shows the time waited where a person watches;
        ``progress=True`` shows a large read's bytes from the start, a callable is told the
        bytes read so far (``fabric.arrays.progress``)."""
        if out is not None:
            if not copy:
                raise ValueError("numpy(out=) writes into out: copy=False does not apply.")
            read_target.check(self, out)
        # (None reads in one message: in pieces, a warm read ran at half the speed)
        if progress is not None and progress_wanted(progress, self.nbytes):
            return read_showing(self, progress, out)
        return self.session.read(self, copy, out)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """The array read back (as ``numpy()`` reads it) and exported through DLPack, for
        ``np.from_dlpack(t)`` and other libraries' ``from_dlpack``: the read is that call."""
        return self.numpy().__dlpack__(stream=stream, max_version=max_version,
                                       dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        """DLPack's CPU (1, 0): what ``__dlpack__`` exports is read into this host's memory."""
        return (1, 0)

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

    def __complex__(self) -> complex:
        return complex(self.numpy())

    def __index__(self) -> int:
        if self.dtype.kind not in "iub" or self.shape:  # (numpy's words; nothing read)
            raise TypeError("only integer scalar arrays can be converted to a scalar index")
        return int(self.numpy())

    # -- ops -------------------------------------------------------------------------------

    def _op(self, name: str, *args: Any, **params: Any) -> "Tensor":
        return self.session.apply(name, (self, *args), params)

    def view_op(self, name: str, kind: str = "view", **params: Any) -> "Tensor":
        """Op ``name`` of the table, a view of this tensor in numpy (``ViewLink``'s kinds):
        its result is linked to this tensor, so that updates reach both as numpy's do."""
        return link(self, self.session.apply(name, (self,), params), name, (), params, kind)

    def _indexed(self, name: str, values: tuple[Any, ...], index: Any, in_place: bool = False,
                 **params: Any) -> tuple["Tensor", PreparedIndex, list[Any], dict[str, Any]]:
        """Op ``name`` (getitem, setitem, ufunc_at) on this tensor, ``values`` and ``index``
        (numpy arrays and lists in either uploaded): its result, the index taken apart, the
        index's tensors and the op's params as they travel. ``in_place``: an update whose
        result this tensor takes over, its old value let go
        (``fabric.core.ops.WRITES_IN_PLACE``)."""
        prepared = prepare_index(index)
        session = self.session
        values = tuple(session.asarray(v) if isinstance(v, (np.ndarray, list, tuple)) else v
                       for v in values)
        # (inferred with the index's numpy arrays themselves: numpy's errors, out of bounds
        # included, at the call)
        shape, dtype = OPS[name].infer((self, *values, *prepared.arrays),
                                       {**params, "index": prepared.items})
        arrays = [a if isinstance(a, Tensor) else session.asarray(a) for a in prepared.arrays]
        wire = {**params, "index": pack_index(prepared.items)}
        if in_place:
            wire["in_place"] = True
        result = session.emit(name, (self, *values, *arrays), shape, dtype, wire, issued_at(3))
        return result, prepared, arrays, wire

    def __getitem__(self, index: Any) -> "Tensor":
        """numpy's indexing: ints, slices, ``...``, None, boolean masks and integer arrays
        (numpy's, lists or tensors). A basic index gives a view, as numpy's. A boolean
        tensor's result has as many elements as it holds true: one small round trip to the
        device learns how many."""
        basic = basic_index_key(index)
        if basic is not None:  # (the same few views each step of a stencil: as inferred)
            known = _BASIC_INDEXES.get((self.shape, basic))
            if known is not None:
                shape, wire, view = known
                result = self.session.stream.push_op("getitem", (self.id,), wire, self.size,
                                                     shape, self.dtype, issued_at(2))
                return link(self, result, "getitem", (), wire, "view") if view else result
        result, prepared, arrays, wire = self._indexed("getitem", (), index)
        view = not prepared.data_dependent and prepared.is_view(len(self.shape))
        if prepared.data_dependent:
            self.session.resolve_shape(result)
        elif view:
            link(self, result, "getitem", tuple(arrays), wire, "view")
        if basic is not None:
            _BASIC_INDEXES.remember((self.shape, basic), (result.shape, wire, view))
        return result

    def __setitem__(self, index: Any, value: Any) -> None:
        """``t[index] = value`` for every index numpy takes, run on the device as one op:
        the tensor (and the views of it, and the tensor it is a view of) then holds the new
        values, as numpy's does; other tensors made from its old values keep theirs."""
        check_writable(self)
        if isinstance(value, (complex, np.complexfloating)) and self.dtype.kind == "c":
            value = self.session.complex_operand(value, (self.dtype,))  # (no op's args carry
            # a complex: a 0-d tensor; into a real tensor, numpy's TypeError at the call)
        key = update_key(self, index, value)
        wire = _BASIC_UPDATES.get(key)
        if wire is None:  # (once per signature in a loop: inferring it is most of the work)
            result, _, _, wire = self._indexed("setitem", (value,), index, in_place=True)
            _BASIC_UPDATES.remember(key, wire)
        else:
            result = self.session.stream.push_op("setitem", (
                self.id, self.session.wire_arg(value)), wire, self.size, self.shape,
                self.dtype, issued_at(2))
        assign(self, result)

    def reshape(self, *shape: Any) -> "Tensor":
        """The same values in a new shape (one dimension may be -1), as numpy's. numpy's
        result shares memory only where the layout allows, so while both are in use,
        neither may be written into (a ValueError says what to do instead)."""
        return self.view_op("reshape", "layout",
                            shape=as_shape(shape[0] if len(shape) == 1 else shape))

    def transpose(self, *axes: Any) -> "Tensor":
        """The axes permuted (reversed without arguments), as numpy's: a view."""
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        return self.view_op("transpose", axes=tuple(axes) if axes else None)

    def ravel(self) -> "Tensor":
        """The tensor flat, as ``reshape(-1)``."""
        return self.reshape(-1)

    def flatten(self) -> "Tensor":
        """A flat copy of the tensor (never a view, as numpy's)."""
        return self.reshape(-1).copy()

    def swapaxes(self, axis1: int, axis2: int) -> "Tensor":
        """Two axes interchanged: a view."""
        return self.view_op("swapaxes", axis1=axis1, axis2=axis2)

    def squeeze(self, axis: int | tuple[int, ...] | None = None) -> "Tensor":
        """Axes of length one removed (all, or those named): a view."""
        return self.view_op("squeeze", axis=axis)

    def nonzero(self) -> tuple["Tensor", ...]:
        """The indices of the non-zero elements, one tensor per axis, as numpy's: their
        length depends on the data, learned from the device by one small round trip."""
        if not self.shape:
            raise ValueError("Calling nonzero on 0d arrays is not allowed. Use "
                             "np.atleast_1d(scalar).nonzero() instead.")
        found = self.session.apply("argwhere", (self,), {})
        self.session.resolve_shape(found)
        return tuple(found[:, axis] for axis in range(len(self.shape)))

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
        return self.session.apply("clip", (self, lower, upper), {})

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
        return self.session.apply("matmul", (other, self), {})

    def _reduce(self, name: str, axis: Any = None, keepdims: bool = False,
                **extra: Any) -> "Tensor":
        # ``extra``: numpy's other keywords of the reduction (ddof, dtype, initial), those
        # given as None left out, as numpy's defaults; where=, a mask, is a second input;
        # out=, a tensor that takes the result (an update).
        out, where = extra.pop("out", None), extra.pop("where", True)
        axis = tuple(axis) if isinstance(axis, list) else axis
        params = {"axis": axis, "keepdims": keepdims, **given_params(extra)}
        inputs = (self,) if where is True else (self, where)
        if out is None:
            return self.session.apply(name, inputs, params)
        check_reduction_out(name, self, params, OPS[name].infer(inputs, params)[0], out)
        return store_into(out, self.session.apply(name, inputs, params))

    def sum(self, axis: Any = None, keepdims: bool = False, dtype: Any = None,
            initial: Any = None, where: Any = True) -> "Tensor":
        """The sum over ``axis`` (all axes with None), starting from ``initial``."""
        return self._reduce("sum", axis, keepdims, dtype=dtype, initial=initial, where=where)

    def prod(self, axis: Any = None, keepdims: bool = False, dtype: Any = None,
             initial: Any = None, where: Any = True) -> "Tensor":
        """The product over ``axis`` (all axes with None), starting from ``initial``."""
        return self._reduce("prod", axis, keepdims, dtype=dtype, initial=initial, where=where)

    def mean(self, axis: Any = None, keepdims: bool = False, dtype: Any = None,
             where: Any = True) -> "Tensor":
        """The mean over ``axis`` (all axes with None)."""
        return self._reduce("mean", axis, keepdims, dtype=dtype, where=where)

    def std(self, axis: Any = None, keepdims: bool = False, ddof: int = 0,
            dtype: Any = None, where: Any = True) -> "Tensor":
        """The standard deviation over ``axis``, with ``ddof`` degrees of freedom."""
        return self._reduce("std", axis, keepdims, ddof=ddof, dtype=dtype, where=where)

    def var(self, axis: Any = None, keepdims: bool = False, ddof: int = 0,
            dtype: Any = None, where: Any = True) -> "Tensor":
        """The variance over ``axis``, with ``ddof`` degrees of freedom."""
        return self._reduce("var", axis, keepdims, ddof=ddof, dtype=dtype, where=where)

    def min(self, axis: Any = None, keepdims: bool = False, initial: Any = None,
            where: Any = True) -> "Tensor":
        """The minimum over ``axis`` (all axes with None), ``initial`` included."""
        return self._reduce("min", axis, keepdims, initial=initial, where=where)

    def max(self, axis: Any = None, keepdims: bool = False, initial: Any = None,
            where: Any = True) -> "Tensor":
        """The maximum over ``axis`` (all axes with None), ``initial`` included."""
        return self._reduce("max", axis, keepdims, initial=initial, where=where)

    def any(self, axis: Any = None, keepdims: bool = False, where: Any = True) -> "Tensor":
        """Whether any element over ``axis`` is true."""
        return self._reduce("any", axis, keepdims, where=where)

    def all(self, axis: Any = None, keepdims: bool = False, where: Any = True) -> "Tensor":
        """Whether every element over ``axis`` is true."""
        return self._reduce("all", axis, keepdims, where=where)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> "Tensor":
        """The index of the minimum along ``axis`` (of the flattened tensor with None)."""
        return self._reduce("argmin", axis, keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> "Tensor":
        """The index of the maximum along ``axis`` (of the flattened tensor with None)."""
        return self._reduce("argmax", axis, keepdims)

    def cumsum(self, axis: int | None = None, dtype: Any = None) -> "Tensor":
        """Cumulative sum along ``axis`` (None: over the flattened tensor)."""
        return self._op("cumsum", axis=axis, **given_params({"dtype": dtype}))

    def cumprod(self, axis: int | None = None, dtype: Any = None) -> "Tensor":
        """Cumulative product along ``axis`` (None: over the flattened tensor)."""
        return self._op("cumprod", axis=axis, **given_params({"dtype": dtype}))

    def argsort(self, axis: int | None = -1, kind: str | None = None) -> "Tensor":
        """The indices that sort the tensor along ``axis``, as ``np.argsort``. (There is no
        ``t.sort()`` yet; ``np.sort(t)`` gives a sorted tensor.)"""
        return self._op("argsort", axis=axis, kind=kind)

    # -- numpy interoperability: everything stays remote ------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any,
                        **kwargs: Any) -> Any:
        out = kwargs.pop("out", None)
        known = ufunc.__name__ in OPS or ufunc is np.divmod
        if method == "at" and not kwargs and out is None and ufunc.__name__ in OPS:
            if not isinstance(inputs[0], Tensor):
                raise TypeError(f"numpy.{ufunc.__name__}.at with fabric tensors needs the "
                                "target to be a tensor: upload it with session.asarray(...), "
                                "or read the tensors with .numpy() to update a numpy array.")
            return ufunc_at(ufunc, *inputs)
        if method in UFUNC_METHODS and out is None and ufunc.__name__ in OPS:
            return UFUNC_METHODS[method](ufunc, *inputs, **kwargs)
        if method != "__call__" or kwargs or not known:
            raise TypeError(f"numpy.{ufunc.__name__}"
                            f"{'' if method == '__call__' else '.' + method}"
                            f"{' with ' + ', '.join(kwargs) if kwargs else ''} is not "
                            "supported on fabric tensors; read the tensor with .numpy() "
                            "first if you mean to compute locally.")
        if out is not None:
            session = next(a.session for a in inputs + out if isinstance(a, Tensor))
            if any(not isinstance(t, Tensor) or t.session is not session for t in out):
                raise TypeError(f"numpy.{ufunc.__name__} on fabric tensors takes out= only "
                                "as a tensor of their session; read the result with .numpy() "
                                "to store it into a numpy array.")
            check_out(ufunc, inputs, out)
        if ufunc is np.divmod:
            results: Any = _divmod(*inputs)
        else:
            elementwise = _PAIRS.get(ufunc.__name__) or _SINGLES.get(ufunc.__name__)
            results = elementwise(*inputs, 2) if elementwise is not None \
                else self.session.apply(ufunc.__name__, inputs, {})  # (np.matmul; 2: depth)
        if out is None:
            return results
        if ufunc is not np.divmod:
            return store_into(out[0], results)
        return tuple(store_into(target, result) for target, result in zip(out, results))

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        handler = ARRAY_FUNCTIONS.get(func)
        if handler is None:
            raise TypeError(f"{numpy_name(func)} is not supported on fabric tensors; read "
                            "the tensor with .numpy() first if you mean to compute locally.")
        try:
            return handler(*args, **kwargs)
        except TypeError as exc:
            if exc.__traceback__ is None or exc.__traceback__.tb_next is not None:
                raise  # raised inside: the handler took the arguments
            # The handler refused the arguments themselves (a keyword fabric does not take):
            # say so in numpy's terms, not the handler's name.
            reason = str(exc).split("() ", 1)[-1]
            raise TypeError(f"{numpy_name(func)} on fabric tensors: {reason}; read the "
                            "tensor with .numpy() first if you mean to compute locally.") from None


def numpy_name(func: Any) -> str:
    """A numpy function's name as users write it, with its submodule (``numpy.linalg.inv``)."""
    return f"{getattr(func, '__module__', None) or 'numpy'}.{func.__qualname__}"


def _reflected(pair: Callable[..., Tensor]) -> Callable[[Tensor, Any], Tensor]:
    def method(self: Tensor, other: Any) -> Tensor:
        return pair(other, self, 2)  # (2: the user's call is this method's caller)
    return method


# The elementwise ufuncs, by name, as the operators and numpy's ufuncs on tensors run them
_PAIRS = {ufunc.__name__: elementwise_pair(ufunc.__name__, Tensor) for ufunc in BINARY_UFUNCS}
_SINGLES = {ufunc.__name__: elementwise_single(ufunc.__name__, Tensor)
            for ufunc in UNARY_UFUNCS}

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
Tensor.__pow__ = lambda t, e: (  # type: ignore[method-assign]  # numpy's ** squares for 2:
    _SINGLES["square"](t) if type(e) is int and e == 2 and t.dtype == np.bool_  # bool: int8
    else _PAIRS["power"](t, e, 2))


def _in_place(ufunc: np.ufunc) -> Callable[[Tensor, Any], Tensor]:
    def method(self: Tensor, other: Any) -> Tensor:
        return ufunc(self, other, out=self)  # (numpy's in-place rules: store_into)
    return method


for _dunder, _ufunc in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                        ("truediv", np.true_divide), ("floordiv", np.floor_divide),
                        ("mod", np.remainder), ("pow", np.power), ("and", np.bitwise_and),
                        ("or", np.bitwise_or), ("xor", np.bitwise_xor),
                        ("lshift", np.left_shift), ("rshift", np.right_shift),
                        ("matmul", np.matmul)]:
    setattr(Tensor, f"__i{_dunder}__", _in_place(_ufunc))


def _divmod(left: Any, right: Any) -> tuple[Tensor, Tensor]:
    return _PAIRS["floor_divide"](left, right), _PAIRS["remainder"](left, right)


def given_params(params: dict[str, Any]) -> dict[str, Any]:
    """numpy keywords as given: those given as None left out (numpy's defaults), a dtype
    checked and named as the device names it."""
    params = {key: value for key, value in params.items() if value is not None}
    if "dtype" in params:
        params["dtype"] = device_dtype(params["dtype"]).str
    return params
