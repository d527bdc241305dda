"""Unit tests of the sans-I/O rules of sharded tensors: blocks, ranges, and combining
partial reductions (numpy arrays standing in for what the devices compute)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from fabric.mesh import combining, reductions
from fabric.mesh.sharding import (Sharding, block_positions, block_ranges, block_slices,
                                  joined_axis, split_blocks)


def test_blocks_follow_array_split_and_slices_cut_them_by_range():
    rng = random.Random(1)
    for _ in range(2000):
        length, count = rng.randint(0, 30), rng.randint(1, 6)
        blocks = split_blocks(length, count)
        assert list(blocks) == [len(p) for p in np.array_split(np.arange(length), count)]
        offsets = Sharding(0, blocks, tuple(range(count))).offsets
        assert [start for start, _ in block_ranges(blocks)] == list(offsets)
        cut = slice(rng.choice([None, rng.randint(-35, 35)]),
                    rng.choice([None, rng.randint(-35, 35)]), rng.choice([None, 1, 2, 5]))
        whole = np.arange(length)
        parts = block_slices(range(*cut.indices(length)), offsets, blocks)
        joined = np.concatenate([whole[o:o + b][part]
                                 for o, b, part in zip(offsets, blocks, parts)])
        assert joined.tolist() == whole[cut].tolist(), (length, count, cut)


def test_positions_are_cut_by_block_and_counted_from_each_block():
    rng = random.Random(3)
    for _ in range(500):
        length, count = rng.randint(0, 30), rng.randint(1, 6)
        blocks = split_blocks(length, count)
        positions = np.asarray(sorted(rng.sample(range(length), rng.randint(0, length))), int)
        whole = np.arange(length) * 10
        pieces = block_positions(positions, blocks)
        assert len(pieces) == count
        joined = np.concatenate([whole[start:stop][local] for (start, stop), local in zip(
            block_ranges(blocks), pieces)])
        assert joined.tolist() == whole[positions].tolist(), (length, count, positions)


def test_results_join_along_the_axis_they_were_cut_and_reductions_join_nowhere():
    rng = random.Random(2)
    for _ in range(500):
        whole = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
        axis, count = rng.randrange(len(whole)), rng.randint(2, 5)
        parts = [p.shape for p in np.array_split(np.empty(whole), count, axis=axis)]
        assert joined_axis(whole, parts, axis) == axis, (whole, parts)
        reduced = whole[:axis] + whole[axis + 1:]  # each shard's sum over the split axis
        assert joined_axis(reduced, [reduced] * count, axis) is None, (whole, count)
        kept = whole[:axis] + (1,) + whole[axis + 1:]  # the same, keepdims
        assert joined_axis(kept, [kept] * count, axis) is None, (whole, count)
    assert joined_axis((4, 3), [(4, 3)], 0) == 0  # one part: any axis joins; the preferred
    assert joined_axis((4, 3), [(4, 3)], 1) == 1
    assert joined_axis((3, 4), [(3, 4)], 2) == 0  # (the preferred axis is not there)
    assert joined_axis((0, 3), [(0, 3), (0, 3)], 1) == 0  # an empty axis joins any count
    assert joined_axis((), [(), ()], 0) is None
    assert joined_axis((6,), [(3,), (3, 1)], 0) is None  # a part of another rank
    assert joined_axis((6, 1), [(3,), (3,)], 0) is None


def test_a_sharding_prints_its_axis_blocks_and_devices():
    assert str(Sharding(1, (2, 0), (3, 5))) == \
        "split along axis 1 in blocks [2, 0] on devices [3, 5]"
    assert str(Sharding(None, (), (0, 1))) == "replicated on devices [0, 1]"
    assert Sharding(None, (), (0,)).replicated and not Sharding(0, (1,), (0,)).replicated


def _combined(name: str, values: np.ndarray, split: int, count: int, **params):
    """Reduction ``name`` of ``values`` as a mesh computes it: each non-empty block's partial
    results by shard_partials' numpy functions, combined."""
    axis = params.pop("axis", None)
    blocks = split_blocks(values.shape[split], count)
    live = [(piece, start) for piece, (start, _), block in zip(
        np.array_split(values, count, axis=split), block_ranges(blocks), blocks) if block]
    pieces = [piece for piece, _ in live]
    axes = tuple(range(values.ndim)) if axis is None else np.atleast_1d(axis).tolist()
    partials = [[np.asarray(p) for p in reductions.shard_partials(
        name, axis, params, values.dtype)(piece)] for piece in pieces]
    want = getattr(np, name)(values, axis=axis, **params)
    parts = reductions.Parts(
        shapes=tuple(p.shape for p in pieces), offsets=tuple(start for _, start in live),
        axis=split, shape=values.shape, axes=tuple(axes),
        out_shape=tuple(n for d, n in enumerate(values.shape) if d not in axes),
        dtype=np.asarray(want).dtype)
    return reductions.combine(name, partials, parts, {"axis": axis, **params}), want


