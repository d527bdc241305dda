"""Combined reductions (a reduction across a split axis, ``X.T @ X``) between their shards'
partial results and their use, sans the tensor class: how their partials are read, and how an
elementwise op of them waits for that read instead of making it.

Rule: combining takes every device's partial results, so the client reads them (one read per
device, in parallel) and combines them with numpy; no device may take another's results but by
a move worker to worker, whose steps wait on the client twice for each device it sends to (a
read waits once for each it reads from). So a combined result stays unread until a device or
the program needs its value, and an elementwise op whose operands are all such results (or
Python scalars) is composed with their combines, on the client, when that read comes: the
``if xp.isfinite(xp.sum(X)):`` that scikit-learn's validation asks, or its PCA's
``C -= n * mean[:, None] * mean[None, :]; C /= n - 1`` before ``eigh(C)``, read each partial
once, together. The read takes each device's partials of one dtype in one array, concatenated
there, and the value, once combined, is kept: a second read reads nothing.
"""

from __future__ import annotations

import collections
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from fabric.arrays.tensor import Tensor

Partials = list[list[Tensor]]  # each shard's partial results
Combine = Callable[[list[list[np.ndarray]]], np.ndarray]


def is_pending(value: Any) -> bool:
    """Whether ``value`` is a sharded tensor combined from partial results that no device
    holds yet (read when its value is needed)."""
    return getattr(value, "_shards", False) is None


def composable(operands: Sequence[Any]) -> bool:
    """Whether an elementwise op of ``operands`` composes with their combines: at least one a
    combined result on no device yet, the others too or Python scalars."""
    return any(is_pending(a) for a in operands) and all(
        is_pending(a) or isinstance(a, (bool, int, float, complex)) for a in operands)


def composed(fn: Callable[..., Any], operands: Sequence[Any], out: Any = None,
             result: tuple[tuple[int, ...], np.dtype] | None = None
             ) -> tuple[tuple[int, ...], np.dtype, Partials, Combine]:
    """The shape, dtype, partials and combine of ``fn(*operands)`` (an elementwise numpy
    function; ``out``: the pending tensor it writes into, numpy's casting checked; or, where
    the ``result``'s shape and dtype are given, any function of one operand) computed on the
    client from the operands' combined values: numpy's errors come at the call, from
    zero-size stand-ins."""
    shape = np.broadcast_shapes(*[np.shape(a) for a in operands])
    stand_ins = [np.empty((0,) * a.ndim, a.dtype) if is_pending(a) else a for a in operands]
    with np.errstate(all="ignore"):
        if result is not None:
            shape, dtype = result
        elif out is None:
            dtype = np.asarray(fn(*stand_ins)).dtype
        else:
            dtype = out.dtype
            fn(*stand_ins, out=np.empty((0,) * out.ndim, out.dtype))
    # (each operand as it is now: an update in place of one later makes it another)
    taken = [(a._partials, a.dtype, a.shape) if is_pending(a) else a for a in operands]
    partials = [shard for a in taken if isinstance(a, tuple) for shard in a[0][0]]

    def combine(values: list[list[np.ndarray]]) -> np.ndarray:
        arguments, at = [], 0
        for operand in taken:
            if not isinstance(operand, tuple):
                arguments.append(operand)
                continue
            (own, own_combine), own_dtype, own_shape = operand
            arguments.append(np.asarray(own_combine(values[at:at + len(own)])).astype(
                own_dtype, copy=False).reshape(own_shape))
            at += len(own)
        return fn(*arguments)
    return shape, dtype, partials, combine


# Each device's partial results of a reduction, by what they reduce: the reduction, its
# parameters, and each shard's (session, tensor id, shape). A tensor's id names its values
# (an update in place gives the tensor a new id), so the same reduction of the same shards
# (scikit-learn's finiteness check of X at fit, and again at predict) takes the same partials,
# whose values, once read, are known: it reads nothing again. The most recent few are kept.
_REDUCED: collections.OrderedDict[tuple[Any, ...], Partials] = collections.OrderedDict()
REDUCED_KEPT = 64


