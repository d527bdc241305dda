"""Reductions across a split axis, sans I/O: what each shard computes, and how it combines.

Rule: a reduction that crosses the split axis runs on each non-empty shard as
``shard_partials`` says (numpy's functions, which run a tensor's on its device), and
``combine`` joins their values, read back together, with numpy's own functions: sums of sums,
minima of minima, Chan's parallel formula for the variance (exact, not a mean of variances),
and global indexes for argmin/argmax (the first occurrence wins, as numpy's). The nan-ignoring
forms count each shard's numbers, and a shard whose slice holds only nans gives a nan the
others' numbers win over (``fmin``, ``fmax``), as numpy's nanmin ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

Shape = tuple[int, ...]
# The reductions that combine their shards' results in kind (a sum of the shards' sums), and
# how: each shard's partial by the first function, the partials joined by the second
IN_KIND: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    **{name: (getattr(np, name), getattr(np, name))
       for name in ("sum", "prod", "min", "max", "any", "all")},
    "nansum": (np.nansum, np.sum), "nanprod": (np.nanprod, np.prod),
    "nanmin": (np.fmin.reduce, np.fmin.reduce), "nanmax": (np.fmax.reduce, np.fmax.reduce),
}
SPREADS = frozenset({"var", "std", "nanvar", "nanstd"})
REDUCTIONS = frozenset(IN_KIND) | SPREADS | {"mean", "nanmean", "argmin", "argmax", "ptp"}


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


def _present(a: Any, axis: Any) -> Any:
    """How many numbers (not nans) a shard holds in each slice."""
    return np.sum(~np.isnan(a), axis=axis)


def _squares(a: Any, axis: Any, dtype: np.dtype) -> Any:
    """The sum of the squared distances of a shard's numbers from their own mean (nans
    left out; a slice of none counts 0)."""
    count = np.maximum(np.sum(~np.isnan(a), axis=axis, keepdims=True), 1)
    mean = np.nansum(a, axis=axis, dtype=dtype, keepdims=True) / count
    return np.nansum(abs(a - mean) ** 2, axis=axis, dtype=dtype)


def shard_partials(name: str, axis: Any, params: dict[str, Any],
                   dtype: np.dtype) -> Callable[[Any], list[Any]]:
    """What each shard computes for reduction ``name`` over ``axis`` with numpy's ``params``
    (``dtype``: the array's): a function of the shard, its partial results in a list."""
    acc = accumulator(dtype, params.get("dtype"))
    if name in IN_KIND:
        given = {"dtype": params["dtype"]} if params.get("dtype") is not None else {}
        reduce = IN_KIND[name][0]
        return lambda a: [reduce(a, axis=axis, **given)]
    if name == "mean":
        return lambda a: [np.sum(a, axis=axis, dtype=acc)]
    if name in ("var", "std"):
        return lambda a: [np.mean(a, axis=axis, dtype=acc), np.var(a, axis=axis, dtype=acc)]
    if name == "nanmean":
        return lambda a: [np.nansum(a, axis=axis, dtype=acc), _present(a, axis)]
    if name in ("nanvar", "nanstd"):
        return lambda a: [np.nansum(a, axis=axis, dtype=acc), _present(a, axis),
                          _squares(a, axis, acc)]
    if name == "ptp":
        return lambda a: [np.max(a, axis=axis), np.min(a, axis=axis)]
    extreme = np.min if name == "argmin" else np.max
    index = np.argmin if name == "argmin" else np.argmax
    return lambda a: [index(a, axis=axis), extreme(a, axis=axis)]


def _stacked(values: list[np.ndarray], parts: Parts, dtype: Any = None) -> np.ndarray:
    if not values:  # (no shard took part: the split axis is empty)
        return np.empty((0,) + parts.out_shape, parts.dtype if dtype is None else dtype)
    return np.stack([np.asarray(v) for v in values])


def combine(name: str, values: list[list[np.ndarray]], parts: Parts,
            params: dict[str, Any]) -> np.ndarray:
    """The result of reduction ``name`` from the shards' partial results (``values[i]``:
    shard i's, in ``shard_partials``' order), of shape ``parts.out_shape``."""
    first = _stacked([v[0] for v in values], parts)
    if name in IN_KIND:
        extra = {key: params[key] for key in ("dtype", "initial") if params.get(key) is not None}
        return IN_KIND[name][1](first, axis=0, **extra)
    if name == "mean":
        return first.sum(axis=0) / max(int(parts.counts().sum()), 0)
    if name == "ptp":  # (the largest maximum less the least minimum)
        return first.max(axis=0) - _stacked([v[1] for v in values], parts).min(axis=0)
    counts = parts.counts() if not name.startswith("nan") else _stacked(
        [v[1] for v in values], parts, np.intp)
    with np.errstate(invalid="ignore", divide="ignore"):  # (a slice of no numbers: nan)
        if name == "nanmean":
            return first.sum(axis=0) / counts.sum(axis=0)
        if name in ("var", "std"):  # (from each shard's mean and variance)
            sums, squares = counts * first, counts * _stacked([v[1] for v in values], parts)
        elif name in SPREADS:
            sums, squares = first, _stacked([v[2] for v in values], parts)
        else:
            return _global_index(name, values, parts, params.get("axis") is None)
        variance = _chan(counts, sums, squares, params.get("ddof", 0), name.startswith("nan"))
    return np.sqrt(variance) if name.endswith("std") else variance


def _chan(counts: np.ndarray, sums: np.ndarray, squares: np.ndarray, ddof: int,
          nan_ignoring: bool) -> np.ndarray:
    """Chan, Golub and LeVeque's pairwise update, all shards at once: the sum of squared
    deviations is each shard's own plus its count times its mean's squared distance from the
    whole mean. (numpy's variance of too few: var's is inf, or nan for none; nanvar's nan.)"""
    total = counts.sum(axis=0)
    means = sums / np.maximum(counts, 1)
    mean = sums.sum(axis=0) / total
    pooled = squares.sum(axis=0) + (counts * abs(means - mean) ** 2).sum(axis=0)
    freedom = total - ddof
    variance = pooled / np.maximum(freedom, 0)
    return np.where(freedom > 0, variance, np.nan) if nan_ignoring else variance


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


def comoments(counts: np.ndarray, sums: np.ndarray, squares: np.ndarray) -> np.ndarray:
    """Chan's update of ``_chan`` for a covariance: the sum of the products of deviations
    from the whole mean, from each shard's row count, column sums and products of deviations
    from its own mean (``squares[i]``, a Gram matrix); each shard adds its count times the
    outer product of its mean's deviation from the whole mean (conjugated on the right, as
    numpy's cov)."""
    total = counts.sum()
    means = sums / np.maximum(counts, 1)[:, None]
    deviations = means - sums.sum(axis=0) / max(int(total), 1)
    return squares.sum(axis=0) + np.einsum("p,pj,pk->jk", counts, deviations,
                                           deviations.conj())