@pytest.mark.parametrize("name", sorted(reductions.REDUCTIONS))
@pytest.mark.parametrize("split", [0, 1])
def test_partial_results_combine_as_numpy(name, split):
    values = np.random.default_rng(2).standard_normal((9, 4)) * 100 + 1e6  # far from 0:
    for count in (1, 2, 4, 12):  # a mean of variances, or a pooled sum of squares, is off
        for axis in ([None, split] if name.startswith("arg") else [None, split, (0, 1)]):
            got, want = _combined(name, values, split, count, axis=axis)
            np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=f"{count} {axis}")


@pytest.mark.filterwarnings("ignore:All-NaN slice", "ignore:Mean of empty slice",
                            "ignore:Degrees of freedom")  # (numpy's own, on the nan column)
@pytest.mark.parametrize("name", sorted(n for n in reductions.REDUCTIONS if "nan" in n))
def test_nan_ignoring_reductions_count_each_shards_numbers(name):
    values = np.random.default_rng(3).standard_normal((9, 4))
    values[:4, 0] = np.nan  # (whole shards of nans in a column, which others' numbers beat)
    values[:, 1] = np.nan  # (a column of nans only: numpy's nan)
    values[7, 2] = np.nan
    for count in (1, 2, 4, 12):
        for axis in (None, 0, (0, 1)):
            got, want = _combined(name, values, 0, count, axis=axis, **(
                {"ddof": 1} if name in reductions.SPREADS else {}))
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=f"{count} {axis}")


def test_variance_takes_ddof_and_mean_accumulates_as_numpy():
    values = np.arange(20, dtype=np.int16).reshape(5, 4)
    got, want = _combined("var", values, 0, 3, axis=0, ddof=1)
    np.testing.assert_allclose(got, want)
    assert reductions.accumulator(np.dtype(np.float16), None) == np.float32
    assert reductions.accumulator(np.dtype(np.int8), None) == np.float64
    assert reductions.accumulator(np.dtype(np.float32), "float64") == np.float64


def test_every_refused_matmul_layout_runs_once_its_advice_is_followed():
    from fabric.mesh.sharded_linalg import _matmul_case, _matmul_fix
    advised = set()
    for left_ndim, right_ndim in itertools.product([1, 2, 3], repeat=2):
        for left, right in itertools.product([None, *range(left_ndim)],
                                             [None, *range(right_ndim)]):
            if _matmul_case((left_ndim, left), (right_ndim, right)) is None:
                _, call, layout = _matmul_fix((left_ndim, left), (right_ndim, right))
                assert _matmul_case(*layout) is not None, (left_ndim, left, right_ndim, right)
                advised.add(call)
    assert len(advised) == 3  # the right operand, the left, both
    assert _matmul_case((2, 1), (2, 0)) == "contracted"  # Z.T @ Z


def test_comoments_of_blocks_are_numpys_covariance_far_from_zero():
    rng = np.random.default_rng(2)
    data = rng.standard_normal((17, 3)) * [1, 100, 1e4] + [1e8, -5, 3]
    for blocks in [(17,), (9, 8), (1, 0, 10, 6)]:
        pieces = [p for p in np.split(data, np.cumsum(blocks)[:-1]) if len(p)]
        counts = np.asarray([len(p) for p in pieces])
        sums = np.stack([p.sum(axis=0) for p in pieces])
        squares = np.stack([(p - p.mean(axis=0)).T @ (p - p.mean(axis=0)) for p in pieces])
        got = reductions.comoments(counts, sums, squares) / (len(data) - 1)
        want = np.cov(data, rowvar=False)  # (rounding: relative to its largest entry)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 * np.abs(want).max())


