"""numpy's checks of an index on a device whose module checks less (jax clamps an integer
out of bounds, CuPy wraps it): made by numpy itself, on stand-ins of the target's shape; and
whether an update's index repeats a position, where numpy stores the last of the values
given for it and CuPy (and XLA on a GPU: a scatter) any one of them.

Rule: only an index's arrays are read (copied to the host by ``to_host``, where they live on
a device), never the target's data: a stand-in holds one byte, every stride 0.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fabric.core.op_indexing import bind_index

ToHost = Callable[[Any], np.ndarray]


def stand_in(shape: tuple[int, ...]) -> np.ndarray:
    """A writable array of ``shape`` that holds one byte (every stride 0)."""
    return np.ndarray(shape, np.uint8, bytearray(1), 0, (0,) * len(shape))


def checked_index(array: Any, index: tuple[Any, ...], arrays: tuple[Any, ...], *value: Any,
                  to_host: ToHost = np.asarray) -> tuple:
    """``index`` with its arrays bound, after numpy has checked it (and the ``value`` an
    update stores there) against ``array``'s shape on stand-ins: an integer out of bounds, a
    mask of the wrong shape, a value that does not fit what a mask selects raise numpy's
    own errors."""
    if not arrays:  # (the client checked an index without arrays, and its value's shape)
        return index
    key = bind_index(index, [to_host(a) for a in arrays])
    if value:
        stand_in(array.shape)[key] = stand_in(np.shape(value[0]))
    else:
        stand_in(array.shape)[key]  # (for numpy's checks alone)
    return bind_index(index, arrays)


def fitted_value(array: Any, value: Any, index: tuple[Any, ...], arrays: tuple[Any, ...],
                 to_host: ToHost = np.asarray) -> Any:
    """An update's ``value`` without its leading lengths of one beyond the dimensions that
    ``array[index]`` selects, as numpy's assignment drops them (jax's ``.at`` refuses them)."""
    if not np.ndim(value):
        return value
    selected = np.ndim(stand_in(array.shape)[bind_index(index, [to_host(a) for a in arrays])])
    while value.ndim > selected and value.shape[0] == 1:
        value = value[0]
    return value


def repeats_a_position(shape: tuple[int, ...], key: tuple[Any, ...]) -> bool:
    """Whether ``key`` (its arrays on the host, checked) selects an element of an array of
    ``shape`` more than once: only integer arrays can, where their broadcast rows of
    coordinates (each made positive; a mask's as its ``nonzero``) repeat."""
    masks = sum(np.ndim(k) for k in key if _is_mask(k))
    free = len(shape) - masks - sum(1 for k in key if k is not None and k is not Ellipsis
                                    and not _is_mask(k))
    coordinates, integers, axis = [], False, 0
    for entry in key:
        if entry is Ellipsis:
            axis += free
        elif _is_mask(entry):  # (a 0-d one adds an axis of length 1, or 0: nothing)
            if not entry.ndim and not entry:
                return False
            coordinates.extend(np.nonzero(entry) if entry.ndim else ())
            axis += entry.ndim
        elif entry is not None:
            if isinstance(entry, np.ndarray):
                integers = True
                coordinates.append(np.where(entry < 0, entry + shape[axis], entry))
            axis += 1
    if not integers:
        return False
    rows = np.stack([c.reshape(-1) for c in np.broadcast_arrays(*coordinates)])
    return np.unique(rows, axis=1).shape[1] < rows.shape[1]


def _is_mask(entry: Any) -> bool:
    return isinstance(entry, np.ndarray) and entry.dtype == bool
