"""The standard's ``fft`` extension on tensors (``xp.fft``): numpy's ``np.fft`` on tensors
(``fabric.arrays.numpy_fft``: a transform one op, the shifts rolls) under the standard's
signatures, and ``fftfreq`` and ``rfftfreq`` made on a session's device as numpy makes them
(``arange`` times the spacing).

Rule: a transform keeps its input's precision (complex64 from float32 or complex64), as numpy
2's and the standard's; its result's shape is known at the call (``fabric.core.ops_functions``
restates numpy's lengths and errors). Nothing is read.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fabric.array_api.dtypes import dtype_of
from fabric.array_api.elementwise import tensor_argument
from fabric.arrays.tensor import Tensor
from fabric.core.ops_functions import FFTS


def _transform(name: str) -> Callable[..., Tensor]:
    transform = getattr(np.fft, name)

    def one_axis(x: Tensor, /, *, n: int | None = None, axis: int = -1,
                 norm: str = "backward") -> Tensor:
        return transform(tensor_argument(x, name), n=n, axis=axis, norm=norm)

    def axes(x: Tensor, /, *, s: Sequence[int] | None = None,
             axes: Sequence[int] | None = None, norm: str = "backward") -> Tensor:
        return transform(tensor_argument(x, name), s=s, axes=axes, norm=norm)
    function = axes if name.endswith("n") else one_axis
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"numpy's ``np.fft.{name}`` of ``x`` on the device (its input's "
                        "precision kept).")
    return function


def _shift(name: str) -> Callable[..., Tensor]:
    shift = getattr(np.fft, name)

    def function(x: Tensor, /, *, axes: int | Sequence[int] | None = None) -> Tensor:
        return shift(tensor_argument(x, name), axes)
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"``x`` rolled by half its length along ``axes`` (all with None), as "
                        f"numpy's ``np.fft.{name}``.")
    return function


FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{name: _transform(name) for name in FFTS},
    "fftshift": _shift("fftshift"), "ifftshift": _shift("ifftshift"),
}


class FFT:
    """The ``fft`` extension of one namespace (``xp.fft``): the transforms and shifts, and
    ``fftfreq``/``rfftfreq`` made on its session's devices."""

    def __init__(self, namespace: Any) -> None:
        self._namespace = namespace

    def fftfreq(self, n: int, /, *, d: float = 1.0, dtype: Any = None,
                device: Any = None) -> Tensor:
        """The sample frequencies of an ``n``-point transform with spacing ``d``."""
        session = self._namespace.session_on(device)
        middle = (n - 1) // 2 + 1
        counts = session.apply("concatenate", (session.arange(0, middle),
                                               session.arange(-(n // 2), 0)), {"axis": 0})
        return _scaled(counts, 1.0 / (n * d), dtype)

    def rfftfreq(self, n: int, /, *, d: float = 1.0, dtype: Any = None,
                 device: Any = None) -> Tensor:
        """The sample frequencies of an ``n``-point real transform (``rfft``) with spacing
        ``d``."""
        session = self._namespace.session_on(device)
        return _scaled(session.arange(0, n // 2 + 1), 1.0 / (n * d), dtype)


def _scaled(counts: Tensor, spacing: float, dtype: Any) -> Tensor:
    frequencies = counts * spacing  # (numpy's own product: int64 times a Python float)
    return frequencies if dtype is None else frequencies.astype(dtype_of(dtype))


for _name, _function in FUNCTIONS.items():
    setattr(FFT, _name, staticmethod(_function))