class Pending:
    """A stand-in for a result combined from partials that no device holds yet: numpy arrays
    for its partial results, summed when combined."""

    def __init__(self, partials: list[np.ndarray]) -> None:
        self._shards = None
        self._partials = ([[p] for p in partials], lambda values: sum(v[0] for v in values))
        self.dtype, self.shape, self.ndim = partials[0].dtype, partials[0].shape, partials[0].ndim


def test_ops_of_combined_results_compose_with_their_combine():
    mean = Pending([np.arange(3.0), np.ones(3)])
    gram = Pending([np.eye(3), 2 * np.eye(3)])
    assert combining.composable([mean, 2]) and not combining.composable([mean, np.ones(3)])
    assert not combining.composable([2, 3])  # (no combined result among them)
    shape, dtype, partials, combine = combining.composed(
        np.subtract, [gram, Pending([np.ones((3, 1))])])
    assert (shape, dtype, len(partials)) == ((3, 3), np.float64, 3)
    values = [[p] for p in (np.eye(3), 2 * np.eye(3), np.ones((3, 1)))]
    np.testing.assert_array_equal(combine(values), 3 * np.eye(3) - 1)
    _, dtype, _, combine = combining.composed(np.less, [mean, 2])  # (a Python scalar: weak)
    assert dtype == np.bool_
    assert combine([[np.arange(3.0)], [np.ones(3)]]).tolist() == [True, False, False]
    integers = Pending([np.arange(3)])
    with pytest.raises(TypeError):  # numpy's casting, at the call: not when read
        combining.composed(np.add, [integers, 0.5], out=integers)
    _, _, _, combine = combining.composed(np.add, [mean, 1])
    mean._partials = ([], lambda _: np.zeros(3))  # (updated in place later: not seen here)
    np.testing.assert_array_equal(combine([[np.arange(3.0)], [np.ones(3)]]), np.arange(3.0) + 2)


class Shard:
    """What ``combining.reduced`` reads of a shard: its session's id, its own id, its shape."""

    def __init__(self, session: str, id: int, shape: tuple[int, ...]) -> None:
        self.session = type("Session", (), {"id": session})()
        self.id, self.shape = id, shape


def test_the_same_reduction_of_the_same_shards_takes_the_partials_made_before():
    shards = [Shard("a", 1, (3, 2)), Shard("b", 1, (2, 2))]
    made = []

    def make():
        made.append([["partials of", len(made)]])
        return made[-1]
    first = combining.reduced(("sum", "{}", "<f8"), shards, make)
    assert combining.reduced(("sum", "{}", "<f8"), shards, make) is first and len(made) == 1
    for other in [("sum", "{'axis': 0}", "<f8"), ("max", "{}", "<f8")]:  # (another reduction)
        assert combining.reduced(other, shards, make) is not first
    updated = [Shard("a", 2, (3, 2)), shards[1]]  # (an update in place: the shard's new id)
    assert combining.reduced(("sum", "{}", "<f8"), updated, make) is not first
    for n in range(combining.REDUCED_KEPT):  # (only the most recent few are kept)
        combining.reduced(("sum", "{}", "<f8"), [Shard("c", n, (1,))], make)
    assert combining.reduced(("sum", "{}", "<f8"), shards, make) is not first


def test_a_copys_reductions_are_those_of_the_values_it_copied():
    source, copy = [Shard("a", 10, (2,))], [Shard("a", 11, (2,))]
    made = []

    def make():
        made.append([["partials of", len(made)]])
        return made[-1]
    first = combining.reduced(("sum", "{}", "<f8"), source, make)
    combining.same_values(copy, source)
    assert combining.reduced(("sum", "{}", "<f8"), copy, make) is first
    copy_of_copy = [Shard("a", 12, (2,))]
    combining.same_values(copy_of_copy, copy)
    assert combining.reduced(("sum", "{}", "<f8"), copy_of_copy, make) is first
    updated = [Shard("a", 13, (2,))]  # (the copy updated in place: its new id, new values)
    assert combining.reduced(("sum", "{}", "<f8"), updated, make) is not first
