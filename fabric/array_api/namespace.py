"""The namespace of one session (``t.__array_namespace__()``): the standard's creation
functions, which make tensors on that session's device (or, with ``device=``, on another device
of its cluster), its ``__array_namespace_info__``, and every function, dtype and constant of
``fabric.array_api``.

Rule: a namespace holds nothing but its session: two namespaces of one session are equal (a
library that gathers its arrays' namespaces finds one), those of two sessions are not (their
tensors do not mix). A device other than the session's is served by a session on it over the
same connection, opened once as a one-device mesh of the session's (``session.mesh``), which
closes with it.
"""

from __future__ import annotations

import builtins
import operator
import weakref
from types import ModuleType
from typing import Any

import numpy as np

from fabric.array_api import dtypes, linalg
from fabric.array_api.fft import FFT
from fabric.array_api.dtypes import DEFAULT_DTYPES, DTYPES, dtype_of, isdtype
from fabric.array_api.elementwise import FUNCTIONS as ELEMENTWISE, tensor_argument
from fabric.array_api.functions import FUNCTIONS as OTHERS
from fabric.arrays.tensor import Tensor
from fabric.core.device import Device
from fabric.core.errors import named

API_VERSION = "2025.12"
API_VERSIONS = ("2021.12", "2022.12", "2023.12", "2024.12", "2025.12")
Shape = int | tuple[int, ...]
# The session a session opened for another device belongs to (weakly, both ways): a tensor
# moved back from that device goes to the session it came from, not to a third one.
_OPENED_BY: weakref.WeakKeyDictionary[Any, weakref.ref[Any]] = weakref.WeakKeyDictionary()


class Info:
    """What ``xp.__array_namespace_info__()`` says of a namespace: its capabilities, devices
    and dtypes."""

    def __init__(self, namespace: "ArrayAPINamespace") -> None:
        self._namespace = namespace

    def capabilities(self) -> dict[str, Any]:
        """Boolean indexing and data-dependent shapes: yes (the device says the length, one
        small round trip); at most numpy's 64 dimensions."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": 64}

    def default_device(self) -> Device:
        """The session's own device."""
        return self._namespace.session.device

    def devices(self) -> tuple[Device, ...]:
        """Every online device of the session's cluster (asked of its broker), a tuple
        (2025.12's; 2024.12 said a list)."""
        session = self._namespace.session
        return tuple(session.devices()) if hasattr(session, "devices") else (session.device,)

    def default_dtypes(self, *, device: Device | None = None) -> dict[str, np.dtype]:
        """The default dtypes, the same on every device: float64, complex128, int64."""
        return dict(DEFAULT_DTYPES)

    def dtypes(self, *, device: Device | None = None,
               kind: str | tuple[str, ...] | None = None) -> dict[str, np.dtype]:
        """The standard's dtypes a device holds (all thirteen, on every device), or those of
        ``kind``."""
        return {name: dtype for name, dtype in DTYPES.items()
                if kind is None or isdtype(dtype, kind)}


