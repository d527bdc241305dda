"""Selections and updates of a split tensor that need no other device's data: boolean masks
split as the tensor is, ``nonzero``, assignment by index, and the standard's set functions
(issue 43).

Rule: a boolean mask split alike along axis 0 selects on each device from its own block, so
``x[mask]`` is split along axis 0 in blocks as uneven as the data (each device's count learned
by its own small round trip), in numpy's order; ``nonzero`` likewise, each block's row indexes
offset by where it starts. ``x[index] = value`` with a basic index cuts the index by range
into each block's local one (``sharding.block_slices``) and the value alike: a Python scalar
on each, an array or a replicated tensor cut on the client (on its device) to each block's
part, a tensor split alike by its own blocks; a mask split alike takes a scalar, a value that
does not span the selection, or a tensor split as ``x[mask]`` is; a replicated ``x`` so
assigned becomes split as the mask is, and one assigned a split value by a basic index as
the value is (each device keeps its own block of its copy, so that no copy differs: so
array-api-extra's ``pad`` runs along the split axis and off it). The set functions run on
each block, read the small per-block results together (one read per device, in parallel) and
merge them on the client with numpy (counts summed, first indexes made global and the least
taken), so their values are numpy's, sorted, NaNs each apart; an inverse stays on the devices,
each block's own mapped by the merge's (uploaded, as small as the block's distinct values).
Anything else is refused with the move after which it runs.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from fabric.array_api.functions import (UniqueAllResult, UniqueCountsResult,
                                        UniqueInverseResult)
from fabric.arrays.tensor import Tensor
from fabric.arrays.views import shares_values
from fabric.mesh.sharded import (_RESHARD, FUNCTIONS, SELECTION, ShardedTensor, _expanded,
                                 _is_int, _position, mesh_operands, on_device)
from fabric.mesh.sharding import Sharding, along, block_ranges, block_slices

SET_FUNCTIONS = ("unique_values", "unique_counts", "unique_inverse", "unique_all")


def split_mask(index: Any) -> ShardedTensor | None:
    """The boolean split tensor ``index`` is (alone, or followed by ``...``), else None."""
    items = index if isinstance(index, tuple) else (index,)
    if items and items[-1] is Ellipsis:
        items = items[:-1]
    if len(items) == 1 and isinstance(items[0], ShardedTensor) and items[0].dtype == np.bool_ \
            and items[0].axis is not None:
        return items[0]
    return None


def _alike(x: ShardedTensor, mask: ShardedTensor) -> None:
    """Refuse a mask that is not split as ``x`` along axis 0 (numpy's IndexError first)."""
    if mask.shape != x.shape[:mask.ndim] or mask.ndim == 0:
        raise IndexError(f"boolean index did not match indexed array along axis 0; size of "
                         f"axis is {x.shape[0] if x.shape else 0} but size of corresponding "
                         f"boolean axis is {mask.shape[0] if mask.shape else 0}")
    if mesh_operands((x, mask))[0] is not x.mesh or x.axis != 0 or mask.axis != 0 or \
            mask.sharding.blocks != x.sharding.blocks:
        raise TypeError(f"A mask selects from {x._handle()} on each device only where both are "
                        f"split alike along axis 0 ({mask.sharding}): {_RESHARD}, or select "
                        "with xp.where(mask, x, fill).")


def masked(x: ShardedTensor, index: Any) -> ShardedTensor | None:
    """``x[mask]`` (``x[mask, 1:3]``: basic items may follow) on each device, split along
    axis 0 in each device's count (None: the index does not start with a split mask)."""
    items = index if isinstance(index, tuple) else (index,)
    mask = split_mask(items[0]) if items else None
    if mask is None or any(not (item is None or item is Ellipsis or isinstance(item, slice))
                           and not _is_int(item) for item in items[1:]):
        return None
    _alike(x, mask)
    rest = items[1:]
    stand_in = np.broadcast_to(np.zeros((), x.dtype), x.shape[mask.ndim - 1:])
    stand_in[(slice(None), *rest)]  # (numpy's IndexError of the items after the mask)
    return ShardedTensor(x.mesh, [t[(m, *rest)] for t, m in zip(x._tensors(),
                                                                  mask._tensors())], 0)


def nonzero(x: ShardedTensor) -> tuple[ShardedTensor, ...]:
    """The indices of ``x``'s non-zero elements, one tensor per axis, split along axis 0 in
    each device's count (numpy's row-major order: ``x`` split along its axis 0)."""
    if x.axis != 0:
        raise TypeError(f"xp.nonzero of {x._handle()} gives numpy's row-major order on each "
                        f"device only when it is split along axis 0: {_RESHARD}.")
    found = [t.nonzero() for t in x._tensors()]
    found = [(first + offset, *rest) if offset else (first, *rest)
             for (first, *rest), offset in zip(found, x.sharding.offsets)]
    return tuple(ShardedTensor(x.mesh, list(each), 0) for each in zip(*found))


# -- assignment ------------------------------------------------------------------------------

def _into(region: tuple[int, ...], value: Any) -> tuple[int, ...]:
    """The shape of ``value`` as numpy broadcasts it into ``region`` (numpy's error else)."""
    shape = tuple(np.shape(value))
    while len(shape) > len(region) and shape[0] == 1:  # (numpy drops leading ones)
        shape = shape[1:]
    try:
        fits = len(shape) <= len(region) and np.broadcast_shapes(shape, region) == region
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"could not broadcast input array from shape {np.shape(value)} into "
                         f"shape {region}")
    return shape


