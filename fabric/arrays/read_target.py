"""A read into an array the caller already holds (``t.numpy(out=buffer)``), as cupy's
``get(out=)`` and MPI's receive into a buffer: a loop that reads into one buffer reads into
memory already faulted in, where a new array is faulted in page by page at each read.

Rule: ``out`` is checked before anything is sent (``check``): a numpy array of the tensor's
shape, writable, whose dtype takes the tensor's under numpy's ``same_kind`` casting (as
``np.copyto``). Where it is C-contiguous and of the tensor's own dtype, a large read is
written straight into it by the worker (``fabric.transport.bulk``); any other is read as
usual and copied in (``fill``).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def check(tensor: Any, out: Any) -> bool:
    """Raise TypeError or ValueError where ``out`` cannot take ``tensor``'s values (shape,
    dtype and layout as the tensor knows them); whether the values can be written straight
    into ``out`` (``direct``)."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out= takes a numpy array, not {type(out).__name__}: "
                        "np.empty(t.shape, t.dtype) makes one to read into.")
    if out.shape != tuple(tensor.shape):
        raise ValueError(f"out= has shape {out.shape}, and the tensor {tuple(tensor.shape)}: "
                         "read into an array of the tensor's shape.")
    if not out.flags.writeable:
        raise ValueError("out= is read-only: read into a writable array.")
    check_cast(tensor.dtype, out.dtype)
    return direct(tensor, out)


def check_cast(source: np.dtype, target: np.dtype, casting: str = "same_kind") -> None:
    """numpy's TypeError where ``casting`` does not take ``source`` values into ``target``
    (as ``np.copyto`` raises it)."""
    if not np.can_cast(source, target, casting):
        raise TypeError(f"Cannot cast array data from {source!r} to {target!r} according to "
                        f"the rule {casting!r}: astype() the values to {target} first.")


def direct(tensor: Any, out: np.ndarray) -> bool:
    """Whether ``tensor``'s bytes, as they are, are ``out``'s: C-contiguous, of its dtype."""
    return out.flags.c_contiguous and out.dtype == tensor.dtype


def fill(out: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``out``, holding ``values`` (a read's array; ``out`` itself where it was written
    there)."""
    if values is not out:
        np.copyto(out, values, casting="same_kind")
    return out
