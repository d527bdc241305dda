"""Sharded tensors: one array across the devices of a mesh, each shard an ordinary tensor.

Rule: an op on a sharded tensor runs on each shard where it needs no data from another
device (elementwise ops and ufuncs, ``where``, reductions along other axes, indexing that
keeps the split axis whole or cuts it by a range, or by a mask split alike, and assignment so
(``fabric.mesh.sharded_selection``), ``astype``, matmul with a replicated operand); a
reduction across the split axis runs on each shard, and the partial results, read back
together, combine on the client (``fabric.mesh.reductions``), as do the products
of a contraction over the split axis (``Z.T @ Z``: ``fabric.mesh.sharded_linalg``). An op
that would need data from another device is refused with the call that moves it
(``reshard``, worker to worker): nothing is gathered to the client but by a read. Shapes and
dtypes follow numpy's rules on the client, and its errors come at the call, as for one
tensor.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index, normalize_axis_tuple

from fabric.arrays import read_target
from fabric.arrays.html_repr import blocks_svg, byte_text
from fabric.arrays.printing import summary_positions
from fabric.arrays.numpy_functions import ufunc_method_params
from fabric.arrays.tensor import Tensor, given_params, numpy_name
from fabric.core.ops import BINARY_UFUNCS, OPS, UNARY_UFUNCS, Spec
from fabric.mesh import combining, reductions
from fabric.mesh.sharding import (Sharding, along, block_positions, block_ranges, block_slices,
                                  split_blocks)
from fabric.transport.moves import move_all

Mesh = Any  # a fabric.Mesh (which imports this module: named, not imported)

_ELEMENTWISE = {ufunc.__name__ for ufunc in BINARY_UFUNCS + UNARY_UFUNCS}
_RESHARD = ("reshard it so that the axis it works along lies whole on each device "
            "(x.reshard(axis=...)), or apply it to each shard (x.shards)")


class ShardedTensor(Tensor):
    """One array split along an axis across the devices of a mesh (or replicated on each),
    made by a mesh (``mesh.asarray``, ``mesh.zeros``, ...) or by ops on sharded tensors.
    Its shape, dtype and ``sharding`` are known on the client; ``numpy()`` gathers it."""

    __array_priority__ = 2000  # above a tensor's: numpy and Python defer to this class

    def __init__(self, mesh: Mesh, shards: list[Tensor], axis: int | None) -> None:
        self.mesh = mesh
        self._shards: list[Tensor] | None = shards
        self._partials: tuple[list[list[Tensor]], Callable[..., np.ndarray]] | None = None
        first = shards[0]
        self.dtype = first.dtype
        blocks = () if axis is None else tuple(t.shape[axis] for t in shards)
        self.shape = first.shape if axis is None else \
            first.shape[:axis] + (sum(blocks),) + first.shape[axis + 1:]
        self.size = math.prod(self.shape)
        self.sharding = Sharding(axis, blocks, mesh.devices)

    @classmethod
    def combined(cls, mesh: Mesh, shape: tuple[int, ...], dtype: np.dtype,
                 partials: list[list[Tensor]],
                 combine: Callable[[list[list[np.ndarray]]], np.ndarray]) -> "ShardedTensor":
        """A reduction across the split axis: ``partials`` (each shard's tensors) combined
        when read; replicated on the mesh (one upload per device) when an op needs it there."""
        self = object.__new__(cls)
        self.mesh, self._shards, self._partials = mesh, None, (partials, combine)
        self.shape, self.dtype, self.size = shape, dtype, math.prod(shape)
        self.sharding = Sharding(None, (), mesh.devices)
        return self

    def __del__(self) -> None:
        """Nothing to free here: each shard is freed with its own handle."""

    @property
    def session(self) -> Any:
        """A sharded tensor has no one session: what asks for it needs the array on one
        device, and is refused."""
        raise TypeError(f"This op needs the whole array on one device, and {self._handle()} "
                        f"spans devices {list(self.mesh.devices)}: {_RESHARD}.")

    @property
    def axis(self) -> int | None:
        """The split axis (None: replicated)."""
        return self.sharding.axis

    @property
    def shards(self) -> list[tuple[int, Tensor]]:
        """``(device, tensor)`` for each shard, in order; each an ordinary tensor of that
        device's session (``mesh.sessions``)."""
        return list(zip(self.mesh.devices, self._tensors()))

    def _tensors(self) -> list[Tensor]:
        if self._shards is None:  # a combined reduction, needed on the devices
            values = self.numpy()
            self._shards = [session.asarray(values) for session in self.mesh.sessions]
        return self._shards

    def _fields(self) -> list[tuple[str, Any]]:
        # (no shard is made here: a combined reduction's would be read first, _tensors)
        if self._shards is None:
            held = "partial results on each device, combined on the client when read"
        else:
            held = str(self.sharding)
        return [("shape", self.shape), ("dtype", self.dtype), ("bytes", byte_text(self.nbytes)),
                ("devices", list(self.mesh.devices)), ("sharding", held)]

    def _picture(self) -> str:
        if self._shards is None:
            return ""  # (on no device yet as one array: nothing to draw)
        return blocks_svg(self.shape, self.axis, self.sharding.blocks, self.mesh.devices)

    def _handle(self) -> str:
        return (f"<fabric.ShardedTensor shape={self.shape} dtype={self.dtype} "
                f"{self.sharding}>")

    _repr_name = "sharded_tensor"

    def _shown(self) -> tuple[np.ndarray, bool]:
        """What numpy's printing shows of the whole array (``fabric.arrays.printing``): each shard
        reads the summary's part of its block, all in parallel."""
        positions = summary_positions(self.shape)
        if positions is None or self._shards is None:  # (a combined reduction: read whole)
            return self.numpy(), False
        if self.axis is None:
            return self._tensors()[0]._shown()
        reads = []
        for shard, local in zip(self._tensors(),
                                block_positions(positions[self.axis], self.sharding.blocks)):
            if local.size:
                reads.append(shard[np.ix_(*positions[:self.axis], local,
                                          *positions[self.axis + 1:])])
        return np.concatenate(self.mesh.gather(reads), axis=self.axis), True

    # -- reading -------------------------------------------------------------------------------

    def numpy(self, *, out: np.ndarray | None = None) -> np.ndarray:
        """Gather the array: every shard's read is sent before any is waited for, and the
        values are joined in order; with ``out`` (as ``Tensor.numpy`` takes it), each is
        written into its block of ``out``, straight from its worker where the block is
        contiguous there."""
        if out is not None:
            read_target.check(self, out)
        if self._partials is not None:
            partials, combine = self._partials
            value = np.asarray(combine(combining.read_partials(self.mesh, partials))).astype(
                self.dtype, copy=False).reshape(self.shape)
            self._partials = ([], lambda _: value.copy())  # (read once: kept)
            return value.copy() if out is None else read_target.fill(out, value)
        if self.axis is None:
            return self.mesh.gather(self._tensors()[:1], None if out is None else [out])[0]
        if out is None:  # (the shards' reads land in warm slots; new memory faults slower
            # under the workers' writes than under one copy)
            return np.concatenate(self.mesh.gather(self._tensors()), axis=self.axis)
        self.mesh.gather(self._tensors(), [out[along(self.axis, self.ndim, slice(*block))]
                                           for block in block_ranges(self.sharding.blocks)])
        return out

    # -- ops on each shard ---------------------------------------------------------------------

    def _on_each(self, make: Callable[[Tensor], Tensor], axis: int | None) -> "ShardedTensor":
        return ShardedTensor(self.mesh, [make(t) for t in self._tensors()], axis)

    def astype(self, dtype: Any) -> "ShardedTensor":
        """The values cast to ``dtype``, on each shard."""
        return self._on_each(lambda t: t.astype(dtype), self.axis)

    def copy(self) -> "ShardedTensor":
        """A copy of each shard, on its device."""
        copied = self._on_each(Tensor.copy, self.axis)
        combining.same_values(copied._tensors(), self._tensors())
        return copied

    def transpose(self, *axes: Any) -> "ShardedTensor":
        """The axes permuted (reversed without arguments) on each shard; the split axis
        goes where the permutation puts it."""
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        order = normalize_axis_tuple(axes, self.ndim) if axes else tuple(
            reversed(range(self.ndim)))
        if len(order) != self.ndim:
            raise ValueError("axes don't match array")
        return self._on_each(lambda t: t.transpose(order),
                             None if self.axis is None else order.index(self.axis))

    def __getitem__(self, index: Any) -> Any:
        """Basic indexing (ints, slices, None, ``...``) on each shard. The split axis kept
        whole, or cut by a slice of positive step, stays split (a slice re-shards by range,
        moving nothing); an int there gives that row's tensor, on its device; a boolean mask
        split alike along axis 0 selects on each device (``sharded_selection``). A replicated
        tensor takes every index numpy takes (replicated tensors among them), on each copy."""
        items = index if isinstance(index, tuple) else (index,)
        if self.axis is None:  # (any index numpy takes, on each device's copy)
            return ShardedTensor(self.mesh, [t[on_device(index, i, self.mesh)]
                                             for i, t in enumerate(self._tensors())], None)
        if any(not (item is None or item is Ellipsis or isinstance(item, slice))
               and not _is_int(item) for item in items):
            found = SELECTION["masked"](self, index)
            if found is not None:
                return found
            raise TypeError("A split tensor takes ints, slices, None, ... and a boolean mask "
                            "split alike along axis 0 as indexes: index with arrays the "
                            f"shards themselves (x.shards), or {_RESHARD}.")
        stand_in = np.broadcast_to(np.zeros((), self.dtype), self.shape)
        stand_in[index]  # numpy's IndexError, at the call
        items = _expanded(items, self.ndim)
        at, kept = _position(items, self.axis)
        item = items[at]
        if _is_int(item):
            row = operator.index(item) % self.shape[self.axis]
            owner = max(i for i, offset in enumerate(self.sharding.offsets)
                        if offset <= row and self.sharding.blocks[i])
            local = items[:at] + (row - self.sharding.offsets[owner],) + items[at + 1:]
            return self._tensors()[owner][local]
        selected = range(*item.indices(self.shape[self.axis]))
        if selected.step < 0:
            raise ValueError("A slice with a negative step along the split axis would move "
                             "data between devices: slice with a positive step, or reshard "
                             "along another axis first (x.reshard(axis=...)).")
        parts = block_slices(selected, self.sharding.offsets, self.sharding.blocks)
        return ShardedTensor(self.mesh, [t[items[:at] + (part,) + items[at + 1:]]
                                         for t, part in zip(self._tensors(), parts)], kept)

    def __setitem__(self, index: Any, value: Any) -> None:
        """``x[index] = value`` of a replicated tensor: on each device's copy (a replicated
        ``value`` or index gives each its own); of a split one (or of a split value or mask),
        on each device's block, by a basic index or a boolean mask split alike
        (``fabric.mesh.sharded_selection``)."""
        if SELECTION["assign_split"](self, index, value):
            return
        for i, t in enumerate(self._tensors()):
            t[on_device(index, i, self.mesh)] = on_device(value, i, self.mesh)
        self._partials = None  # (a combined reduction now holds what its copies hold)

    # -- ops along axes other than the split one -----------------------------------------------

    def _each_along(self, name: str, params: dict[str, Any], run: Callable[[Tensor], Tensor],
                    leading: int = 0, label: str | None = None) -> "ShardedTensor":
        """Op ``name`` of the table with ``params`` (the axes it works along
        ``params['axis']``, every one with None) on each shard by ``run``: refused along the
        split axis, which needs every device's block, naming the move after which it runs
        (numpy's errors first, at the call). ``leading``: the axes its result puts first (a
        quantile's); ``label``: its name in the refusal (the op's by default)."""
        shape, _ = OPS[name].infer((Spec(self.shape, self.dtype),), params)
        axis = params.get("axis")
        axes = tuple(range(self.ndim)) if axis is None else normalize_axis_tuple(axis, self.ndim)
        if self.axis is None:
            return self._on_each(run, None)
        if self.axis in axes:
            label = label or name
            along_axis = "flattened" if axis is None else f"along axis {self.axis}"
            others = [d for d in range(self.ndim) if d not in axes]
            fix = f"x.reshard(axis={others[0]})" if others else "mesh.replicate(x)"
            raise ValueError(f"{label} {along_axis} of {self._handle()} needs every device's "
                             f"block: move it so that it lies whole on each device first "
                             f"({fix}, worker to worker), then {label} that.")
        kept = len(shape) - leading == self.ndim  # (a scan's, or with keepdims)
        return self._on_each(run, leading + self.axis - (0 if kept else sum(
            a < self.axis for a in axes)))

    def _scan(self, name: str, axis: int | None, **params: Any) -> "ShardedTensor":
        """Scan or sort ``name`` along ``axis`` on each shard (``_each_along``)."""
        return self._each_along(name, {"axis": axis, **given_params(params)},
                                lambda t: getattr(np, name)(t, axis=axis, **params))

    def cumsum(self, axis: int | None = None, dtype: Any = None) -> "ShardedTensor":
        """The cumulative sum along ``axis``, on each shard (an axis other than the split one)."""
        return self._scan("cumsum", axis, dtype=dtype)

    def cumprod(self, axis: int | None = None, dtype: Any = None) -> "ShardedTensor":
        """The cumulative product along ``axis``, on each shard (not the split axis)."""
        return self._scan("cumprod", axis, dtype=dtype)

    def argsort(self, axis: int | None = -1, kind: str | None = None) -> "ShardedTensor":
        """The indices that sort along ``axis``, on each shard (not the split axis)."""
        return self._scan("argsort", axis, kind=kind)

    # -- reductions ----------------------------------------------------------------------------

    def _reduce(self, name: str, axis: Any = None, keepdims: bool = False,
                **extra: Any) -> "ShardedTensor":
        """Reduction ``name`` on each shard, where it keeps the split axis; across it, each
        shard's partial results combined (``fabric.mesh.reductions``), or, for a reduction
        that cannot combine, refused (``_each_along``)."""
        if extra.pop("out", None) is not None or extra.pop("where", True) is not True:
            raise TypeError(f"{name} of a sharded tensor takes neither out= nor where=: "
                            "mask with np.where(mask, x, identity) first, and assign the "
                            "result where you need it.")
        axis = tuple(axis) if isinstance(axis, list) else axis
        params = {"axis": axis, "keepdims": keepdims, **given_params(extra)}
        axes = tuple(range(self.ndim)) if axis is None else normalize_axis_tuple(axis, self.ndim)
        if self.axis is None or self.axis not in axes or name not in reductions.REDUCTIONS:
            return self._each_along(name, params,
                                    lambda t: t._reduce(name, axis, keepdims, **extra))
        shape, dtype = OPS[name].infer((Spec(self.shape, self.dtype),), params)  # numpy's error
        live = [(t, offset) for t, offset, block in zip(
            self._tensors(), self.sharding.offsets, self.sharding.blocks) if block]
        partials = reductions.shard_partials(name, axis, params, self.dtype)
        parts = reductions.Parts(
            shapes=tuple(t.shape for t, _ in live), offsets=tuple(o for _, o in live),
            axis=self.axis, shape=self.shape, axes=axes,
            out_shape=tuple(n for d, n in enumerate(self.shape) if d not in axes), dtype=dtype)
        made = combining.reduced((name, repr(params), self.dtype.str), [t for t, _ in live],
                                 lambda: [partials(t) for t, _ in live])
        return ShardedTensor.combined(self.mesh, shape, dtype, made, lambda values:
                                      reductions.combine(name, values, parts, params))

    # -- numpy interoperability ------------------------------------------------------------

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if "out" in kwargs:
            return _in_place(ufunc, method, inputs, kwargs)
        if method in ("reduce", "accumulate") and ufunc.__name__ in _ELEMENTWISE:
            return _ufunc_method(ufunc, method, *inputs, **kwargs)
        if method != "__call__" or kwargs or not (
                ufunc.__name__ in _ELEMENTWISE or ufunc is np.matmul):
            raise TypeError(f"numpy.{ufunc.__name__}"
                            f"{'' if method == '__call__' else '.' + method} is not supported "
                            f"on sharded tensors: {_RESHARD}.")
        if ufunc is np.matmul:
            return FUNCTIONS[np.matmul](*inputs)
        return elementwise(ufunc, inputs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        handler = FUNCTIONS.get(func)
        if handler is None:
            whole = "x.shards[0][1]" if self.axis is None else \
                "x.reshard(axis=None).shards[0][1]"
            raise TypeError(f"{numpy_name(func)} is not supported on sharded tensors: it "
                            "needs the whole array on one device. Call it on one device's "
                            f"whole copy ({whole}: moved worker to worker) or on each shard "
                            "(x.shards).")
        return handler(*args, **kwargs)

    def __matmul__(self, other: Any) -> "ShardedTensor":
        return FUNCTIONS[np.matmul](self, other)

    def __rmatmul__(self, other: Any) -> "ShardedTensor":
        return FUNCTIONS[np.matmul](other, self)

    def __divmod__(self, other: Any) -> tuple["ShardedTensor", "ShardedTensor"]:
        return elementwise(np.floor_divide, (self, other)), elementwise(np.remainder,
                                                                         (self, other))

    def rebalance(self) -> "ShardedTensor":
        """This array in ``array_split`` blocks along its split axis again (a slice may have
        left them uneven), moved worker to worker."""
        return self.reshard(self.axis)

    def reshard(self, axis: int | None = 0) -> "ShardedTensor":
        """This array split along ``axis`` in ``array_split`` blocks over the same devices
        (None: whole on each), each piece sent worker to worker (``Tensor.to``), never
        through the client. Resharding along the split axis rebalances uneven blocks."""
        tensors, ndim = self._tensors(), self.ndim
        if axis is not None:
            axis = normalize_axis_index(operator.index(axis), ndim)
            if axis == self.axis and self.sharding.blocks == split_blocks(
                    self.shape[axis], len(tensors)):
                return self
        if self.axis is None:  # each device keeps its own part of its copy
            return self if axis is None else ShardedTensor(self.mesh, [
                t[along(axis, ndim, slice(*bounds))] for t, bounds in zip(
                    tensors, block_ranges(split_blocks(self.shape[axis], len(tensors))))], axis)
        targets = [(0, self.shape[self.axis])] * len(tensors) if axis is None else \
            block_ranges(split_blocks(self.shape[axis], len(tensors)))
        wanted: list[list[int]] = []  # each target's pieces, in order, as indexes of moves
        moves = []
        for session, (start, stop) in zip(self.mesh.sessions, targets):
            pieces = []
            for source, (first, end) in zip(tensors, block_ranges(self.sharding.blocks)):
                if axis == self.axis:  # the part of this block the target range holds
                    low, high = max(start, first), min(stop, end)
                    if low >= high:
                        continue
                    piece = source[along(axis, ndim, slice(low - first, high - first))]
                else:
                    piece = source if axis is None else source[along(axis, ndim,
                                                                     slice(start, stop))]
                pieces.append(len(moves))
                moves.append((piece, session))
            wanted.append(pieces)
        moved = move_all(moves)  # (all at once: the devices send to each other in parallel)
        shards = []
        for own, indexes in zip(tensors, wanted):
            pieces = [moved[i] for i in indexes]
            shards.append(own[along(self.axis, ndim, slice(0, 0))] if not pieces
                          else pieces[0] if len(pieces) == 1
                          else np.concatenate(pieces, axis=self.axis))
        return ShardedTensor(self.mesh, shards, axis)


def _is_int(item: Any) -> bool:
    return not isinstance(item, (bool, np.bool_)) and isinstance(item, (int, np.integer))


def _expanded(items: tuple[Any, ...], ndim: int) -> tuple[Any, ...]:
    """A basic index with its ``...`` (or the missing trailing axes) as whole slices."""
    taken = sum(item is not None and item is not Ellipsis for item in items)
    whole = (slice(None),) * (ndim - taken)
    if Ellipsis not in items:
        return items + whole
    at = items.index(Ellipsis)
    return items[:at] + whole + items[at + 1:]


def _position(items: tuple[Any, ...], axis: int) -> tuple[int, int]:
    """Where the index item of array axis ``axis`` is among ``items``, and which axis of
    the result that axis becomes."""
    dimension = result = 0
    for at, item in enumerate(items):
        if item is None:
            result += 1
            continue
        if dimension == axis:
            return at, result
        dimension += 1
        result += not _is_int(item)
    raise AssertionError("an expanded index covers every axis")


def mesh_operands(args: Sequence[Any]) -> tuple[Mesh, list[Any]]:
    """The mesh of the sharded operands, and the operands, numpy's arrays and lists made
    arrays; a tensor of one device refused."""
    mesh = None
    operands = []
    for arg in args:
        if isinstance(arg, ShardedTensor):
            if mesh is not None and arg.mesh is not mesh:
                raise ValueError(f"{arg._handle()} lives on another mesh: make both on one "
                                 "mesh (mesh.asarray(...)).")
            mesh = arg.mesh
        elif isinstance(arg, Tensor):
            raise TypeError(f"{arg._handle()} lives on one device and cannot meet a sharded "
                            "tensor: replicate it on the mesh (mesh.replicate(t)) or split it "
                            "there (mesh.asarray(t, axis=...)).")
        elif isinstance(arg, (list, tuple, np.ndarray)):
            arg = np.asarray(arg)
        operands.append(arg)
    assert mesh is not None, "numpy dispatches here only with a sharded operand"
    return mesh, operands


def split_differently(first: ShardedTensor, other: ShardedTensor) -> ValueError:
    """The error for operands that would need to be split alike."""
    return ValueError(f"The operands are split differently ({first.sharding}; "
                      f"{other.sharding}): reshard them alike first (x.reshard(axis="
                      f"{first.axis}) on each).")


def split_axis(operands: Sequence[Any], ndim: int, aligned: Callable[[Any], int]) -> int | None:
    """The result's split axis: the split operands' (each placed by ``aligned``), which must
    agree in axis and blocks; every other operand may not span it (its length there 1)."""
    split = [a for a in operands if isinstance(a, ShardedTensor) and a.axis is not None]
    if not split:
        return None
    axis = aligned(split[0])
    for other in split[1:]:
        if aligned(other) != axis or other.sharding.blocks != split[0].sharding.blocks:
            raise split_differently(split[0], other)
    for operand in operands:
        if isinstance(operand, ShardedTensor) and operand.axis is not None:
            continue
        shape = np.shape(operand)
        at = axis - (ndim - len(shape))
        if at >= 0 and shape[at] != 1:
            raise ValueError(f"An operand of shape {shape} spans the split axis of "
                             f"{split[0]._handle()}: split it alike (mesh.asarray(array, "
                             f"axis={at})), or reshard the sharded operand along another axis "
                             "(x.reshard(axis=...)).")
    return axis


def per_shard(mesh: Mesh, fn: Callable[..., Tensor], operands: Sequence[Any],
              axis: int | None) -> ShardedTensor:
    """``fn`` on each device's shards of ``operands`` (other operands as they are): the
    sharded result, split along ``axis``."""
    return ShardedTensor(mesh, [
        fn(*[a._tensors()[i] if isinstance(a, ShardedTensor) else a for a in operands])
        for i in range(len(mesh.sessions))], axis)


def on_device(value: Any, i: int, mesh: Mesh) -> Any:
    """``value`` (an operand, an index, a tuple of them) as device ``i`` of ``mesh`` holds
    it: a replicated tensor's copy there; a tensor split or of one device refused."""
    if isinstance(value, tuple):
        return tuple(on_device(item, i, mesh) for item in value)
    if isinstance(value, ShardedTensor):
        if value.axis is not None or value.mesh is not mesh:
            raise ValueError(f"{value._handle()} is split across devices (or on another mesh) "
                             "and cannot meet a replicated tensor's copies: put its whole on "
                             "each device of the one mesh first (mesh.replicate(x)).")
        return value._tensors()[i]
    if isinstance(value, Tensor):
        mesh_operands((value,))  # (its TypeError: a tensor of one device)
    return value


def _in_place(ufunc: np.ufunc, method: str, inputs: Sequence[Any],
              kwargs: dict[str, Any]) -> ShardedTensor:
    """``np.add(x, y, out=x)`` (``x += y``): an elementwise ufunc into a sharded tensor, on
    each shard in place (numpy's casting rules, on each device); ``x`` split as the operands
    are, or replicated with them."""
    out = kwargs.pop("out")
    out = out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if method != "__call__" or kwargs or ufunc.__name__ not in _ELEMENTWISE or not isinstance(
            out, ShardedTensor):
        raise TypeError("Sharded tensors are updated in place only by an elementwise op into "
                        "a sharded tensor (x += y, np.add(x, y, out=x)): write x = x @ y (a "
                        "new sharded tensor) for the others.")
    if np.broadcast_shapes(out.shape, *[np.shape(a) for a in inputs]) != out.shape:
        raise ValueError(f"non-broadcastable output operand with shape {out.shape} doesn't "
                         "match the broadcast shape of the inputs")
    if combining.is_pending(out) and combining.composable(inputs):  # (on the client, when read)
        _, _, partials, combine = combining.composed(ufunc, inputs, out=out)
        out._partials = (partials, combine)
        return out
    elementwise(lambda *each: ufunc(*each[:-1], out=each[-1]), (*inputs, out))
    out._partials = None  # (a combined reduction now holds what its copies hold)
    return out


def elementwise(fn: Callable[..., Any], args: Sequence[Any]) -> ShardedTensor:
    """An elementwise op (a ufunc, ``np.where``) on sharded tensors alike, replicated ones,
    scalars and arrays that do not span the split axis: run on each shard."""
    mesh, operands = mesh_operands(args)
    shape = np.broadcast_shapes(*[np.shape(a) for a in operands])  # numpy's error, at the call
    if combining.composable(operands):  # (combined results, on no device yet: when read)
        return ShardedTensor.combined(mesh, *combining.composed(fn, operands))
    axis = split_axis(operands, len(shape), lambda a: a.axis + len(shape) - a.ndim)
    return per_shard(mesh, fn, operands, axis)


# The ufuncs whose reduce is a reduction that combines across the split axis
_REDUCE_AS = {"add": "sum", "multiply": "prod", "maximum": "max", "minimum": "min",
              "logical_and": "all", "logical_or": "any"}


def _ufunc_method(ufunc: np.ufunc, method: str, a: ShardedTensor, axis: Any = 0,
                  dtype: Any = None, **kwargs: Any) -> ShardedTensor:
    """``np.add.reduce(x, axis=...)``, ``np.maximum.accumulate(x, axis=...)``: a reduce that
    is a combining reduction (``np.add.reduce``: ``sum``) combines across the split axis;
    the others run on each shard along other axes (``_each_along``)."""
    name = _REDUCE_AS.get(ufunc.__name__) if method == "reduce" else None
    if name is not None and (dtype is None or name in ("sum", "prod")):
        return a._reduce(name, axis, dtype=dtype, **kwargs)
    params = ufunc_method_params(ufunc, axis=axis, dtype=dtype, **{
        key: value for key, value in kwargs.items() if key in ("keepdims", "initial")})
    return a._each_along(f"ufunc_{method}", params, lambda t: getattr(ufunc, method)(
        t, axis=axis, dtype=dtype, **kwargs), label=f"numpy.{ufunc.__name__}.{method}")


def _where(condition: Any, *values: Any) -> ShardedTensor:
    if len(values) != 2:
        raise TypeError("np.where on sharded tensors takes a condition and two values: the "
                        "positions where a condition holds depend on the data; use the "
                        "shards' own np.nonzero (x.shards).")
    return elementwise(np.where, (condition, *values))


# Indexing by a split mask and assignment into split tensors (``masked``, ``assign_split``),
# registered by fabric.mesh.sharded_selection (which builds on this module), loaded with the
# mesh (fabric.mesh.device_mesh)
SELECTION: dict[str, Callable[..., Any]] = {}

# numpy function -> its handler on sharded tensors; fabric.mesh.sharded_linalg adds ``@`` and
# numpy's contractions, fabric.mesh.sharded_statistics its statistics, both loaded with the
# mesh (fabric.mesh.device_mesh)
FUNCTIONS: dict[Any, Callable[..., Any]] = {
    np.where: _where,
    np.cumsum: lambda a, axis=None, dtype=None: a.cumsum(axis, dtype),
    np.cumprod: lambda a, axis=None, dtype=None: a.cumprod(axis, dtype),
    np.argsort: lambda a, axis=-1, kind=None: a.argsort(axis, kind),
    np.sort: lambda a, axis=-1, kind=None: a._scan("sort", axis, kind=kind),
    np.transpose: lambda a, axes=None: a.transpose(axes) if axes is not None else a.transpose(),
    np.ndim: lambda a: a.ndim, np.shape: lambda a: a.shape,
    np.size: lambda a: a.size,
}

for _dunder, _ufunc in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                        ("truediv", np.true_divide), ("floordiv", np.floor_divide),
                        ("mod", np.remainder), ("pow", np.power), ("and", np.bitwise_and),
                        ("or", np.bitwise_or), ("xor", np.bitwise_xor),
                        ("lshift", np.left_shift), ("rshift", np.right_shift)]:
    setattr(ShardedTensor, f"__{_dunder}__",
            lambda self, other, ufunc=_ufunc: elementwise(ufunc, (self, other)))
    setattr(ShardedTensor, f"__r{_dunder}__",
            lambda self, other, ufunc=_ufunc: elementwise(ufunc, (other, self)))
for _dunder, _ufunc in [("lt", np.less), ("le", np.less_equal), ("eq", np.equal),
                        ("ne", np.not_equal), ("ge", np.greater_equal), ("gt", np.greater)]:
    setattr(ShardedTensor, f"__{_dunder}__",
            lambda self, other, ufunc=_ufunc: elementwise(ufunc, (self, other)))
for _dunder, _ufunc in [("neg", np.negative), ("pos", np.positive), ("abs", np.absolute),
                        ("invert", np.invert)]:
    setattr(ShardedTensor, f"__{_dunder}__", lambda self, ufunc=_ufunc: elementwise(ufunc,
                                                                                    (self,)))
ShardedTensor.__hash__ = object.__hash__  # type: ignore[method-assign]  # __eq__ is elementwise