def _value_parts(x: ShardedTensor, value: Any, region: tuple[int, ...], at: int,
                 lengths: list[int]) -> list[Any]:
    """``value`` as each device assigns it into its part of ``region`` (whose axis ``at``
    is cut in ``lengths``, one per device, in order)."""
    shape = _into(region, value)
    spanned = at - (len(region) - len(shape))  # (value's axis along the cut one)
    if isinstance(value, Tensor) and not isinstance(value, ShardedTensor):
        mesh_operands((value,))  # (its TypeError: a tensor of one device)
    if isinstance(value, ShardedTensor) and value.axis is not None:
        if value.mesh is not x.mesh or value.axis != spanned or \
                list(value.sharding.blocks) != lengths:
            raise ValueError(f"{value._handle()} is split otherwise than the part of "
                             f"{x._handle()} it is assigned to (blocks {lengths}): reshard it "
                             f"alike (x.reshard(axis=...)), or replicate it (mesh.replicate).")
        return value._tensors()
    if spanned < 0 or shape[spanned] == 1:  # (the same on each device)
        return [on_device(value, i, x.mesh) for i in range(len(lengths))]
    if isinstance(value, (list, tuple)):
        value = np.asarray(value)
    ranges = block_ranges(tuple(lengths))
    return [on_device(value, i, x.mesh)[(slice(None),) * spanned + (slice(start, stop),)]
            for i, (start, stop) in enumerate(ranges)]


def _refuse_shared_copies(x: ShardedTensor) -> None:
    """Refuse to split replicated ``x`` where another tensor sees its copies (a view of it, or
    it a view of another): each device updates only its block of its copy, so the copies
    would differ there, and that tensor would read stale values from some of them."""
    if any(shares_values(copy) for copy in x._tensors()):
        raise ValueError(f"{x._handle()} is replicated and shares its values with a view (or "
                         "is a view of another tensor), and this assignment would update each "
                         "device's block of its copy only: assign into a copy (x = x.copy()) "
                         "first, or drop the view.")


def _split_like(x: ShardedTensor, mask: ShardedTensor) -> None:
    """Make replicated ``x`` split along axis 0 as ``mask`` is, each device keeping its block
    of its copy (a view: nothing moves), so that a mask split so assigns into it on each
    device and its copies never differ."""
    if mask.shape != x.shape[:mask.ndim] or mask.mesh is not x.mesh:
        return  # (``_alike``'s error)
    _refuse_shared_copies(x)
    x._shards = [t[start:stop] for t, (start, stop) in zip(
        x._tensors(), block_ranges(mask.sharding.blocks))]
    x._partials = None
    x.sharding = Sharding(0, mask.sharding.blocks, x.mesh.devices)


