"""numpy's indexes on tensors, sans I/O: what an index holds, and what it makes.

Rule: an index is whatever numpy takes (ints, slices, ``...``, None, boolean and integer
arrays: numpy's, lists, tensors); ``prepare_index`` splits it into the items that travel in
the op's params (``fabric.core.wire.encode_index``) and the arrays that travel as the op's
arguments, each standing in the items as an ``IndexArray``. Numpy's rules decide the rest:
the result's shape is inferred by indexing a stand-in (``fabric.core.op_indexing``), so a bad
index raises numpy's error at the call. An error names an index array by its shape and dtype,
never by its values (an index may hold millions of them). A shape given to an op
(``reshape``, the creation functions) is taken as numpy takes one, by ``as_shape``.
"""

from __future__ import annotations

import operator
from typing import Any, NamedTuple

import numpy as np

from fabric.core.errors import named
from fabric.core.op_indexing import IndexArray, selects_by_data
from fabric.core.op_rules import Spec


class PreparedIndex(NamedTuple):
    """An index taken apart: ``items`` (ints, slices, None, ``...`` and ``IndexArray``s)
    and the ``arrays`` those stand for (tensors, and numpy arrays to upload)."""

    items: tuple[Any, ...]
    arrays: list[Any]

    @property
    def data_dependent(self) -> bool:
        """Whether a boolean tensor selects: the result's shape is known only on the device."""
        return selects_by_data(self.arrays)

    def is_view(self, ndim: int) -> bool:
        """Whether numpy's result shares the indexed array's memory: a basic index (a 0-d
        integer array counts as an int, as numpy takes it) that leaves at least one
        dimension or names one with ``...`` or None (all ints give numpy's scalar, a copy)."""
        ints = 0
        for item in self.items:
            if type(item) is IndexArray:
                array = self.arrays[item.position]
                if array.shape or array.dtype == np.bool_:
                    return False  # an advanced index: numpy copies
                ints += 1
            elif type(item) is int:
                ints += 1
            else:  # a slice, None or ...: numpy's result is an array
                return True
        return ints < ndim


def as_shape(shape: Any) -> tuple[int, ...]:
    """A shape as numpy takes one: an integer or a sequence of them (numpy's too, not floats)."""
    try:
        return (operator.index(shape),)
    except TypeError:
        pass
    try:
        return tuple(operator.index(n) for n in shape)
    except TypeError:
        raise TypeError("expected a sequence of integers or a single integer, got "
                        f"{named(shape)}") from None


def describe(item: Any) -> str:
    """An index item as an error names it: an array by shape and dtype, never its values."""
    shape, dtype = getattr(item, "shape", None), getattr(item, "dtype", None)
    if shape is not None and dtype is not None:
        return f"an index array of shape {tuple(shape)} and dtype {dtype}"
    return f"an index of type {type(item).__name__}"


def _slice_part(part: Any) -> int | None:
    # numpy takes None, ints, and anything with __index__ (a 0-d integer tensor: a read)
    if part is None or type(part) is int:
        return part
    try:
        return operator.index(part)
    except TypeError:
        raise TypeError("slice indices must be integers or None or have an __index__ "
                        f"method, not {describe(part)}") from None


def _as_index_array(item: Any) -> np.ndarray:
    # A list, a tuple inside the index, a bool or a numpy array: numpy's array of it; an
    # empty list is an empty integer index, as numpy takes it.
    array = np.asarray(item)
    if array.size == 0 and array.dtype == np.float64 and not isinstance(item, np.ndarray):
        array = array.astype(np.intp)
    return array


def basic_index_key(index: Any) -> tuple[Any, ...] | None:
    """``index`` as a hashable key where it is basic, made of ints, None, ``...`` and slices
    of ints (whose result's shape and wire form follow from the indexed shape alone); None
    for any other index."""
    key: list[Any] = []
    for item in index if type(index) is tuple else (index,):
        kind = type(item)
        if kind is slice:
            parts = (item.start, item.stop, item.step)
            for part in parts:
                if part is not None and type(part) is not int:
                    return None
            key.append(parts)
        elif kind is int or item is None or item is Ellipsis:
            key.append(item)
        else:
            return None
    return tuple(key)


class Remembered(dict):  # type: ignore[type-arg]
    """What was inferred for a key (a shape and a ``basic_index_key``, ...), kept for the
    next op with that key (a loop indexes the same way each step); emptied when full, as
    keys are many where shapes are."""

    KEPT = 4096

    def remember(self, key: Any, value: Any) -> None:
        """Keep ``value`` for ``key`` (None: nothing is kept)."""
        if key is None:
            return
        if len(self) >= self.KEPT:
            self.clear()
        self[key] = value


def update_key(target: Spec, index: Any, value: Any) -> tuple[Any, ...] | None:
    """The key under which ``target[index] = value``'s params are remembered: the target's
    shape and dtype, the basic index and the value's shape and dtype (a tensor of the
    target's session) or its type and value (a Python scalar, whose value numpy's casting
    checks); None where anything else is given."""
    basic = basic_index_key(index)
    if basic is None:
        return None
    if isinstance(value, Spec):
        if getattr(value, "session", None) is not getattr(target, "session", False):
            return None
        return (target.shape, target.dtype, basic, value.shape, value.dtype)
    if type(value) in (float, int, bool, complex):
        return (target.shape, target.dtype, basic, type(value), value)
    return None


def prepare_index(index: Any) -> PreparedIndex:
    """``index`` (what ``t[index]`` was given) taken apart, or numpy's IndexError for what is
    not an index, naming it by type, shape and dtype."""
    items: list[Any] = []
    arrays: list[Any] = []
    for item in index if type(index) is tuple else (index,):
        if item is None or item is Ellipsis or type(item) is int:
            items.append(item)
            continue
        if isinstance(item, slice):
            items.append(slice(_slice_part(item.start), _slice_part(item.stop),
                               _slice_part(item.step)))
            continue
        if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
            items.append(int(item))
            continue
        if not isinstance(item, Spec):  # (a tensor is an array of its own)
            if isinstance(item, (list, tuple, np.ndarray, bool, np.bool_)):
                item = _as_index_array(item)
                if item.ndim == 0 and item.dtype.kind in "iu":  # numpy takes it as an int
                    items.append(int(item))
                    continue
            else:
                raise IndexError(f"{describe(item)[0].upper()}{describe(item)[1:]} is not "
                                 "an index: only integers, slices (`:`), ellipsis (`...`), "
                                 "numpy.newaxis (`None`) and integer or boolean arrays (numpy "
                                 "arrays, lists or tensors) are valid indices.")
        if item.dtype.kind not in "iub":
            raise IndexError("arrays used as indices must be of integer (or boolean) type, "
                             f"not {describe(item)}")
        items.append(IndexArray(len(arrays)))
        arrays.append(item)
    return PreparedIndex(tuple(items), arrays)