class ArrayAPINamespace:
    """The array API standard's namespace (2025.12) bound to one session: use
    ``t.__array_namespace__()`` or ``fabric.array_api.namespace(session)``."""

    __name__ = "fabric.array_api"
    __array_api_version__ = API_VERSION
    linalg: ModuleType = linalg

    def __init__(self, session: Any) -> None:
        self.session = session

    def __eq__(self, other: object) -> builtins.bool:
        return type(other) is ArrayAPINamespace and other.session is self.session

    def __hash__(self) -> int:
        return hash((ArrayAPINamespace, id(self.session)))

    def __repr__(self) -> str:
        return f"<fabric.array_api namespace of {self.session!r}>"

    @property
    def fft(self) -> FFT:
        """The ``fft`` extension: numpy's transforms on the device, and frequencies made on
        this namespace's."""
        return FFT(self)

    def __array_namespace_info__(self) -> Info:
        """The namespace's capabilities, devices and dtypes."""
        return Info(self)

    def session_on(self, device: Any) -> Any:
        """The session that makes tensors on ``device`` (None: this namespace's): this one, or
        one over its connection, opened once and closed with it."""
        session = self.session
        if device is None:
            return session
        if not isinstance(device, Device):  # (first: a tensor's == would be an op)
            raise TypeError(f"device= takes a device of the cluster (t.device, or one of "
                            f"xp.__array_namespace_info__().devices()), not {named(device)}; "
                            "'cpu' only in t.to_device('cpu'), which reads the tensor.")
        if device == session.device:
            return session
        opener = _OPENED_BY.get(session)
        root = session if opener is None or opener() is None else opener()
        if device == root.device:
            return root
        for mesh in getattr(root, "meshes", ()):
            for other in mesh.sessions:
                if other.device == device:
                    return other
        if not hasattr(root, "mesh"):
            raise ValueError("A traced function's tensors live on its own device: leave "
                             "device= out inside it.")
        opened = root.mesh([device.index]).sessions[0]
        _OPENED_BY[opened] = weakref.ref(root)
        return opened

    # -- creation ------------------------------------------------------------------------------

    def asarray(self, obj: Any, /, *, dtype: Any = None, device: Device | None = None,
                copy: builtins.bool | None = None) -> Tensor:
        """``obj`` (a tensor, a numpy array, nested lists, a Python scalar, a buffer) as a
        tensor on ``device``, its dtype by the standard's defaults (bool, int64, float64,
        complex128) without ``dtype``. An upload, or a move between devices, is a copy:
        ``copy=False`` takes only a tensor already there, of the dtype asked."""
        session = obj.session if device is None and isinstance(obj, Tensor) \
            else self.session_on(device)
        wanted = None if dtype is None else dtype_of(dtype)
        if isinstance(obj, Tensor):
            moved = obj.session is not session
            if copy is False and (moved or wanted not in (None, obj.dtype)):
                raise ValueError("asarray(copy=False) cannot move a tensor to another device "
                                 "or change its dtype without a copy: leave copy= out.")
            obj = obj.to(session)
            if wanted is not None and wanted != obj.dtype:
                return obj.astype(wanted)
            return obj.copy() if copy and not moved else obj
        if copy is False:
            raise ValueError("asarray(copy=False) cannot upload without a copy: leave copy= "
                             "out.")
        return session.asarray(obj, wanted)

    def from_dlpack(self, x: Any, /, *, device: Device | None = None,
                    copy: builtins.bool | None = None) -> Tensor:
        """An array of another library (a DLPack producer: numpy, torch, ...) uploaded."""
        if isinstance(x, Tensor):
            return self.asarray(x, device=device, copy=copy)
        return self.asarray(np.from_dlpack(x), device=device, copy=copy)

    def zeros(self, shape: Shape, *, dtype: Any = None, device: Device | None = None) -> Tensor:
        """A tensor of zeros (float64 without ``dtype``), made on the device."""
        return self.session_on(device).zeros(shape, _or_default(dtype))

    def ones(self, shape: Shape, *, dtype: Any = None, device: Device | None = None) -> Tensor:
        """A tensor of ones (float64 without ``dtype``), made on the device."""
        return self.session_on(device).ones(shape, _or_default(dtype))

    def empty(self, shape: Shape, *, dtype: Any = None, device: Device | None = None) -> Tensor:
        """A tensor of whatever its memory held (float64 without ``dtype``)."""
        return self.session_on(device).empty(shape, _or_default(dtype))

    def full(self, shape: Shape, fill_value: complex, *, dtype: Any = None,
             device: Device | None = None) -> Tensor:
        """A tensor of ``fill_value``, its dtype the value's default (bool, int64, float64,
        complex128) without ``dtype``."""
        return _full(self.session_on(device), shape, fill_value, dtype)

    def zeros_like(self, x: Tensor, /, *, dtype: Any = None,
                   device: Device | None = None) -> Tensor:
        """Zeros of ``x``'s shape and dtype (or ``dtype``), on ``x``'s device (or ``device``)."""
        return self._like(x, "zeros", device).zeros(x.shape, _or(dtype, x))

    def ones_like(self, x: Tensor, /, *, dtype: Any = None,
                  device: Device | None = None) -> Tensor:
        """Ones of ``x``'s shape and dtype (or ``dtype``), on ``x``'s device (or ``device``)."""
        return self._like(x, "ones", device).ones(x.shape, _or(dtype, x))

    def empty_like(self, x: Tensor, /, *, dtype: Any = None,
                   device: Device | None = None) -> Tensor:
        """An uninitialised tensor of ``x``'s shape and dtype (or ``dtype``)."""
        return self._like(x, "empty_like", device).empty(x.shape, _or(dtype, x))

    def full_like(self, x: Tensor, /, fill_value: complex, *, dtype: Any = None,
                  device: Device | None = None) -> Tensor:
        """``fill_value`` in ``x``'s shape and dtype (or ``dtype``), on ``x``'s device."""
        return _full(self._like(x, "full_like", device), x.shape, fill_value, _or(dtype, x))

    def _like(self, x: Tensor, name: str, device: Device | None) -> Any:
        return tensor_argument(x, name).session if device is None else self.session_on(device)

    def arange(self, start: float, /, stop: float | None = None, step: float = 1, *,
               dtype: Any = None, device: Device | None = None) -> Tensor:
        """Values from ``start`` by ``step`` below ``stop`` (int64 where all three are ints,
        else float64, without ``dtype``)."""
        return self.session_on(device).arange(start, stop, step,
                                              None if dtype is None else dtype_of(dtype))

    def linspace(self, start: float, stop: float, /, num: int, *, dtype: Any = None,
                 device: Device | None = None, endpoint: builtins.bool = True) -> Tensor:
        """``num`` evenly spaced values from ``start`` to ``stop`` (float64 without
        ``dtype``)."""
        return self.session_on(device).linspace(start, stop, num, endpoint,
                                                dtype_of(dtype) if dtype else dtypes.float64)

    def eye(self, n_rows: int, n_cols: int | None = None, /, *, k: int = 0, dtype: Any = None,
            device: Device | None = None) -> Tensor:
        """A matrix with ones on diagonal ``k``, zeros elsewhere (float64 without
        ``dtype``). A ``k`` past the last diagonal gives zeros (numpy's, of any int)."""
        columns = n_rows if n_cols is None else n_cols
        k = builtins.max(-n_rows, builtins.min(operator.index(k), columns))  # (sent as 64 bits)
        return self.session_on(device).eye(n_rows, n_cols, k, _or_default(dtype))

    @staticmethod
    def meshgrid(*arrays: Tensor, indexing: str = "xy") -> tuple[Tensor, ...]:
        """Coordinate grids of 1-d tensors ('xy': the first two axes swapped, as numpy's), a
        tuple (2025.12's; 2024.12 said a list)."""
        grids = [tensor_argument(a, "meshgrid") for a in arrays]
        return tuple(np.meshgrid(*grids, indexing=indexing)) if grids else ()

    @staticmethod
    def tril(x: Tensor, /, *, k: int = 0) -> Tensor:
        """Each matrix with the elements above diagonal ``k`` zeroed."""
        return np.tril(tensor_argument(x, "tril"), k)

    @staticmethod
    def triu(x: Tensor, /, *, k: int = 0) -> Tensor:
        """Each matrix with the elements below diagonal ``k`` zeroed."""
        return np.triu(tensor_argument(x, "triu"), k)