def _split_for(x: ShardedTensor, index: Any, value: ShardedTensor) -> None:
    """Make replicated ``x`` split so that each device's block holds the part of the basic
    ``index``'s region that ``value``'s block there lands in (the first block also what lies
    before the region, the last what lies after), each device keeping that block of its copy
    (a view: nothing moves); refused where the region is not a contiguous range there."""
    items = index if isinstance(index, tuple) else (index,)
    region = np.broadcast_to(np.zeros((), x.dtype), x.shape)[index].shape  # (numpy's errors)
    along_region = value.axis + len(region) - len(_into(region, value))
    dimension = result = 0  # (the axis of x, and of the region, at each item)
    for item in _expanded(items, x.ndim):
        if item is None:
            result += 1
            continue
        if result == along_region and isinstance(item, slice):
            break
        dimension += 1
        result += not _is_int(item)
    else:
        raise ValueError(f"{value._handle()} is split along an axis that the index does not "
                         "slice: replicate it (mesh.replicate(value)) before assigning it.")
    selected = range(*item.indices(x.shape[dimension]))
    if selected.step != 1 or len(selected) != value.shape[value.axis]:
        raise ValueError(f"{value._handle()} is split across devices and goes into a slice of "
                         "step other than 1: replicate it (mesh.replicate(value)) first.")
    _refuse_shared_copies(x)
    blocks = list(value.sharding.blocks)
    blocks[0] += selected.start
    blocks[-1] += x.shape[dimension] - selected.stop
    x._shards = [t[along(dimension, x.ndim, slice(start, stop))] for t, (start, stop) in zip(
        x._tensors(), block_ranges(tuple(blocks)))]
    x._partials = None
    x.sharding = Sharding(dimension, tuple(blocks), x.mesh.devices)


def assign_split(x: ShardedTensor, index: Any, value: Any) -> bool:
    """``x[index] = value`` where ``x``, the mask or the value is split, on each device's
    block; False (nothing done) where all are replicated: each copy takes it."""
    if x.axis is None and split_mask(index) is None and not (
            isinstance(value, ShardedTensor) and value.axis is not None):
        return False
    assign(x, index, value)
    return True


def assign(x: ShardedTensor, index: Any, value: Any) -> None:
    """``x[index] = value`` of a split ``x`` on each device's block (the module's rule); a
    replicated ``x`` assigned by a split mask or a split value becomes split as they are."""
    mask = split_mask(index)
    if mask is None and x.axis is None:
        _split_for(x, index, value)
    if mask is not None and x.axis is None and mask.axis == 0 and x.ndim:
        _split_like(x, mask)
    if mask is not None:
        _alike(x, mask)
        trailing = x.shape[mask.ndim:]
        if np.ndim(value) > len(trailing) and np.shape(value)[-len(trailing) - 1] != 1:
            # (a value along the selection: each device's count, one small read each)
            counts = [int(n) for n in x.mesh.gather([m._reduce("sum", None, False)
                                                     for m in mask._tensors()])]
            parts = _value_parts(x, value, (sum(counts), *trailing), 0, counts)
        else:
            _into((1, *trailing), value)  # (numpy's error, at the call)
            parts = [on_device(value, i, x.mesh) for i in range(len(x.mesh.sessions))]
        for t, m, part in zip(x._tensors(), mask._tensors(), parts):
            t[m] = part
        return
    items = index if isinstance(index, tuple) else (index,)
    if any(not (item is None or item is Ellipsis or isinstance(item, slice))
           and not _is_int(item) for item in items):
        raise TypeError(f"{x._handle()} is assigned by index on each device with ints, slices, "
                        "None, ... or a boolean mask split alike along axis 0: write the new "
                        "array (xp.where(mask, value, x)), assign on each shard (x.shards), or "
                        "put its whole on each device first (mesh.replicate(x), worker to "
                        "worker), whose copies take every index numpy takes.")
    region = np.broadcast_to(np.zeros((), x.dtype), x.shape)[index].shape  # (numpy's errors)
    items = _expanded(items, x.ndim)
    at, kept = _position(items, x.axis)
    item, tensors = items[at], x._tensors()
    if _is_int(item):
        row = operator.index(item) % x.shape[x.axis]
        owner = max(i for i, offset in enumerate(x.sharding.offsets)
                    if offset <= row and x.sharding.blocks[i])
        _into(region, value)  # (numpy's error, at the call)
        if isinstance(value, ShardedTensor) and value.axis is not None:
            raise ValueError(f"{value._handle()} is split across devices and cannot go into one "
                             "row of one device: replicate it first (mesh.replicate(value)).")
        local = value if isinstance(value, Tensor) and not isinstance(value, ShardedTensor) \
            and value.session is tensors[owner].session else on_device(value, owner, x.mesh)
        # (a tensor of the row's own device, such as x[0, 1] * 3, goes in as it is)
        tensors[owner][items[:at] + (row - x.sharding.offsets[owner],) + items[at + 1:]] = local
        return
    selected = range(*item.indices(x.shape[x.axis]))
    if selected.step < 0:
        shape = _into(region, value)
        spanned = kept - (len(region) - len(shape))
        if spanned >= 0 and shape[spanned] != 1:
            raise ValueError("An array assigned along a slice of negative step of the split "
                             "axis would need reversing across devices: assign with a positive "
                             "step and the value flipped (xp.flip).")
        selected = selected[::-1]
    parts = block_slices(selected, x.sharding.offsets, x.sharding.blocks)
    lengths = [len(range(*part.indices(block))) for part, block in
               zip(parts, x.sharding.blocks)]
    values = _value_parts(x, value, region, kept, lengths)
    for t, part, length, piece in zip(tensors, parts, lengths, values):
        if length:
            t[items[:at] + (part,) + items[at + 1:]] = piece


