"""How a sharded tensor lies on its devices, sans I/O: the split axis, the blocks, the ranges.

Rule: an axis is cut into blocks by numpy's ``array_split`` rule (``split_blocks``), here
alone; a range of a split axis (a slice) is cut into each block's part here too
(``block_slices``), so that slicing re-shards by range intersection without moving data.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Sharding:
    """How a sharded tensor lies on its mesh: split along ``axis`` in ``blocks`` (one per
    device of ``devices``, in order), or replicated (``axis`` None: a copy on each)."""

    axis: int | None
    blocks: tuple[int, ...]
    devices: tuple[int, ...]

    @property
    def replicated(self) -> bool:
        """Whether every device holds the whole array."""
        return self.axis is None

    @property
    def offsets(self) -> tuple[int, ...]:
        """Where each block starts along the split axis."""
        return tuple(itertools.accumulate(self.blocks, initial=0))[:-1]

    def __str__(self) -> str:
        if self.axis is None:
            return f"replicated on devices {list(self.devices)}"
        return (f"split along axis {self.axis} in blocks {list(self.blocks)} on devices "
                f"{list(self.devices)}")


def split_blocks(length: int, count: int) -> tuple[int, ...]:
    """numpy's ``array_split`` rule: ``length`` in ``count`` blocks, the first
    ``length % count`` of them one longer (blocks may be empty)."""
    base, longer = divmod(length, count)
    return tuple(base + 1 if i < longer else base for i in range(count))


def along(axis: int, ndim: int, index: Any) -> tuple[Any, ...]:
    """An index that applies ``index`` to ``axis`` of an ``ndim``-d array, and keeps the rest."""
    return (slice(None),) * axis + (index,) + (slice(None),) * (ndim - axis - 1)


def block_ranges(blocks: tuple[int, ...]) -> list[tuple[int, int]]:
    """Each block's [start, stop) along its axis."""
    starts = list(itertools.accumulate(blocks, initial=0))
    return list(zip(starts, starts[1:]))


def block_slices(selected: range, offsets: tuple[int, ...],
                 blocks: tuple[int, ...]) -> list[slice]:
    """The part of ``selected`` (a range of a split axis, step > 0) in each block, as a
    slice of that block (empty where they do not meet)."""
    parts = []
    for offset, block in zip(offsets, blocks):
        # the first and past-the-last positions of selected that lie in [offset, offset+block)
        first = max(0, -((selected.start - offset) // selected.step))
        last = min(len(selected), -((selected.start - offset - block) // selected.step))
        if last <= first:
            parts.append(slice(0, 0))
        else:
            start = selected[first] - offset
            parts.append(slice(start, start + (last - first - 1) * selected.step + 1,
                               selected.step))
    return parts


def block_positions(positions: np.ndarray, blocks: tuple[int, ...]) -> list[np.ndarray]:
    """The ``positions`` of a split axis that lie in each block, counted from its start."""
    return [positions[(positions >= start) & (positions < stop)] - start
            for start, stop in block_ranges(blocks)]


def joined_axis(whole: tuple[int, ...], parts: list[tuple[int, ...]],
                prefer: int | None) -> int | None:
    """The axis along which arrays of shapes ``parts`` (each shard's result) join into one
    of shape ``whole`` (the whole array's result): the parts agree with it on every other axis
    and their lengths along it add up to its. ``prefer`` wins where several axes would (one
    part, or empty axes); None where no axis does."""
    if any(len(part) != len(whole) for part in parts):
        return None
    joining = [axis for axis in range(len(whole))
               if sum(part[axis] for part in parts) == whole[axis]
               and all(part[:axis] == whole[:axis] and part[axis + 1:] == whole[axis + 1:]
                       for part in parts)]
    if not joining:
        return None
    return prefer if prefer in joining else joining[0]