def _or_default(dtype: Any) -> np.dtype:
    return dtypes.float64 if dtype is None else dtype_of(dtype)


def _or(dtype: Any, x: Tensor) -> np.dtype:
    return x.dtype if dtype is None else dtype_of(dtype)


def _full(session: Any, shape: Shape, fill_value: complex, dtype: Any) -> Tensor:
    """``session.full``, its dtype the value's default or one of the standard's."""
    if isinstance(fill_value, Tensor):
        raise TypeError("full takes fill_value as a Python scalar: use xp.broadcast_to for a "
                        "tensor.")
    return session.full(shape, fill_value, None if dtype is None else dtype_of(dtype))


# Every function and dtype of the standard's namespace, shared by every session's
for _name, _function in {**ELEMENTWISE, **OTHERS, "isdtype": dtypes.isdtype,
                         "result_type": dtypes.result_type, "can_cast": dtypes.can_cast,
                         "finfo": dtypes.finfo, "iinfo": dtypes.iinfo}.items():
    setattr(ArrayAPINamespace, _name, staticmethod(_function))
for _name, _value in {**DTYPES, "e": dtypes.e, "inf": dtypes.inf, "nan": dtypes.nan,
                      "pi": dtypes.pi, "newaxis": dtypes.newaxis}.items():
    setattr(ArrayAPINamespace, _name, _value)


def namespace(session: Any, api_version: str | None = None) -> ArrayAPINamespace:
    """The standard's namespace of ``session`` (``api_version``: one of the revisions it
    serves, 2021.12 to 2025.12; None: the latest, whose functions every earlier revision's
    callers get too, and its tuples where those said lists)."""
    if api_version is not None and api_version not in API_VERSIONS:
        raise ValueError(f"fabric.array_api serves the array API standard's revisions "
                         f"{', '.join(API_VERSIONS)}, not {api_version!r}: ask for one of "
                         "them, or None.")
    return ArrayAPINamespace(session)

