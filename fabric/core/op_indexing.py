"""numpy's indexes as ops: the shape an index selects, found on stand-ins, and how an index's
arrays travel apart from it and bind back on the device.

Rule: no check ever allocates, or loops over, the result it measures. An index with integer
arrays (a copy, as large as its arrays say: 40,000 zeros make 3.2 GB of a (1, 10000) tensor)
is applied to a stand-in of zero-byte elements, its arrays shrunk to one element each, and
their broadcast shape put back where numpy put the one element (``index_shape``). An
index's arrays are the op's inputs after its target (and values); the index itself, its
arrays replaced by ``IndexArray`` markers, is the op's param (``fabric.core.wire``).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from fabric.core.op_rules import Shape, Spec, apply_to_stand_ins, empty_stand_in, stand_in


def view_shape(op: Any, args: Sequence[Any], params: dict[str, Any]) -> Shape:
    """A view's shape (getitem, reshape, transpose, ...): the index's, or the op's own on a
    stand-in of the real shape."""
    if op.name == "getitem":
        return index_shape(args[0], args[1:], params["index"])
    return apply_to_stand_ins(op.impl, args, params, tiny=False).shape


def index_shape(target: Any, arrays: Sequence[Any], index: tuple[Any, ...]) -> Shape:
    """The shape of ``target[index]`` (its ``IndexArray`` items standing for ``arrays``),
    with numpy's errors, found without making the result or looping over it.

    numpy copies what integer arrays select, and iterates over every element it selects
    even where elements are empty; so each integer array (all of them Specs, whose values
    are zeros) is shrunk to one element of as many dimensions as their broadcast, the index
    applied to a stand-in of zero-byte elements, and the broadcast shape put back where the
    selected element stands (found by a second pass with a last dimension of 2). Boolean
    arrays (their stand-ins select nothing), arrays with real values (on the client: their
    bounds are checked) and indexes whose arrays select nothing are applied as they are,
    still to zero-byte elements."""
    shape = target.shape if isinstance(target, Spec) else np.shape(target)
    source = empty_stand_in(shape)
    spread = [a for a in arrays if isinstance(a, Spec) and a.dtype.kind in "iu"]
    if not spread or len(spread) < len(arrays):
        return getitem(source, *[stand_in(a, False) for a in arrays], index=index).shape
    try:
        together = np.broadcast_shapes(*[a.shape for a in spread])
    except ValueError:  # numpy's own IndexError, from the arrays as they are (none is built)
        return getitem(source, *[stand_in(a, False) for a in arrays], index=index).shape
    if math.prod(together) == 0 or not together:
        return getitem(source, *[stand_in(a, False) for a in arrays], index=index).shape
    ones = (1,) * len(together)
    first = getitem(source, *[empty_stand_in(ones, a.dtype) for a in arrays], index=index).shape
    marked = getitem(source, *[empty_stand_in(ones[:-1] + (2,), a.dtype) for a in arrays],
                     index=index).shape
    last = next(i for i, (one, two) in enumerate(zip(first, marked)) if one != two)
    start = last - len(together) + 1
    return (*first[:start], *together, *first[last + 1:])


def selects_by_data(arrays: Sequence[Any]) -> bool:
    """Whether an index's arrays hold a boolean tensor: how many elements it selects is known
    only on the device (its stand-in selects none)."""
    return any(isinstance(a, Spec) and a.dtype == np.bool_ for a in arrays)


class IndexArray:
    """An array in an index, standing for the op's index argument number ``position``
    (those after the target and the values): the index's other items travel in its param."""

    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position

    def __eq__(self, other: Any) -> bool:
        return type(other) is IndexArray and other.position == self.position

    def __hash__(self) -> int:
        return hash((IndexArray, self.position))


def bind_index(index: tuple[Any, ...], arrays: Sequence[Any]) -> tuple[Any, ...]:
    """``index`` with each ``IndexArray`` replaced by the array it stands for."""
    return tuple(arrays[item.position] if type(item) is IndexArray else item for item in index)


def getitem(array: np.ndarray, *arrays: Any, index: tuple[Any, ...]) -> np.ndarray:
    """``array[index]``, the index's arrays bound (the getitem op's implementation)."""
    return array[bind_index(index, arrays) if arrays else index]
