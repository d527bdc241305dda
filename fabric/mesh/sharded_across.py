"""The standard's functions that work along the split axis of a sharded tensor, where each
device needs what the devices before it hold: scans carried from shard to shard, sorts through
an explicit reshard, and ``concat`` by moves worker to worker (issue 43).

Rule: ``cumulative_sum``/``cumulative_prod`` along the split axis gather nothing: each device
scans its own block, the client reads each block's last slice (its total, one small read per
device, in parallel), runs the totals' exclusive scan, and each device adds (multiplies) the
carry of the blocks before it. ``sort``/``argsort`` along it move the array so that the axis
lies whole on each device (``x.reshard`` along another axis; a 1-d array whole on each
device), sort there and move the result back to ``x``'s split axis. ``concat`` along the split
axis moves each part of its arrays to the device whose block of the result holds it, as
``reshard`` does. Nothing passes through the client but the totals.
"""

from __future__ import annotations

import builtins
from typing import Any, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from fabric.mesh.sharded import ShardedTensor, mesh_operands, split_differently
from fabric.mesh.sharding import along, block_ranges, split_blocks
from fabric.transport.moves import move_all


def _each(x: ShardedTensor) -> list[tuple[Any, Any]]:
    """Each shard of ``x`` with its device's one-device namespace."""
    return [(t.__array_namespace__(), t) for t in x._tensors()]


def carried_scan(name: str, x: ShardedTensor, axis: int, dtype: Any = None,
                 include_initial: builtins.bool = False) -> ShardedTensor:
    """``cumulative_sum`` or ``cumulative_prod`` of ``x`` along its split ``axis``: each
    block's own scan, and the carry of the blocks before it, from their totals read (one
    slice of each device) and scanned on the client."""
    scans = [getattr(xp, name)(t, axis=axis, dtype=dtype, include_initial=include_initial
                               and i == 0) for i, (xp, t) in enumerate(_each(x))]
    live = [i for i, t in enumerate(scans) if t.shape[axis]]
    totals = x.mesh.gather([scans[i][along(axis, x.ndim, slice(-1, None))] for i in live])
    combine = np.multiply if name == "cumulative_prod" else np.add
    carry = None
    for i, total in zip(live, totals):
        if carry is not None:
            scans[i] = combine(scans[i], carry.astype(scans[i].dtype, copy=False))
        carry = total if carry is None else combine(carry, total)
    return ShardedTensor(x.mesh, scans, axis)


def sorted_across(name: str, x: ShardedTensor, axis: int, **flags: Any) -> ShardedTensor:
    """``sort`` or ``argsort`` of ``x`` along its split ``axis``, by an explicit reshard: the
    axis whole on each device (split along another axis instead; a 1-d array whole on each
    device, each sorting all of it), sorted there, and the result split along ``axis`` again
    in even blocks."""
    if x.ndim == 1:
        whole = x.reshard(None)
        ranges = block_ranges(split_blocks(x.shape[0], len(x.mesh.sessions)))
        return ShardedTensor(x.mesh, [getattr(xp, name)(t, axis=0, **flags)[start:stop]
                                      for (xp, t), (start, stop) in zip(_each(whole), ranges)],
                             0)
    other = next(d for d in range(x.ndim) if d != axis)
    moved = x.reshard(other)
    done = ShardedTensor(x.mesh, [getattr(xp, name)(t, axis=axis, **flags)
                                  for xp, t in _each(moved)], other)
    return done.reshard(axis)


def concat_along(arrays: Sequence[Any], axis: int) -> ShardedTensor:
    """``concat`` of ``arrays`` along ``axis``: on each shard where they are split alike along
    another axis; along their split axis (each split there, or replicated), each part of an
    array moved to the device whose block of the result holds it, worker to worker."""
    mesh, arrays = mesh_operands(arrays)
    split = [a for a in arrays if isinstance(a, ShardedTensor) and a.axis is not None]
    if any(not isinstance(a, ShardedTensor) for a in arrays) or any(
            a.axis != split[0].axis for a in split):
        raise TypeError("xp.concat of sharded tensors takes tensors of one mesh split along "
                        "one axis (or replicated on it): reshard them alike first "
                        "(x.reshard(axis=...)).")
    np.concatenate([np.empty(a.shape[:axis] + (0,) + a.shape[axis + 1:], a.dtype)
                    for a in arrays], axis=axis)  # (numpy's error of the shapes, at the call)
    first = split[0]
    xp0 = first._tensors()[0].__array_namespace__()
    if first.axis != axis:
        for other in arrays:
            if other.axis is None or other.sharding.blocks != first.sharding.blocks:
                raise split_differently(first, other)
        return ShardedTensor(mesh, [xp.concat(list(parts), axis=axis) for xp, parts in zip(
            [xp for xp, _ in _each(first)], zip(*[a._tensors() for a in arrays]))],
            first.axis)
    dtype = xp0.result_type(*[a.dtype for a in arrays])
    ndim, length = first.ndim, sum(a.shape[axis] for a in arrays)
    targets = block_ranges(split_blocks(length, len(mesh.sessions)))
    pieces: list[list[tuple[int, int]]] = [[] for _ in mesh.sessions]  # (start, move) each
    moves = []
    start_of = 0  # (where the array starts along the result's axis)
    for array in arrays:
        holders = array._tensors()
        for target, (start, stop) in enumerate(targets):
            sources = [(holders[target], start_of)] if array.axis is None else [
                (t, start_of + low) for t, (low, _) in zip(holders, block_ranges(
                    array.sharding.blocks))]  # (a replicated array: the target's own copy)
            for source, source_start in sources:
                low = max(source_start, start)
                high = min(source_start + source.shape[axis], stop)
                if low < high:
                    piece = source[along(axis, ndim, slice(low - source_start,
                                                           high - source_start))]
                    pieces[target].append((low, len(moves)))
                    moves.append((piece if piece.dtype == dtype else piece.astype(dtype),
                                  mesh.sessions[target]))
        start_of += array.shape[axis]
    moved = move_all(moves)  # (all at once: the devices send to each other in parallel)
    shards = []
    for (xp, _), target in zip(_each(first), pieces):
        parts = [moved[i] for _, i in sorted(target)]
        shards.append(parts[0] if len(parts) == 1 else xp.concat(parts, axis=axis) if parts
                      else xp.zeros(first.shape[:axis] + (0,) + first.shape[axis + 1:],
                                    dtype=dtype))
    return ShardedTensor(mesh, shards, axis)


def across(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ShardedTensor | None:
    """Function ``name`` of the mesh's namespace along the split axis, where this module
    runs it; None where it does not."""
    if name == "concat":
        arrays = args[0] if args else kwargs.get("arrays")
        axis = kwargs.get("axis", args[1] if len(args) > 1 else 0)
        if axis is None or not isinstance(arrays, (list, tuple)) or not arrays:
            return None
        return concat_along(arrays, normalize_axis_index(axis, np.ndim(arrays[0])))
    x = args[0] if args else kwargs.get("x")
    if not isinstance(x, ShardedTensor) or x.axis is None or len(args) > 1:
        return None
    flags = {key: value for key, value in kwargs.items() if key != "x"}
    axis = flags.pop("axis", -1 if name in ("sort", "argsort") else None)
    if axis is None:
        if x.ndim != 1:
            return None  # (the one-device function's error: it needs axis=)
        axis = 0
    axis = normalize_axis_index(axis, x.ndim)
    if axis != x.axis:
        return None
    if name in ("cumulative_sum", "cumulative_prod"):
        return carried_scan(name, x, axis, **flags)
    return sorted_across(name, x, axis, **flags)
