"""Contractions on sharded tensors: ``@`` (``matmul``), ``np.dot``, ``np.einsum``,
``np.tensordot`` and ``np.cov``, handlers registered in ``fabric.mesh.sharded.FUNCTIONS``,
loaded with the mesh.

Rule: a contraction whose summed axis is the split one (the Gram matrix ``Z.T @ Z``, a
covariance) runs on each device's block, the other operands' same rows cut from their copy
on that device, and the small per-shard results are summed on the client when read
(``along_split``), as a sum across the split axis is; one that keeps the split axis
runs on each shard and stays split. What would need another device's rows is refused with a
call after which it runs.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from fabric.arrays.numpy_linalg import contract
from fabric.arrays.tensor import Tensor
from fabric.core.ops import OPS, Spec
from fabric.mesh import reductions
from fabric.mesh.sharded import (FUNCTIONS, Mesh, ShardedTensor, elementwise, mesh_operands,
                                 per_shard, split_axis)
from fabric.mesh.sharding import along, block_ranges


def _spec(a: Any) -> Spec:
    return Spec(a.shape, a.dtype) if isinstance(a, ShardedTensor) else \
        Spec(np.shape(a), np.asarray(a).dtype)


def _split(operands: list[Any]) -> list[ShardedTensor]:
    return [a for a in operands if isinstance(a, ShardedTensor) and a.axis is not None]


def _cut(operand: Any, axis: int | None, whole: int, bounds: tuple[int, int]) -> Any:
    """The part of ``operand`` (a replicated shard or an array) that meets a block
    ``bounds`` of a split axis of length ``whole``: its own axis ``axis`` cut there (kept
    whole where it is None, or of length 1 and so broadcast)."""
    shape = operand.shape if isinstance(operand, Tensor) else np.shape(operand)
    if axis is None or shape[axis] != whole:
        return operand
    return operand[along(axis, len(shape), slice(*bounds))]


def along_split(mesh: Mesh, fn: Callable[..., Any], operands: Sequence[Any],
                axes: Sequence[int | None], shape: tuple[int, ...], dtype: np.dtype,
                kept: int | None = None) -> ShardedTensor:
    """``fn`` on each device's block of a split axis that ``operands`` share (``axes[j]``:
    operand j's axis along it, None where it has none): the split operands' shards, and the
    same rows of the others, cut on each device from its replicated copy (or from an array),
    so nothing moves. Where the result keeps that axis (``kept``: its place there), it is
    split along it; where ``fn`` sums over it (a contraction: ``Z.T @ Z``), each non-empty
    block's product is a partial sum, combined as a sum across the split axis is
    (``fabric.mesh.reductions``)."""
    split = [(a, axis) for a, axis in zip(operands, axes)
             if isinstance(a, ShardedTensor) and a.axis is not None]
    first = split[0][0]
    for other, axis in split:
        if other.axis != axis or other.sharding.blocks != first.sharding.blocks:
            raise ValueError(f"The operands are split in different blocks ({first.sharding}; "
                             f"{other.sharding}) along the axis they share: rebalance each "
                             "(x.rebalance(), worker to worker), or put the whole of one on "
                             "each device (mesh.replicate(x)).")
    sharding = first.sharding
    whole = first.shape[first.axis]

    def block(i: int, bounds: tuple[int, int]) -> Any:
        return fn(*[a._tensors()[i] if isinstance(a, ShardedTensor) and a.axis is not None
                    else _cut(a._tensors()[i] if isinstance(a, ShardedTensor) else a, axis,
                              whole, bounds)
                    for a, axis in zip(operands, axes)])
    ranges = block_ranges(sharding.blocks)
    if kept is not None:
        return ShardedTensor(mesh, [block(i, bounds) for i, bounds in enumerate(ranges)], kept)
    live = [i for i, n in enumerate(sharding.blocks) if n]
    parts = reductions.Parts(
        shapes=tuple(first._tensors()[i].shape for i in live),
        offsets=tuple(sharding.offsets[i] for i in live), axis=first.axis, shape=first.shape,
        axes=(first.axis,), out_shape=shape, dtype=dtype)
    return ShardedTensor.combined(mesh, shape, dtype, [[block(i, ranges[i])] for i in live],
                                  lambda values: reductions.combine("sum", values, parts, {}))


def _contracted(a: Any, right: bool) -> int:
    """The axis of a matmul operand that its product sums over."""
    return np.ndim(a) - 2 if right and np.ndim(a) >= 2 else np.ndim(a) - 1 if not right else 0


def _matmul_case(left: tuple[int, int | None], right: tuple[int, int | None]) -> str | None:
    """How ``@`` runs on operands of these (dimension count, split axis or None): on each
    shard along a batch axis, the left's rows or the right's columns; as per-shard products
    summed where the axis it sums over is split; or None: refused."""
    (left_ndim, left_axis), (right_ndim, right_axis) = left, right
    split = [(ndim, axis) for ndim, axis in (left, right) if axis is not None]
    if not split:
        return "replicated"
    if all(axis < ndim - 2 for ndim, axis in split):
        return "batch"
    if (left_axis is None or left_axis == left_ndim - 1) and (
            right_axis is None or right_axis == (right_ndim - 2 if right_ndim >= 2 else 0)):
        return "contracted"
    if len(split) == 2:
        return None
    if left_axis is not None and left_ndim >= 2 and left_axis == left_ndim - 2 \
            and right_ndim <= 2:
        return "rows"
    if right_axis is not None and right_ndim >= 2 and right_axis == right_ndim - 1 \
            and left_ndim <= 2:
        return "columns"
    return None


def matmul(left: Any, right: Any) -> ShardedTensor:
    """``left @ right`` on each shard: with one operand split along an axis that is not
    summed over (the left's rows, the right's columns) and the other replicated or an array,
    or with the split operands split alike along a batch axis (the other may not span it).
    Where the axis it sums over is split (``Z.T @ Z`` of a row-split ``Z``, alike in both or
    with the other replicated), each device multiplies its blocks and the products are summed
    (``along_split``)."""
    mesh, (left, right) = mesh_operands((left, right))
    specs = [Spec(a.shape, a.dtype) if isinstance(a, ShardedTensor) else
             Spec(np.shape(a), np.asarray(a).dtype) for a in (left, right)]
    shape, dtype = OPS["matmul"].infer(specs, {})  # numpy's error, at the call
    layout = [(np.ndim(a), a.axis if isinstance(a, ShardedTensor) else None)
              for a in (left, right)]
    case = _matmul_case(*layout)
    batch = max(np.ndim(left), np.ndim(right), 2) - 2  # the result's batch axes
    if case == "batch":  # along batches: each its own
        return per_shard(mesh, np.matmul, (left, right), split_axis(
            (left, right), len(shape), lambda a: a.axis + batch - (a.ndim - 2)))
    if case == "contracted":
        return along_split(mesh, np.matmul, (left, right),
                           (_contracted(left, False), _contracted(right, True)), shape, dtype)
    if case in ("replicated", "rows", "columns"):
        return per_shard(mesh, np.matmul, (left, right), {
            "replicated": None, "rows": layout[0][1], "columns": len(shape) - 1}[case])
    whole, call, _ = _matmul_fix(*layout)
    raise ValueError(f"a @ b with a {_described(left)} and b {_described(right)} would mix "
                     f"rows of different devices: put {whole} on each device first ({call}, "
                     "worker to worker), or split both alike along the axis @ sums over "
                     "(x.reshard(axis=...)).")


def _matmul_fix(left: tuple[int, int | None], right: tuple[int, int | None]) -> tuple[
        str, str, list[tuple[int, int | None]]]:
    """Advice for a refused ``@`` that runs when followed: the first operand whose copy on
    each device makes a case of ``_matmul_case`` (both, where neither alone does), as the
    words, the call, and the layout it leads to."""
    fixes = [("the whole right operand", "mesh.replicate(b)", [left, (right[0], None)]),
             ("the whole left operand", "mesh.replicate(a)", [(left[0], None), right])]
    return next((fix for fix in fixes if _matmul_case(*fix[2])), (
        "both whole operands", "mesh.replicate(a) and mesh.replicate(b)",
        [(left[0], None), (right[0], None)]))


def _described(a: Any) -> str:
    """An operand named by its handle, or as an array (never by its values)."""
    return a._handle() if isinstance(a, ShardedTensor) else \
        f"an array of shape {np.shape(a)}"


def dot(a: Any, b: Any) -> ShardedTensor:
    """numpy's ``dot`` of sharded tensors: a scalar's product elementwise, vectors' and
    matrices' as ``@`` (summed across a split axis it sums over); of more dimensions, on each
    device where no operand is split."""
    if np.ndim(a) == 0 or np.ndim(b) == 0:
        return elementwise(np.multiply, (a, b))
    if np.ndim(a) <= 2 and np.ndim(b) <= 2:
        return matmul(a, b)
    mesh, operands = mesh_operands((a, b))
    OPS["dot"].infer([_spec(x) for x in operands], {})  # numpy's error, at the call
    if not _split(operands):
        return per_shard(mesh, np.dot, operands, None)
    raise ValueError(f"np.dot of a {len(np.shape(a))}-d and a {len(np.shape(b))}-d array with "
                     f"{_split(operands)[0]._handle()}: write it as np.einsum, whose subscripts "
                     "say which axes it sums over, or put the whole of each operand on every "
                     "device first (mesh.replicate(x), worker to worker).")


def einsum(subscripts: Any, *operands: Any, optimize: Any = False) -> ShardedTensor:
    """numpy's ``einsum`` of sharded tensors, where the split operands are split along one
    letter, alike: kept in the output, it runs on each shard (split there); summed over
    (``"ij,ik->jk"``), each device's block's result is summed on the client. Replicated
    operands and arrays that have that letter take the same rows, cut on each device."""
    if not isinstance(subscripts, str):
        raise TypeError("numpy.einsum on sharded tensors takes its subscripts as a string "
                        "('ij,ik->jk'), not as lists of axes.")
    mesh, operands = mesh_operands(operands)
    params = {"subscripts": subscripts, **({"optimize": optimize} if optimize else {})}
    shape, dtype = OPS["einsum"].infer([_spec(a) for a in operands], params)  # numpy's error

    def run(*each: Any) -> Any:
        return np.einsum(subscripts, *each, optimize=optimize)
    split = _split(operands)
    if not split:
        return per_shard(mesh, run, operands, None)
    lhs, arrow, rhs = subscripts.replace(" ", "").partition("->")
    terms = lhs.split(",")
    whole = "put the whole of each split operand but one on every device (mesh.replicate(x))"
    if "..." in lhs:
        raise ValueError(f"np.einsum with '...' and {split[0]._handle()}: spell its axes as "
                         f"letters, or {whole.replace(' but one', '')}.")
    labels = {terms[j][a.axis] for j, a in enumerate(operands)
              if isinstance(a, ShardedTensor) and a.axis is not None}
    if len(labels) > 1:
        raise ValueError(f"np.einsum {subscripts!r} has operands split along different "
                         f"letters ({', '.join(sorted(labels))}): {whole}, worker to worker.")
    label = labels.pop()
    if any(term.count(label) > 1 for term in terms):
        raise ValueError(f"np.einsum {subscripts!r} takes a diagonal along the split axis "
                         f"{label!r} of {split[0]._handle()}: {whole.replace(' but one', '')}, "
                         "or split it along another axis (x.reshard(axis=...)).")
    if not arrow:  # numpy's implicit output: the letters used once, in order
        rhs = "".join(sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1))
    return along_split(mesh, run, operands, [term.find(label) if label in term else None
                                             for term in terms], shape, dtype,
                       rhs.index(label) if label in rhs else None)


def tensordot(a: Any, b: Any, axes: Any = 2) -> ShardedTensor:
    """numpy's ``tensordot`` of sharded tensors: the paired axes summed, as the ``einsum``
    that spells it (``fabric.arrays.numpy_linalg.contract``; numpy's errors at the call)."""
    _, (a, b) = mesh_operands((a, b))
    np.tensordot(*(np.broadcast_to(np.zeros((), _spec(x).dtype), _spec(x).shape)
                   for x in (a, b)), axes)  # numpy's errors, on stand-ins of no size
    if isinstance(axes, (int, np.integer)):
        pairs = list(range(np.ndim(a) - axes, np.ndim(a))), list(range(int(axes)))
    else:
        pairs = tuple([axis] if isinstance(axis, (int, np.integer)) else list(axis)
                      for axis in axes)
    return contract(a, b, normalize_axis_tuple(pairs[0], np.ndim(a)),
                    normalize_axis_tuple(pairs[1], np.ndim(b)))


def cov(m: Any, y: Any = None, rowvar: bool = True, bias: bool = False, ddof: Any = None,
        fweights: Any = None, aweights: Any = None, *, dtype: Any = None) -> ShardedTensor:
    """numpy's ``cov`` of sharded tensors split along the observations (the rows of
    ``rowvar=False`` data): each device's row count, column sums and the Gram matrix of its
    rows less their own mean, combined by Chan's pairwise formula (``reductions.comoments``)
    and divided by the count less ``ddof`` on the client. Replicated, on each device."""
    if fweights is not None or aweights is not None:
        raise TypeError("numpy.cov on sharded tensors takes no fweights or aweights: read "
                        "the data with .numpy() first to weigh the observations.")
    if ddof is not None and ddof != int(ddof):
        raise ValueError("ddof must be integer")
    for name, given in (("m", m), ("y", y)):
        if np.ndim(given) > 2:
            raise ValueError(f"{name} has more than 2 dimensions")
    mesh, operands = mesh_operands([m] if y is None else [m, y])
    dtype = np.result_type(*[_spec(a).dtype for a in operands], np.float64) \
        if dtype is None else np.dtype(dtype)

    def observations(a: Any) -> Any:  # numpy's variables-by-observations, transposed
        a = a[None] if np.ndim(a) == 1 else a
        return a.T if rowvar or a.shape[0] == 1 else a
    rows = [observations(a) for a in operands]
    count = rows[0].shape[0]
    for other in rows[1:]:
        if other.shape[0] != count:
            raise ValueError("all the input array dimensions except for the concatenation "
                             f"axis must match exactly, but along dimension 1, the array at "
                             f"index 0 has size {count} and the array at index 1 has size "
                             f"{other.shape[0]}")
    split = _split(rows)
    if split and any(a.axis != 0 for a in split):
        given = next(a for a in _split(operands))
        raise ValueError(f"np.cov of {given._handle()} would need every device's variables: "
                         "split it along its observations first (x.reshard(axis="
                         f"{1 if rowvar and given.ndim == 2 else 0}), worker to worker).")
    if ddof is None:
        ddof = 0 if bias else 1
    if not split:
        return per_shard(mesh, lambda *each: np.cov(*each, rowvar=rowvar, bias=bias, ddof=ddof,
                                                     dtype=dtype), operands, None)
    if len(rows) == 2:  # the variables of both, side by side, on each device
        rows = [along_split(mesh, lambda a, b: np.concatenate((a, b), axis=1), rows, (0, 0),
                            (), dtype, kept=0)]
    data = rows[0].astype(dtype)
    variables = data.shape[1]
    freedom = count - ddof
    if freedom <= 0:
        warnings.warn("Degrees of freedom <= 0 for slice", RuntimeWarning, stacklevel=3)
        freedom = 0

    def partials(z: Any) -> list[Any]:
        centered = z - z.mean(axis=0)
        return [z.sum(axis=0), centered.T @ (np.conj(centered) if dtype.kind == "c"
                                             else centered)]
    live = [(n, t) for n, t in zip(data.sharding.blocks, data._tensors()) if n]
    counts = np.asarray([n for n, _ in live])

    def combine(values: list[list[np.ndarray]]) -> np.ndarray:
        if not values:
            return np.full((variables, variables), np.nan, dtype)
        sums, squares = (np.stack([v[at] for v in values]) for at in (0, 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            return reductions.comoments(counts, sums, squares) / freedom
    shape = tuple(n for n in (variables, variables) if n != 1)  # (numpy's squeeze)
    return ShardedTensor.combined(mesh, shape, dtype, [partials(t) for _, t in live], combine)


FUNCTIONS.update({np.matmul: matmul, np.dot: dot, np.einsum: einsum, np.tensordot: tensordot,
                  np.cov: cov})
ShardedTensor.dot = lambda self, other: dot(self, other)  # type: ignore[method-assign]


class SVDResult(NamedTuple):
    """``U, S, Vh`` of a sharded matrix, as the array API standard names them."""
    U: Any
    S: Any
    Vh: Any


def tall_svd(x: ShardedTensor) -> SVDResult:
    """The reduced SVD of a matrix split along its rows: each device's QR of its block
    (``Q_i R_i``), the R factors (each at most as tall as ``x`` is wide) read once, stacked
    on the client and put on each device, where their SVD ``U_R S Vh`` runs, and ``U`` made
    on each device as ``Q_i`` times its rows of ``U_R``, split as ``x`` is. Nothing of ``x``
    itself moves."""
    if x.ndim != 2 or x.axis != 0 or not x.shape[0]:
        raise ValueError(f"An SVD across devices takes a non-empty matrix split along its rows, "
                         f"not {x._handle()}: reshard it (x.reshard(axis=0)).")
    mesh, shards, blocks = x.mesh, x._tensors(), x.sharding.blocks
    live = [i for i, n in enumerate(blocks) if n]
    factors = {i: np.linalg.qr(shards[i]) for i in live}
    heights = [min(blocks[i], x.shape[1]) for i in live]
    dtype = factors[live[0]][1].dtype
    stacked = ShardedTensor.combined(
        mesh, (sum(heights), x.shape[1]), dtype, [[factors[i][1]] for i in live],
        lambda values: np.concatenate([value[0] for value in values]))
    each = [np.linalg.svd(t, full_matrices=False) for t in stacked._tensors()]
    columns = each[0][0].shape[1]
    starts = dict(zip(live, np.cumsum([0, *heights[:-1]]).tolist()))
    left = [factors[i][0] @ each[i][0][starts[i]:starts[i] + min(n, x.shape[1])] if n
            else session.zeros((0, columns), each[i][0].dtype)
            for i, (n, session) in enumerate(zip(blocks, mesh.sessions))]
    return SVDResult(ShardedTensor(mesh, left, 0), ShardedTensor(mesh, [s for _, s, _ in each],
                                                                  None),
                     ShardedTensor(mesh, [vh for _, _, vh in each], None))
