"""The array namespace of a stream's tensors: creation, and the one way an op is issued.

Rule: an op of the table is issued by ``apply`` (which infers its shape and dtype, numpy's
error at the call site) or, its result already known, by ``emit``; both end in the stream's
``push``, as the elementwise operators' short way does. ``ArrayNamespace`` is what tensors
name as their ``.session``: a ``fabric.Session`` sends its stream to a device, a graph
``Tracer`` records it; each declares the rest (``flush``, ``read``, ``sync``, ...).
"""

from __future__ import annotations

import math
import operator
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

import numpy as np

# (imported to register numpy's functions on tensors)
from fabric.arrays import (numpy_fft, numpy_functions, numpy_linalg,  # noqa: F401
                           numpy_nanfunctions, numpy_statistics)
from fabric.arrays.indexing import as_shape
from fabric.arrays.origins import issued_at
from fabric.arrays.progress import Progress, upload as upload_in_chunks, wanted as progress_wanted
from fabric.arrays.random import Random
from fabric.arrays.stream import OpStream
from fabric.arrays.tensor import Tensor
from fabric.core.device import Device
from fabric.core.errors import DtypeNotSupported, MessageTooLarge
from fabric.core.flow import size_and_limit_text
from fabric.core.ops import OPS
from fabric.core.session_life import SessionLife
from fabric.core.wire import device_dtype, encode_param, encode_scalar


# What apply uploads among an op's arguments: arrays and lists, and complex scalars
_COMPLEX = (complex, np.complexfloating)
_UPLOADED = (np.ndarray, list, *_COMPLEX)


def _holds_tensor(items: Sequence[Any]) -> bool:
    return any(isinstance(item, Tensor)
               or isinstance(item, (list, tuple)) and _holds_tensor(item) for item in items)


