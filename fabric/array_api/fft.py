"""The standard's ``fft`` extension on tensors (``xp.fft``): numpy's ``np.fft`` transforms run
on the device, one op each, ``fftshift`` and ``ifftshift`` as rolls, and ``fftfreq`` and
``rfftfreq`` made on a session's device as numpy makes them (``arange`` times the spacing).

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

_NORMS = ("backward", "ortho", "forward")


def _check_norm(norm: str) -> None:
    if norm not in _NORMS:
        raise ValueError(f"norm is one of {', '.join(map(repr, _NORMS))}, not {norm!r}.")


def _transform(name: str) -> Callable[..., Tensor]:
    def one_axis(x: Tensor, /, *, n: int | None = None, axis: int = -1,
                 norm: str = "backward") -> Tensor:
        x = tensor_argument(x, name)
        _check_norm(norm)
        return x.session.apply(name, (x,), {"n": n, "axis": axis, "norm": norm})

    def axes(x: Tensor, /, *, s: Sequence[int] | None = None,
             axes: Sequence[int] | None = None, norm: str = "backward") -> Tensor:
        x = tensor_argument(x, name)
        _check_norm(norm)
        return x.session.apply(name, (x,), {"s": None if s is None else list(s),
                                            "axes": None if axes is None else list(axes),
                                            "norm": norm})
    function = axes if name.endswith("n") else one_axis
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"numpy's ``np.fft.{name}`` of ``x`` on the device (its input's "
                        "precision kept).")
    return function


def _shift(name: str, sign: int) -> Callable[..., Tensor]:
    def function(x: Tensor, /, *, axes: int | Sequence[int] | None = None) -> Tensor:
        x = tensor_argument(x, name)
        if axes is None:
            axes = tuple(range(x.ndim))
        elif isinstance(axes, int):
            axes = (axes,)
        if not axes:
            return x.copy()
        return np.roll(x, [sign * (x.shape[a] // 2) for a in axes], tuple(axes))
    function.__name__ = function.__qualname__ = name
    function.__doc__ = (f"``x`` rolled by half its length along ``axes`` (all with None), as "
                        f"numpy's ``np.fft.{name}``: the zero frequency "
                        f"{'to the middle' if sign > 0 else 'back to the front'}.")
    return function


FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{name: _transform(name) for name in FFTS},
    "fftshift": _shift("fftshift", 1), "ifftshift": _shift("ifftshift", -1),
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