# A copy's values by the tensor it copies (session, id -> session, id): a tensor's id names
# its values, so its copy's reductions are those of the id it was copied from, even after
# that tensor is updated in place (scikit-learn's check_array(X, copy=True) before each check)
_COPIES: collections.OrderedDict[tuple[Any, int], tuple[Any, int]] = collections.OrderedDict()


def _values(tensor: Tensor) -> tuple[Any, int]:
    name = (tensor.session.id, tensor.id)
    return _COPIES.get(name, name)


def same_values(copies: Sequence[Tensor], sources: Sequence[Tensor]) -> None:
    """Note that each of ``copies`` holds its source's values (of the same dtype), for
    ``reduced``; the most recent few kept."""
    for copy, source in zip(copies, sources):
        _COPIES[copy.session.id, copy.id] = _values(source)
    while len(_COPIES) > 4 * REDUCED_KEPT:
        _COPIES.popitem(last=False)


def forget_sessions(sessions: Sequence[Any]) -> None:
    """``sessions`` closed (their mesh did): what ``reduced`` and ``same_values`` keep of
    their tensors goes, and with the partials, their values read (``_READ``: shared memory
    of the connection among them)."""
    ids = {session.id for session in sessions}
    for key in [key for key in _REDUCED if any(name[0] in ids for name in key[-1])]:
        del _REDUCED[key]
    for name in [name for name in _COPIES if name[0] in ids]:
        del _COPIES[name]


def reduced(reduction: tuple[Any, ...], shards: Sequence[Tensor],
            make: Callable[[], Partials]) -> Partials:
    """The partials of ``reduction`` (its name and parameters, hashable) of ``shards``: those
    made before for the same shards' values (the shards themselves, or what they copy), else
    ``make()``'s, kept."""
    key = (*reduction, tuple((*_values(t), t.shape) for t in shards))
    found = _REDUCED.get(key)
    if found is None:
        found = _REDUCED[key] = make()
        while len(_REDUCED) > REDUCED_KEPT:
            _REDUCED.popitem(last=False)
    else:
        _REDUCED.move_to_end(key)
    return found


# The values of partial results read already, by the id of the tensor (while it lives: its
# weak reference tells it from a later one of the same id). Partial results are the mesh's
# own, never updated in place, so a result composed of another that was read since (a mask
# ``s > 0`` of ``s``, both needed on the devices by ``s[s > 0]``) reads nothing again.
_READ: dict[int, tuple[weakref.ref, np.ndarray]] = {}


def _remember(tensor: Tensor, value: np.ndarray) -> None:
    key = id(tensor)

    def forget(reference: weakref.ref) -> None:
        if _READ.get(key, (None,))[0] is reference:
            del _READ[key]
    _READ[key] = (weakref.ref(tensor, forget), value)


def _known(tensor: Tensor) -> np.ndarray | None:
    reference, value = _READ.get(id(tensor), (None, None))
    return value if reference is not None and reference() is tensor else None


def read_partials(mesh: Any, partials: Partials) -> list[list[np.ndarray]]:
    """The values of ``partials``, each read once, the reads of every device sent before any
    is waited for: a device's partials of one dtype concatenated there into one array."""
    values: dict[int, np.ndarray] = {}
    unique: dict[int, Tensor] = {}
    for shard in partials:
        for tensor in shard:
            known = _known(tensor)
            if known is not None:
                values[id(tensor)] = known
            else:
                unique.setdefault(id(tensor), tensor)
    groups: dict[tuple[int, str], list[Tensor]] = {}
    for tensor in unique.values():
        groups.setdefault((id(tensor.session), tensor.dtype.str), []).append(tensor)
    packed = [group[0] if len(group) == 1 else np.concatenate(
        [t.reshape(-1) for t in group]) for group in groups.values()]
    for group, value in zip(groups.values(), mesh.gather(packed) if packed else []):
        at = 0
        for tensor in group:
            values[id(tensor)] = value.reshape(-1)[at:at + tensor.size].reshape(tensor.shape)
            _remember(tensor, values[id(tensor)])
            at += tensor.size
    return [[values[id(tensor)] for tensor in shard] for shard in partials]
