"""Reductions across a split axis, sans I/O: what each shard computes, and how it combines.

Rule: a reduction that crosses the split axis runs on each non-empty shard as the reductions
``partial_calls`` names (ordinary tensor methods, so on the device), and ``combine`` joins
their values, read back together, with numpy's own functions: sums of sums, minima of minima,
Chan's parallel formula for the variance (exact, not a mean of variances), and global
indexes for argmin/argmax (the first occurrence wins, as numpy's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Shape = tuple[int, ...]
# The reductions that combine their shards' results in kind (a sum of the shards' sums).
IN_KIND = frozenset({"sum", "prod", "min", "max", "any", "all"})
REDUCTIONS = IN_KIND | {"mean", "var", "std", "argmin", "argmax"}


@dataclass(frozen=True)
class Parts:
    """What ``combine`` needs to know of the shards that took part, besides their values."""

    shapes: tuple[Shape, ...]  # each shard's shape
    offsets: tuple[int, ...]  # where each starts along the split axis
    axis: int  # the split axis
    shape: Shape  # the whole array's
    axes: tuple[int, ...]  # the axes reduced
    out_shape: Shape  # the result's, without keepdims
    dtype: np.dtype  # the result's

    def counts(self) -> np.ndarray:
        """Elements each shard reduced into each of its results, shaped to broadcast against
        the stacked partial results."""
        counts = [int(np.prod([shape[a] for a in self.axes])) for shape in self.shapes]
        return np.asarray(counts).reshape((-1,) + (1,) * len(self.out_shape))


def accumulator(dtype: np.dtype, given: Any) -> np.dtype:
    """The dtype numpy's mean and var accumulate ``dtype`` in: ``given``, else float64 for
    integers and bools, float32 for float16, the dtype itself otherwise."""
    if given is not None:
        return np.dtype(given)
    if dtype.kind in "biu":
        return np.dtype(np.float64)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def partial_calls(name: str, axis: Any, params: dict[str, Any],
                  dtype: np.dtype) -> list[tuple[str, dict[str, Any]]]:
    """The tensor methods (name, keywords) each shard runs for reduction ``name`` over
    ``axis`` with numpy's ``params`` (``dtype``: the array's)."""
    if name in IN_KIND:
        return [(name, {"axis": axis, **({"dtype": params["dtype"]}
                                          if params.get("dtype") is not None else {})})]
    if name == "mean":
        return [("sum", {"axis": axis, "dtype": accumulator(dtype, params.get("dtype"))})]
    if name in ("var", "std"):
        acc = accumulator(dtype, params.get("dtype"))
        return [("mean", {"axis": axis, "dtype": acc}), ("var", {"axis": axis, "dtype": acc})]
    extreme = "min" if name == "argmin" else "max"
    return [(name, {"axis": axis}), (extreme, {"axis": axis})]


def _stacked(values: list[np.ndarray], parts: Parts, dtype: Any = None) -> np.ndarray:
    if not values:  # (no shard took part: the split axis is empty)
        return np.empty((0,) + parts.out_shape, parts.dtype if dtype is None else dtype)
    return np.stack([np.asarray(v) for v in values])


def combine(name: str, values: list[list[np.ndarray]], parts: Parts,
            params: dict[str, Any]) -> np.ndarray:
    """The result of reduction ``name`` from the shards' partial results (``values[i]``:
    shard i's, in ``partial_calls``' order), of shape ``parts.out_shape``."""
    first = [v[0] for v in values]
    if name in IN_KIND:
        extra = {key: params[key] for key in ("dtype", "initial") if params.get(key) is not None}
        return getattr(np, name)(_stacked(first, parts), axis=0, **extra)
    if name == "mean":
        return _stacked(first, parts).sum(axis=0) / max(int(parts.counts().sum()), 0)
    if name in ("var", "std"):
        variance = _chan(_stacked(first, parts), _stacked([v[1] for v in values], parts),
                         parts.counts() if values else np.zeros((0,) + (1,) * len(
                             parts.out_shape), int), params.get("ddof", 0))
        return np.sqrt(variance) if name == "std" else variance
    return _global_index(name, values, parts, params.get("axis") is None)


def _chan(means: np.ndarray, variances: np.ndarray, counts: np.ndarray,
          ddof: int) -> np.ndarray:
    """Chan, Golub and LeVeque's pairwise update, all shards at once: the sum of squared
    deviations is each shard's own plus its count times its mean's squared distance from the
    whole mean."""
    total = counts.sum()
    with np.errstate(invalid="ignore", divide="ignore"):  # (an empty shard's mean is nan)
        mean = (counts * means).sum(axis=0) / total
        squares = (counts * variances).sum(axis=0) + (counts * abs(means - mean) ** 2).sum(axis=0)
    return squares / max(total - ddof, 0)


def _global_index(name: str, values: list[list[np.ndarray]], parts: Parts,
                  flat: bool) -> np.ndarray:
    """argmin/argmax along the split axis or (``flat``) over every axis: each shard's index
    made global, the best shard's kept (the first occurrence wins, nan first, as numpy's)."""
    pick = np.argmin if name == "argmin" else np.argmax
    if not flat:
        indexes = _stacked([v[0] + offset for v, offset in zip(values, parts.offsets)], parts,
                           np.intp)
        extremes = _stacked([v[1] for v in values], parts)
        best = pick(extremes, axis=0)[np.newaxis]
        return np.take_along_axis(indexes, best, axis=0)[0]
    # Over every axis: each shard's flat index as the whole array's, the least among those
    # whose value is the best (the split axis is not the first: their order is not flat order).
    indexes = []
    for (index, _), shape, offset in zip(values, parts.shapes, parts.offsets):
        position = list(np.unravel_index(int(index), shape))
        position[parts.axis] += offset
        indexes.append(np.ravel_multi_index(position, parts.shape))
    extremes = np.stack([np.asarray(v[1]) for v in values])
    best = extremes[pick(extremes)]
    ties = (extremes == best) | ((extremes != extremes) & (best != best))
    return np.asarray(min(np.asarray(indexes)[ties]), np.intp)
