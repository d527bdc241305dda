"""numpy's statistics on sharded tensors: the reductions (``np.sum``, ``np.nanmean``,
``np.ptp``, ...), the medians and quantiles, ``np.average`` and ``np.array_equal``: handlers
registered in ``fabric.mesh.sharded.FUNCTIONS``, loaded with the mesh.

Rule: a reduction across the split axis that combines (``fabric.mesh.reductions``) runs on
each shard and combines on the client when read; one that cannot (a median, a quantile,
``nanargmin``) runs on each shard along the other axes and is refused across the split one,
naming the reshard after which it runs (``ShardedTensor._each_along``). Nothing is gathered
but by a read.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from fabric.arrays.numpy_statistics import array_equal, placed_weights
from fabric.core.ops import OPS, QUANTILES, REDUCTIONS, Spec
from fabric.mesh.sharded import FUNCTIONS, ShardedTensor, elementwise, mesh_operands


def _reduction(name: str) -> Callable[..., Any]:
    def handler(a: Any, axis: Any = None, keepdims: bool = False, **kwargs: Any) -> Any:
        if not isinstance(a, ShardedTensor):
            raise TypeError(f"numpy.{name} on sharded tensors takes one sharded tensor.")
        return a._reduce(name, axis, keepdims, **kwargs)
    return handler


def _median(name: str) -> Callable[..., Any]:
    # np.median, np.nanmedian: on each shard, along axes other than the split one
    def handler(a: ShardedTensor, axis: Any = None, keepdims: bool = False,
                **kwargs: Any) -> ShardedTensor:
        return a._each_along(name, {"axis": axis, "keepdims": keepdims}, lambda t: getattr(
            np, name)(t, axis=axis, keepdims=keepdims, **kwargs))
    return handler


def _quantile(name: str) -> Callable[..., Any]:
    # np.percentile, np.quantile and their nan-ignoring forms: as _median's, q's axes first
    def handler(a: ShardedTensor, q: Any, axis: Any = None, out: Any = None,
                overwrite_input: bool = False, method: str = "linear", keepdims: bool = False,
                **kwargs: Any) -> ShardedTensor:
        params = {"q": np.asarray(q).tolist(), "axis": axis, "method": method,
                  "keepdims": keepdims}
        return a._each_along(name, params, lambda t: getattr(np, name)(
            t, q, axis=axis, out=out, method=method, keepdims=keepdims, **kwargs),
            leading=np.ndim(q))
    return handler


def _average(a: Any, axis: Any = None, weights: Any = None, returned: bool = False, *,
             keepdims: bool = False) -> ShardedTensor:
    """numpy's weighted average: the weighted sum over the weights' sum, each reduced on
    the shards (combined across the split axis: weights that span it must be split alike,
    ``mesh.asarray(w, axis=...)``); weights that sum to zero raise ZeroDivisionError at the
    read, as numpy's at the call."""
    if returned:
        raise TypeError("numpy.average on sharded tensors takes no returned=: the weights' "
                        "sum is np.sum(w, axis=...).")
    if weights is None:
        return a.mean(axis=axis, keepdims=keepdims)
    mesh, (a, weights) = mesh_operands((a, weights))
    axis = tuple(axis) if isinstance(axis, list) else axis
    shape, dtype = OPS["average"].infer((Spec(a.shape, a.dtype), Spec(
        np.shape(weights), weights.dtype)), {"axis": axis, "keepdims": keepdims})
    if np.shape(weights) != a.shape:
        weights = placed_weights(weights, axis, a.ndim)
    weights = weights.astype(dtype)
    total = elementwise(np.multiply, (a.astype(dtype), weights)).sum(axis=axis,
                                                                     keepdims=keepdims)
    scale = np.sum(weights, axis=axis, keepdims=keepdims)
    if not isinstance(total, ShardedTensor) or total._partials is None:
        return total / scale  # (each shard's own: reduced along other axes)
    (totals, combine_totals), (scales, combine_scales) = total._partials, scale._partials

    def combine(values: list[list[np.ndarray]]) -> np.ndarray:
        split = len(totals[0])
        bottom = combine_scales([v[split:] for v in values])
        if np.any(bottom == 0):
            raise ZeroDivisionError("Weights sum to zero, can't be normalized")
        return combine_totals([v[:split] for v in values]) / bottom
    return ShardedTensor.combined(mesh, shape, dtype, [t + w for t, w in zip(totals, scales)],
                                  combine)


FUNCTIONS.update({
    **{getattr(np, name): _reduction(name) for name in REDUCTIONS},
    np.amin: _reduction("min"), np.amax: _reduction("max"),
    **{getattr(np, name): _median(name) for name in ("median", "nanmedian")},
    **{getattr(np, name): _quantile(name) for name in QUANTILES},
    np.average: _average, np.array_equal: array_equal,
})
