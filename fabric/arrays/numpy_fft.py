"""numpy's ``np.fft`` on tensors: the transforms (``fft``, ``ifft``, ``rfft``, ``irfft``,
``hfft``, ``ihfft``, their ``2`` and ``n`` forms) and ``fftshift``/``ifftshift``: NEP 18
handlers, registered in ``fabric.arrays.tensor.ARRAY_FUNCTIONS`` as
``fabric.arrays.numpy_functions``'s are.

Rule: a transform is one op of the table on the device (``fabric.core.ops_functions``: numpy's
lengths and errors at the call), keeping its input's precision as numpy 2's does (complex64
from float32); a ``2`` form is the ``n`` form over the last two axes, as numpy's; the shifts
are rolls. Nothing is read. (``fftfreq`` and ``rfftfreq`` take no array, so numpy cannot
hand them to fabric: the array API namespace's ``xp.fft.fftfreq`` makes them on a device.)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fabric.arrays.numpy_functions import no_out
from fabric.arrays.tensor import ARRAY_FUNCTIONS, Tensor
from fabric.core.ops_functions import FFTS

_NORMS = ("backward", "ortho", "forward")


def _norm(norm: str | None) -> str:
    """numpy's ``norm``: None is 'backward'; anything else not one of its three is refused
    with numpy's ValueError."""
    if norm is None:
        return "backward"
    if norm not in _NORMS:
        raise ValueError(f'Invalid norm value {norm}; should be "backward", "ortho" or '
                         '"forward".')
    return norm


def _transform(name: str, axes: Sequence[int] | None = None) -> Callable[..., Tensor]:
    """The handler of transform ``name`` (``axes``: the default axes of a ``2`` form of an
    ``n`` one)."""
    def one_axis(a: Tensor, n: int | None = None, axis: int = -1, norm: str | None = None,
                 out: Any = None) -> Tensor:
        no_out(name, out)
        return a.session.apply(name, (a,), {"n": n, "axis": axis, "norm": _norm(norm)})

    def several(a: Tensor, s: Sequence[int] | None = None,
                axes: Sequence[int] | None = axes, norm: str | None = None,
                out: Any = None) -> Tensor:
        no_out(name, out)
        return a.session.apply(name, (a,), {"s": None if s is None else list(s),
                                            "axes": None if axes is None else list(axes),
                                            "norm": _norm(norm)})
    return several if name.endswith("n") else one_axis


def shift(sign: int) -> Callable[..., Tensor]:
    """``fftshift`` (``sign`` 1: the zero frequency to the middle) or ``ifftshift`` (-1:
    back to the front): a roll by half the length along ``axes`` (every axis with None)."""
    def function(x: Tensor, axes: int | Sequence[int] | None = None) -> Tensor:
        axes = range(x.ndim) if axes is None else (axes,) if isinstance(axes, int) else axes
        axes = tuple(axes)
        if not axes:
            return x.copy()
        return np.roll(x, [sign * (x.shape[a] // 2) for a in axes], axes)
    return function


ARRAY_FUNCTIONS.update({
    **{getattr(np.fft, name): _transform(name) for name in FFTS},
    **{getattr(np.fft, f"{name}2"): _transform(f"{name}n", (-2, -1))
       for name in ("fft", "ifft", "rfft", "irfft")},
    np.fft.fftshift: shift(1),
    np.fft.ifftshift: shift(-1),
})