class ArrayNamespace(ABC):
    """Tensors of one op stream, and how to make them: ``asarray``, ``zeros``, ``ones``,
    ``full``, ``empty``, ``arange``, ``linspace``, ``eye``, ``random``."""

    tracing = False  # True for fabric.graphs.function.Tracer: it records ops, sends none
    # The largest array one upload may carry (a session learns it from its broker).
    max_upload_bytes: float = math.inf
    upload_limit_hint = "raise --max-message-bytes on the broker and workers"  # (what binds)

    def __init__(self, device: Device, session_id: int = 0,
                 life: SessionLife | None = None) -> None:
        self.device = device
        # Every op of this namespace's tensors; ``life``: the session's (None: the stream's own)
        self.stream = OpStream(self, session_id, life)
        self.stream.for_device(device.settings)
        # The dtypes the device holds, where it says (a jax device has no float128): an op or
        # upload of another is refused at the call (None: every dtype numpy has)
        held = device.settings.get("dtypes")
        self.held_dtypes = None if held is None else frozenset(map(np.dtype, held))
        self.random = Random(self)

    # -- what each kind declares -------------------------------------------------------------

    @abstractmethod
    def flush(self, timeout: float | None = None) -> None:
        """Send the batched ops now (the stream calls this when a batch is full)."""

    @abstractmethod
    def read(self, tensor: Tensor, copy: bool = True, out: np.ndarray | None = None) \
            -> np.ndarray:
        """``tensor``'s values (``t.numpy()``; ``copy=False``: read-only, maybe shared;
        ``out``: written into that array, checked already, and returned)."""

    @abstractmethod
    def resolve_shape(self, tensor: Tensor) -> None:
        """Learn ``tensor``'s shape, made by an op whose result's shape depends on the data
        (``a[mask]``, ``np.nonzero``, ``np.unique``)."""

    def check_update(self) -> None:
        """Raise where this namespace's tensors may not be updated (``t[i] = v``)."""

    @abstractmethod
    def receive_from(self, source: Tensor) -> Tensor:
        """``source``, a tensor of another session, as a tensor of this one (``t.to(...)``)."""

    @abstractmethod
    def sync(self, timeout: float | None = None) -> None:
        """Wait until the device has run everything sent so far; raise its first error."""

    @abstractmethod
    def stats(self) -> dict[str, int]:
        """Counts: what was sent, what the device holds and ran."""

    @abstractmethod
    def compile(self, fn: Callable[..., Any]) -> Any:
        """``fn`` traced once per input signature and replayed on this namespace's device."""

    @abstractmethod
    def foreign_tensor(self, tensor: Tensor) -> Exception:
        """The error for an op that mixes this namespace's tensors with ``tensor``."""

    # -- issuing ops ---------------------------------------------------------------------------

    def wire_arg(self, arg: Any) -> Any:
        """An op's argument as it travels: a tensor of this namespace by its id, a scalar
        encoded; a tensor of another namespace refused."""
        if isinstance(arg, Tensor):
            if arg.session is not self:  # (a traced function's mix-up says so)
                owner = arg.session if arg.session.tracing and not self.tracing else self
                raise owner.foreign_tensor(arg)
            return arg.id
        return encode_scalar(arg)

    def apply(self, name: str, args: Sequence[Any], params: dict[str, Any],
              wire_params: dict[str, Any] | None = None) -> Tensor:
        """Op ``name`` of the op table on ``args``, queued; its result, whose shape and dtype
        are inferred here (numpy's error, before anything is sent). ``wire_params``: the
        params as they travel, when not as given (an index)."""
        # Arrays and lists among the arguments are uploaded, as numpy would coerce them, and
        # complex scalars, which no op's args carry, as 0-d arrays (``complex_operand``).
        # (A tensor, the commonest argument, is let through before the costlier isinstance.)
        for arg in args:
            if type(arg) is not Tensor and isinstance(arg, _UPLOADED):
                dtypes = [a.dtype for a in args if isinstance(a, Tensor)]
                args = [self.asarray(a) if isinstance(a, (np.ndarray, list)) else
                        self.complex_operand(a, dtypes) if isinstance(a, _COMPLEX) else a
                        for a in args]
                break
        shape, dtype = OPS[name].infer(args, params)  # numpy's error, here, before sending
        # Whoever called this method is fabric's own, so the user is further up.
        return self.emit(name, args, shape, dtype,
                         params if wire_params is None else wire_params, issued_at(3))

    def complex_operand(self, value: Any, dtypes: Sequence[np.dtype]) -> Tensor:
        """A complex scalar operand, as a 0-d tensor of the dtype numpy's promotion gives it
        beside tensors of ``dtypes`` (a Python complex is weak: complex64 beside complex64 or
        float32), so that the op's result is numpy's."""
        return self._upload(np.asarray(value, np.result_type(*dtypes, value)))

    def emit(self, name: str, args: Sequence[Any], shape: tuple[int, ...], dtype: np.dtype,
             params: dict[str, Any], origin: Any) -> Tensor:
        """Op ``name`` on ``args``, its result's ``shape`` and ``dtype`` known, issued at
        ``origin``: queued with its args and params in wire form."""
        # Every op but the elementwise operators' short way (``fabric.arrays.tensor``) comes
        # through here, its args' common cases inline. The op is made of tuples, which the
        # garbage collector stops tracking once it has seen them: the ops waiting in a batch
        # would otherwise reach its oldest generation, and bring on its full collections
        # (milliseconds each) every few thousand ops.
        if params:  # (what the user gave, checked here: a value msgpack cannot carry would
            # stop the whole batch when it is sent, and every batch after it; and a dtype the
            # device cannot hold, which only a param brings: its operands' dtypes were held)
            if self.held_dtypes is not None and dtype not in self.held_dtypes:
                self.refuse_dtype(f"{name}'s result", dtype)
            params = {key: encode_param(name, key, value) for key, value in params.items()}
        wire_args = []
        inputs = 0  # the elements the op reads
        for arg in args:
            if type(arg) is Tensor and arg.session is self:
                wire_args.append(arg.id)
                inputs += arg.size
            else:
                wire_args.append(arg if type(arg) is float else self.wire_arg(arg))
        return self.stream.push_op(name, tuple(wire_args), params, inputs, shape, dtype, origin)

    def create(self, name: str, shape: Any, dtype: Any, **params: Any) -> Tensor:
        """A new tensor of ``shape`` and ``dtype``, made on the device by creation op
        ``name`` (``zeros``, ``uniform``, ...) with ``params``."""
        params = {"shape": list(as_shape(shape)), "dtype": device_dtype(dtype).str, **params}
        shape, dtype = OPS[name].infer((), params)
        return self.emit(name, (), shape, dtype, params, issued_at(3))  # (called by fabric)

    # -- creation ------------------------------------------------------------------------------

    def asarray(self, array: Any, dtype: Any = None, *, progress: Progress = None) -> Tensor:
        """Upload an array (any layout or byte order) to the device, as ``np.asarray`` makes
        one. A nested list or tuple that holds tensors is built on the device, where they
        are, with their dtypes promoted as numpy would. A large upload shows a progress bar
        after a second where a person watches (``progress=``: None that, True from the start,
        False never, or a callable told the bytes stored so far; ``fabric.arrays.progress``).

        Raises ``MessageTooLarge``, sending nothing, when the array is bigger than the largest
        message the way to the device takes (``session.max_upload_bytes``).
        """
        if isinstance(array, Tensor):
            if array.session is not self:
                raise ValueError(f"{array._handle()} lives on another session than {self!r}: "
                                 "move it with .to(session), or read it with .numpy() and "
                                 "upload that.")
            return array if dtype is None else array.astype(dtype)
        if isinstance(array, (list, tuple)) and _holds_tensor(array):
            stacked = self._stack_nested(array)  # (numpy's asarray would read each tensor back)
            return stacked if dtype is None else stacked.astype(dtype)
        array = np.asarray(array, dtype=dtype)
        if progress_wanted(progress, array.nbytes):
            return upload_in_chunks(self, array, progress)
        return self._upload(array)

    def refuse_dtype(self, what: str, dtype: np.dtype) -> None:
        """Raise DtypeNotSupported: the device holds no ``dtype`` (``what`` has it)."""
        device = self.device
        raise DtypeNotSupported(
            f"Device {device.index} ({device.backend}) cannot hold {dtype}: {what} is refused "
            f"rather than computed in another precision. Run it on a numpy device, or astype "
            f"to one of {', '.join(sorted(d.name for d in self.held_dtypes))} first.",
            backend=device.backend, dtype=str(dtype))

    def _upload(self, array: np.ndarray) -> Tensor:
        if array.nbytes > self.max_upload_bytes:
            size, limit = size_and_limit_text(array.nbytes, self.max_upload_bytes)
            raise MessageTooLarge(
                f"The array is {size}, more than the {limit} one message to device "
                f"{self.device.index} may carry: upload it in slices and join them on "
                f"the device with np.concatenate, or {self.upload_limit_hint}.",
                size=array.nbytes, limit=self.max_upload_bytes)
        device_dtype(array.dtype)
        held = self.held_dtypes
        if held is not None and array.dtype.newbyteorder("=") not in held:
            self.refuse_dtype("an upload", array.dtype)
        if not array.dtype.isnative:
            array = array.astype(array.dtype.newbyteorder("="))
        array = np.ascontiguousarray(array).reshape(array.shape)  # (keeps 0-d arrays 0-d)
        tensor = self.stream.new_tensor(array.shape, array.dtype, issued_at())
        self._put(tensor, array)
        return tensor

    def _put(self, tensor: Tensor, array: np.ndarray) -> None:
        """Queue the upload of ``array`` (native byte order, contiguous) as ``tensor``."""
        stream = self.stream
        stream.enqueue(["put", tensor.id, [], {"dtype": array.dtype.str,
                                               "shape": list(array.shape),
                                               "buffer": len(stream.buffers)}],
                       array.reshape(-1).view(np.uint8), tensor)

    def _stack_nested(self, items: Sequence[Any]) -> Tensor:
        """A nested list or tuple of tensors (and of anything asarray takes), built on the
        device as numpy builds an array of one: each level stacked, dtypes promoted."""
        return self.apply("stack", [self.asarray(item) for item in items], {"axis": 0})

    def zeros(self, shape: Any, dtype: Any = "float64") -> Tensor:
        """A tensor of zeros, made on the device."""
        return self.create("zeros", shape, dtype)

    def ones(self, shape: Any, dtype: Any = "float64") -> Tensor:
        """A tensor of ones, made on the device."""
        return self.create("ones", shape, dtype)

    def empty(self, shape: Any, dtype: Any = "float64") -> Tensor:
        """A tensor whose values are whatever its memory held, made on the device."""
        return self.create("empty", shape, dtype)

    def full(self, shape: Any, fill_value: Any, dtype: Any = None) -> Tensor:
        """A tensor of ``fill_value`` (its dtype by numpy's rule without ``dtype``)."""
        dtype = device_dtype(np.asarray(fill_value).dtype if dtype is None else dtype)
        if dtype.kind == "c":  # (no op's params carry a complex: a 0-d upload, broadcast)
            one = self._upload(np.asarray(fill_value, dtype))
            return self.apply("broadcast_to", (one,), {"shape": as_shape(shape)}).copy()
        if np.ndim(fill_value) == 0:  # cast here, as numpy's copy casts it (an int past 64
            fill_value = dtype.type(fill_value).item()  # bits fills a float tensor)
        return self.create("full", shape, dtype, fill_value=fill_value)

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
        return self.emit("arange", (), shape, dtype, params, issued_at())

    def linspace(self, start: float, stop: float, num: int = 50, endpoint: bool = True,
                 dtype: Any = None) -> Tensor:
        """``num`` evenly spaced values from start to stop, as ``np.linspace``."""
        if dtype is None:  # numpy's rule: the types of start and stop, made inexact
            dtype = np.result_type(start, stop, 1.0)
        params = {"start": start, "stop": stop, "num": operator.index(num), "endpoint": endpoint,
                  "dtype": device_dtype(dtype).str}
        shape, dtype = OPS["linspace"].infer((), params)
        return self.emit("linspace", (), shape, dtype, params, issued_at())

    def eye(self, n: int, m: int | None = None, k: int = 0, dtype: Any = "float64") -> Tensor:
        """A 2-D tensor with ones on diagonal ``k``, zeros elsewhere."""
        params = {"n": operator.index(n), "m": None if m is None else operator.index(m),
                  "k": operator.index(k), "dtype": device_dtype(dtype).str}
        shape, dtype = OPS["eye"].infer((), params)
        return self.emit("eye", (), shape, dtype, params, issued_at())
