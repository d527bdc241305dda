"""numpy's NaN-skipping scans on tensors (``np.nancumsum``, ``np.nancumprod``): NEP 18
handlers, registered in ``fabric.arrays.tensor.ARRAY_FUNCTIONS`` as
``fabric.arrays.numpy_functions``'s are (the NaN-skipping reductions and quantiles are ops of
the table, there). xarray's cumulative sums of floating data reach them.

Rule: numpy's own formula (``numpy/lib/_nanfunctions_impl.py``) in tensor ops, with numpy's
values and dtypes: the NaNs replaced by the scan's identity. Integer and bool tensors hold no
NaN: theirs are the plain scans. Nothing is read.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fabric.arrays.numpy_functions import no_out
from fabric.arrays.tensor import ARRAY_FUNCTIONS, Tensor


def _scan(name: str, identity: int) -> Callable[..., Tensor]:
    # np.nancumsum, np.nancumprod
    def function(a: Tensor, axis: int | None = None, dtype: Any = None,
                 out: Any = None) -> Tensor:
        no_out(f"nan{name}", out)
        filled = np.where(np.isnan(a), identity, a) if a.dtype.kind in "fc" else a
        return getattr(filled, name)(axis, dtype)
    return function


ARRAY_FUNCTIONS.update({
    np.nancumsum: _scan("cumsum", 0),
    np.nancumprod: _scan("cumprod", 1),
})