# -- the set functions -------------------------------------------------------------------------

def _known(x: ShardedTensor, value: np.ndarray) -> ShardedTensor:
    """``value``, computed on the client, as the mesh's: uploaded to each device only when
    an op there needs it."""
    return ShardedTensor.combined(x.mesh, value.shape, value.dtype, [], lambda _: value.copy())


def unique(name: str, x: ShardedTensor) -> Any:
    """The standard's set function ``name`` of a split ``x``: each block's, merged."""
    per_block = []
    for t in x._tensors():
        found = getattr(t.__array_namespace__(), name)(t)
        per_block.append(found if isinstance(found, tuple) else (found,))
    fields = {"values": 0, "indices": 1, "counts": 3 if name == "unique_all" else 1}
    read = [0] + ([1, 3] if name == "unique_all" else [1] if name == "unique_counts" else [])
    values_of = x.mesh.gather([each[k] for each in per_block for k in read])
    block_values = [values_of[i * len(read):(i + 1) * len(read)] for i in range(len(per_block))]
    joined = np.concatenate([b[0] for b in block_values])
    values, where = np.unique(joined, return_inverse=True, equal_nan=False)
    values = values.astype(x.dtype, copy=False)
    if name == "unique_values":
        return _known(x, values)
    ends = np.cumsum([len(b[0]) for b in block_values])
    counts = np.zeros(len(values), np.int64)
    if name != "unique_inverse":
        np.add.at(counts, where, np.concatenate([b[read.index(fields["counts"])]
                                                 for b in block_values]))
    if name == "unique_counts":
        return UniqueCountsResult(_known(x, values), _known(x, counts))
    inverse = ShardedTensor(x.mesh, [
        session.asarray(where[end - len(b[0]):end])[each[-2 if name == "unique_all" else 1]]
        for session, each, b, end in zip(x.mesh.sessions, per_block, block_values, ends)],
        x.axis)
    if name == "unique_inverse":
        return UniqueInverseResult(_known(x, values), inverse)
    first = np.full(len(values), x.size, np.int64)
    for b, t, offset, end in zip(block_values, x._tensors(), x.sharding.offsets, ends):
        local = np.unravel_index(b[1].astype(np.int64), t.shape)
        position = tuple(p + offset if d == x.axis else p for d, p in enumerate(local))
        np.minimum.at(first, where[end - len(b[0]):end], np.ravel_multi_index(position,
                                                                                x.shape))
    return UniqueAllResult(_known(x, values), _known(x, first), inverse, _known(x, counts))


SELECTION.update(masked=masked, assign_split=assign_split)
FUNCTIONS[np.nonzero] = lambda a: nonzero(a) if a.axis is not None else tuple(
    ShardedTensor(a.mesh, list(each), None) for each in zip(*[t.nonzero()
                                                              for t in a._tensors()]))
