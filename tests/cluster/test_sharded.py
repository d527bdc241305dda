"""End-to-end: sharded tensors on meshes of real devices (a broker and three workers of two
devices each), compared with numpy; refusals; resharding; a device killed mid-chain."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest

import fabric
from fabric.core.errors import SessionLost
from fabric.mesh.sharded import ShardedTensor

DEVICES = 6  # three workers, two devices each
# Random chains the differential test runs: seeded for CI; more explore further.
EXAMPLES = int(os.environ.get("FABRIC_SHARDED_EXAMPLES", "150"))


@pytest.fixture(scope="module")
def six_devices():
    with fabric.LocalCluster(workers=3, devices_per_worker=2, heartbeat=0.2) as running:
        yield running


@pytest.fixture(scope="module")
def meshes(six_devices):
    """A mesh of 1 to 5 devices, by size, over one session (uneven choices of devices)."""
    with six_devices.connect(device=0) as parent:
        yield {count: parent.mesh(devices=[(5 * i + 1) % DEVICES for i in range(count)])
               for count in range(1, 6)}


def test_a_mesh_opens_a_session_per_device_and_closes_them(six_devices):
    with six_devices.connect(device=0) as parent:
        everything = parent.mesh()
        assert everything.devices == tuple(range(DEVICES))
        chosen = parent.mesh(devices=[0, 2, 3])
        assert [s.device.index for s in chosen.sessions] == [0, 2, 3]
        assert all(s.connection is parent.connection for s in chosen.sessions)
        chosen.close()
        assert all(s.closed for s in chosen.sessions) and not parent.closed
        assert parent.ones(2).sum().numpy() == 2
    assert all(s.closed for s in everything.sessions)  # closed with its parent
    with pytest.raises(fabric.NoSuchDevice):
        with six_devices.connect(device=0) as parent:
            parent.mesh(devices=[0, 99])
    with six_devices.connect(device=0) as parent:
        with pytest.raises(ValueError, match="each once"):
            parent.mesh(devices=[1, 1])
        with pytest.raises(TypeError, match="device indexes"):
            parent.mesh(devices="0,1")


def test_asarray_splits_in_array_split_blocks_and_gathers_in_order(meshes):
    values = np.arange(14.0).reshape(7, 2)
    x = meshes[4].asarray(values, axis=0)
    assert (x.shape, x.dtype, x.ndim, x.size) == ((7, 2), np.float64, 2, 14)
    assert x.sharding.blocks == (2, 2, 2, 1) and x.sharding.axis == 0
    assert str(x.sharding) == "split along axis 0 in blocks [2, 2, 2, 1] on devices [1, 0, 5, 4]"
    assert [device for device, _ in x.shards] == list(meshes[4].devices)
    for (_, shard), piece in zip(x.shards, np.array_split(values, 4)):
        assert shard.numpy().tobytes() == piece.tobytes()
    assert x.numpy().tobytes() == values.tobytes()
    few = meshes[5].asarray(np.arange(2), axis=0)  # empty shards
    assert few.sharding.blocks == (1, 1, 0, 0, 0)
    assert few.numpy().tolist() == [0, 1] and int(few.sum()) == 1
    columns = meshes[3].asarray(values, axis=-1)
    assert columns.sharding.axis == 1 and columns.sharding.blocks == (1, 1, 0)
    assert (columns * 2).numpy().tolist() == (values * 2).tolist()


def test_creation_on_the_devices(meshes):
    mesh = meshes[3]
    assert mesh.zeros((5, 3), "int32").numpy().tolist() == np.zeros((5, 3), "int32").tolist()
    assert mesh.ones((4,)).sharding.blocks == (2, 1, 1)
    full = mesh.full((2, 5), 7, axis=1)
    assert full.sharding.blocks == (2, 2, 1) and full.numpy().tolist() == [[7] * 5] * 2
    assert full.dtype == np.asarray(7).dtype
    copies = mesh.replicate(np.arange(3))
    assert copies.sharding.replicated and str(copies.sharding).startswith("replicated")
    assert [t.numpy().tolist() for _, t in copies.shards] == [[0, 1, 2]] * 3
    shards = [s.arange(i, i + 2) for i, s in enumerate(mesh.sessions)]
    joined = mesh.from_shards(shards)
    assert joined.numpy().tolist() == [0, 1, 1, 2, 2, 3]
    assert [t for _, t in joined.shards] == shards
    with pytest.raises(ValueError, match=r"\.to\(mesh\.sessions\[0\]\)"):
        mesh.from_shards([shards[1], shards[0], shards[2]])
    with pytest.raises(TypeError, match="astype"):
        mesh.from_shards([np.zeros(2), np.zeros(2, "int8"), np.zeros(2)])


def test_a_tensor_of_one_device_is_split_or_replicated_worker_to_worker(meshes):
    mesh = meshes[3]
    values = np.arange(21).reshape(7, 3)
    one = mesh.parent.asarray(values)  # on the parent session's device
    uploaded = [s.stats()["bytes_uploaded"] for s in mesh.sessions]
    split = mesh.asarray(one, axis=1)
    assert split.sharding.blocks == (1, 1, 1) and split.numpy().tobytes() == values.tobytes()
    copies = mesh.replicate(one)
    assert all(t.numpy().tobytes() == values.tobytes() for _, t in copies.shards)
    assert mesh.asarray(split, axis=0, dtype="float32").numpy().tolist() == values.tolist()
    assert [s.stats()["bytes_uploaded"] for s in mesh.sessions] == uploaded


def test_random_shards_are_seeded_distinctly_and_reproducibly(meshes):
    mesh = meshes[3]
    mesh.random.seed(7)
    first = mesh.random.normal(size=(6, 4))
    mesh.random.seed(7)
    again = mesh.random.normal(size=(6, 4))
    assert first.numpy().tobytes() == again.numpy().tobytes()
    blocks = [t.numpy() for _, t in first.shards]
    assert not np.array_equal(blocks[0], blocks[1]) and not np.array_equal(blocks[1], blocks[2])
    draws = mesh.random.integers(0, 10, size=(9,), dtype="int16")
    assert draws.dtype == np.int16 and set(draws.numpy().tolist()) <= set(range(10))
    with pytest.raises(ValueError, match="replicate"):
        mesh.random.uniform(size=(3,), axis=None)


def test_the_issue_example(meshes):
    mesh = meshes[4]
    big = np.random.default_rng(0).standard_normal((50, 6))
    weights = np.random.default_rng(1).standard_normal((6, 6))
    x = mesh.asarray(big, axis=0)
    w = mesh.replicate(weights)
    y = np.tanh(x @ w) * 2 + 1
    expected = np.tanh(big @ weights) * 2 + 1
    assert (y.shape, y.dtype) == ((50, 6), np.float64)
    assert y.sharding.blocks == (13, 13, 12, 12)
    np.testing.assert_allclose(y.sum().numpy(), expected.sum())
    np.testing.assert_allclose(y.mean(axis=0).numpy(), expected.mean(axis=0))
    row = y.max(axis=1)
    assert row.sharding.axis == 0
    np.testing.assert_allclose(row.numpy(), expected.max(axis=1))
    np.testing.assert_allclose(y.numpy(), expected)
    centred = y - y.mean(axis=0)  # the combined mean, replicated onto the devices
    np.testing.assert_allclose(centred.numpy(), expected - expected.mean(axis=0), atol=1e-12)


@pytest.mark.parametrize("split", [0, 1])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int16", "bool"])
def test_reductions_across_the_split_axis_combine_as_numpy(meshes, split, dtype):
    values = np.random.default_rng(4).integers(-5, 20, (11, 7)).astype(dtype)
    x = meshes[5].asarray(values, axis=split)  # blocks of 3, 2, 2, 2, 2 (or 2, 2, 1, 1, 1)
    for name in ["sum", "prod", "min", "max", "mean", "var", "std", "any", "all"]:
        for axis in [None, split, (0, 1)]:
            for keepdims in [False, True]:
                got = getattr(x, name)(axis=axis, keepdims=keepdims)
                want = getattr(values, name)(axis=axis, keepdims=keepdims)
                _check_values(got.numpy(), want, f"{name} axis={axis} keepdims={keepdims}")
    for name in ["argmin", "argmax"]:
        for axis in [None, split]:
            _check_values(getattr(x, name)(axis=axis).numpy(), getattr(values, name)(axis=axis),
                          f"{name} axis={axis}")
    _check_values(x.var(axis=split, ddof=1).numpy(), values.var(axis=split, ddof=1), "ddof")


@pytest.mark.filterwarnings("ignore:All-NaN slice", "ignore:Mean of empty slice",
                            "ignore:Degrees of freedom")  # (numpy's, on the nan column)
@pytest.mark.parametrize("split", [0, 1])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int16", "bool"])
def test_nan_ignoring_reductions_and_ptp_combine_across_the_split_axis(meshes, split, dtype):
    values = np.random.default_rng(12).integers(-5, 20, (11, 7)).astype(dtype)
    if values.dtype.kind == "f":  # (a shard's whole slice of nans, and a column of nans only)
        values[:3, 0] = values[:, 4] = values[5, 2] = np.nan
    x = meshes[5].asarray(values, axis=split)
    names = ["nansum", "nanprod", "nanmean", "nanmin", "nanmax", "nanstd", "nanvar"]
    for name in names + (["ptp"] if dtype != "bool" else []):
        for axis in [None, split, (0, 1)]:
            for keepdims in [False, True]:
                got = getattr(np, name)(x, axis=axis, keepdims=keepdims)
                want = getattr(np, name)(values, axis=axis, keepdims=keepdims)
                _check_values(got.numpy(), want, f"{name} axis={axis} keepdims={keepdims}")
    _check_values(np.nanvar(x, axis=split, ddof=1).numpy(), np.nanvar(values, axis=split,
                                                                       ddof=1), "ddof")
    _check_values(np.nansum(x, axis=split, dtype="float32").numpy(),
                  np.nansum(values, axis=split, dtype="float32"), "dtype")


def test_average_combines_its_weighted_sums_and_follows_numpys_weights(meshes):
    mesh = meshes[4]
    values = np.random.default_rng(13).standard_normal((9, 5))
    weights, columns = np.arange(1.0, 10.0), np.arange(1.0, 6.0)
    x = mesh.asarray(values, axis=0)
    for got, want in [
            (np.average(x), np.average(values)),
            (np.average(x, axis=0, weights=mesh.asarray(weights)),
             np.average(values, axis=0, weights=weights)),
            (np.average(x, axis=(0, 1), weights=mesh.asarray(values ** 2), keepdims=True),
             np.average(values, axis=(0, 1), weights=values ** 2, keepdims=True)),
            (np.average(x, axis=1, weights=columns), np.average(values, axis=1,
                                                               weights=columns))]:
        _check_values(got.numpy(), want, "average")
    # weights along the split axis given as an array: refused, naming the call that works
    with pytest.raises(ValueError, match=r"mesh\.asarray\(array, axis=0\)"):
        np.average(x, axis=0, weights=weights)
    with pytest.raises(TypeError, match="weights should|Axis must"):  # numpy's, at the call
        np.average(x, weights=columns)
    zero = np.average(x, axis=0, weights=mesh.asarray(weights * 0))
    with pytest.raises(ZeroDivisionError, match="Weights sum to zero"):
        zero.numpy()  # (as numpy's, when the sums are known: at the read)


def test_medians_quantiles_and_ufunc_methods_run_on_each_shard_and_advise_a_reshard(meshes):
    mesh = meshes[3]
    values = np.random.default_rng(14).standard_normal((7, 6))
    values[1, 2] = np.nan
    x = mesh.asarray(values, axis=0)
    calls = {
        "nanmedian": lambda a, axis: np.nanmedian(a, axis=axis),
        "median": lambda a, axis: np.median(a, axis=axis, keepdims=True),
        "nanpercentile": lambda a, axis: np.nanpercentile(a, [10, 90], axis=axis),
        "nanquantile": lambda a, axis: np.nanquantile(a, 0.4, axis=axis),
        "nanargmax": lambda a, axis: np.nanargmax(a, axis=axis),
        "subtract.reduce": lambda a, axis: np.subtract.reduce(a, axis=axis),
        "maximum.accumulate": lambda a, axis: np.maximum.accumulate(a, axis=axis),
    }
    for name, call in calls.items():
        got = call(x, 1)  # along the other axis: on each shard, still split
        assert got.sharding.axis == (1 if "percentile" in name else 0), name
        _check_values(got.numpy(), call(values, 1), name)
        with pytest.raises(ValueError, match=r"needs every device's block.*x\.reshard\(axis=1"):
            call(x, 0)
        _check_values(call(x.reshard(axis=1), 0).numpy(), call(values, 0), name)  # (advised)
    with pytest.raises(ValueError, match=r"mesh\.replicate\(x\)"):
        np.nanmedian(x)
    _check_values(np.nanmedian(mesh.replicate(x)).numpy(), np.nanmedian(values), "advised")
    # reduce that is a combining reduction combines across the split axis
    for ufunc in (np.add, np.multiply, np.maximum, np.minimum, np.logical_and, np.logical_or):
        _check_values(ufunc.reduce(x, axis=0).numpy(), ufunc.reduce(values, axis=0),
                      ufunc.__name__)
    _check_values(np.add.reduce(x, axis=None, dtype="float32").numpy(),
                  np.add.reduce(values, axis=None, dtype="float32"), "dtype")


def test_a_function_that_needs_the_whole_array_advises_a_copy_that_takes_it(meshes):
    mesh = meshes[3]
    values = np.random.default_rng(15).standard_normal((8, 3))
    x = mesh.asarray(values, axis=0)
    with pytest.raises(TypeError, match=r"numpy.histogram .*x\.reshard\(axis=None\)"
                                        r"\.shards\[0\]\[1\]"):
        np.histogram(x)
    whole = x.reshard(axis=None).shards[0][1]
    _check_values(np.histogram(whole, bins=4)[0].numpy(), np.histogram(values, bins=4)[0],
                  "advised")
    with pytest.raises(TypeError, match=r"numpy.linalg.qr .*\(x\.shards\[0\]\[1\]"):
        np.linalg.qr(mesh.replicate(values))
    _check_values(np.linalg.qr(mesh.replicate(values).shards[0][1]).R.numpy(),
                  np.linalg.qr(values).R, "advised, replicated")
    assert np.array_equal(x, mesh.asarray(values, axis=0)) and np.array_equal(x, x.copy())
    assert not np.array_equal(x, x + 1) and not np.array_equal(x, values[:2])


def test_argmin_and_argmax_find_the_first_occurrence_across_shards(meshes):
    values = np.array([[3.0, 1.0, 5.0], [1.0, 7.0, 7.0], [np.nan, 0.0, 7.0], [0.0, np.nan, 2.0]])
    for split in (0, 1):
        x = meshes[3].asarray(values, axis=split)
        for name in ("argmin", "argmax"):
            for axis in (None, split):
                assert getattr(x, name)(axis=axis).numpy().tolist() == getattr(
                    values, name)(axis=axis).tolist(), (split, name, axis)
        ties = meshes[3].asarray(np.array([[2, 1, 1], [1, 2, 1]]), axis=split)
        assert ties.argmin().numpy() == 1 and ties.argmax().numpy() == 0


def test_reads_of_many_sessions_are_in_flight_together(meshes):
    first, second = meshes[2].sessions
    a, b = first.arange(3), second.arange(4) * 2
    reads = [first.start_read(a), second.start_read(b)]
    assert reads[1].result().tolist() == [0, 2, 4, 6]  # taken in either order
    assert reads[0].result().tolist() == [0, 1, 2]


def test_scans_and_sorts_along_other_axes_run_on_each_shard(meshes):
    values = np.random.default_rng(10).integers(-9, 9, (7, 5, 4)).astype("int32")
    for split in range(3):
        x = meshes[3].asarray(values, axis=split)
        for axis in [d for d in range(3) if d != split]:
            for name in ("cumsum", "cumprod", "sort", "argsort"):
                got = getattr(np, name)(x, axis=axis)
                assert got.sharding == x.sharding, (split, axis, name)
                _check_values(got.numpy(), getattr(np, name)(values, axis=axis),
                              f"{name} axis={axis} split={split}")
            _check_values(x.cumsum(axis, dtype="float32").numpy(),
                          values.cumsum(axis, dtype="float32"), "cumsum dtype")
    copies = meshes[3].replicate(values)
    _check_values(copies.cumsum().numpy(), values.cumsum(), "flat, replicated")
    with pytest.raises(np.exceptions.AxisError):
        np.cumsum(x, axis=3)  # numpy's error, at the call


def test_batched_matmul_split_along_a_batch_axis_runs_on_each_shard(meshes):
    mesh = meshes[3]
    rng = np.random.default_rng(11)
    batches, pairs, weights = (rng.standard_normal(shape) for shape in [(7, 4, 3), (7, 3, 2),
                                                                          (3, 5)])
    x = mesh.asarray(batches, axis=0)
    cases = [(x @ mesh.replicate(weights), batches @ weights, 0),
             (x @ mesh.asarray(pairs, axis=0), batches @ pairs, 0),  # both split alike
             (mesh.replicate(weights.T) @ x.transpose(0, 2, 1), weights.T @ batches.transpose(
                 0, 2, 1), 0),
             (x @ weights[:, 0], batches @ weights[:, 0], 0),  # a vector: the rows' axis goes
             (mesh.asarray(batches[None], axis=1) @ pairs[:1], batches[None] @ pairs[:1], 1)]
    for got, want, axis in cases:
        assert got.sharding.axis == axis and got.sharding.blocks == (3, 2, 2)
        _check_values(got.numpy(), want, str(want.shape))


# -- contractions over the split axis -----------------------------------------------------------

@pytest.mark.parametrize("count", [2, 3, 5])
def test_contractions_over_the_split_axis_sum_each_devices_product(meshes, count):
    mesh = meshes[count]
    rng = np.random.default_rng(count)
    a, b = rng.standard_normal((11, 4)), rng.standard_normal((11, 3))
    z, y = mesh.asarray(a, axis=0), mesh.asarray(b, axis=0)
    cases = [(z.T @ z, a.T @ a), (z.T @ y, a.T @ b), (np.dot(z.T, z), a.T @ a),
             (z.T.dot(y), a.T @ b), (z[:, 0] @ z, a[:, 0] @ a),
             (z[:, 1] @ y[:, 2], a[:, 1] @ b[:, 2]),
             (np.einsum("ij,ik->jk", z, z), a.T @ a), (np.einsum("ij,ij", z, z), np.sum(a * a)),
             (np.einsum("ij,ik,i->jk", z, y, b[:, 0]), np.einsum("ij,ik,i->jk", a, b, b[:, 0])),
             (z.T @ mesh.replicate(b), a.T @ b), (z.T @ b, a.T @ b),  # the other's rows cut there
             (np.einsum("ji,jk", mesh.replicate(a), y), a.T @ b),
             (z[4:].T @ y[4:], a[4:].T @ b[4:]),  # uneven blocks, and empty ones
             (z[9:].T @ z[9:], a[9:].T @ a[9:]), (z[:0].T @ z[:0], a[:0].T @ a[:0]),
             (z.astype(np.float32).T @ y, a.astype(np.float32).T @ b),
             (np.tensordot(z, y, axes=(0, 0)), a.T @ b),
             (np.tensordot(z[:, 0], b, 1), a[:, 0] @ b)]
    for got, want in cases:
        assert got.sharding.replicated and (got.shape, got.dtype) == (want.shape, want.dtype)
        _check_values(got.numpy(), want, str(want.shape))
    gram = z.T @ z
    _check_values((z @ gram).numpy(), a @ (a.T @ a), "used further: replicated")
    kept = np.einsum("ij,ij->i", z, y[:, :1] * z)  # the split letter kept: on each shard
    assert kept.sharding == z[:, 0].sharding
    _check_values(kept.numpy(), np.einsum("ij,ij->i", a, b[:, :1] * a), "kept")


@pytest.mark.parametrize("count", [2, 3])
def test_cov_of_row_split_data_combines_each_devices_moments_as_numpys(meshes, count):
    mesh = meshes[count]
    rng = np.random.default_rng(7)
    a = rng.standard_normal((13, 4)) * [1, 10, 100, 1e4] + [0, 5, -3, 1e6]  # far from 0
    b = rng.integers(-5, 5, (13, 2))
    z, y = mesh.asarray(a, axis=0), mesh.asarray(b, axis=0)
    cases = [(np.cov(z, rowvar=False), np.cov(a, rowvar=False)),
             (np.cov(z, rowvar=False, bias=True), np.cov(a, rowvar=False, bias=True)),
             (np.cov(z, rowvar=False, ddof=4), np.cov(a, rowvar=False, ddof=4)),
             (np.cov(z.T), np.cov(a.T)), (np.cov(z[:, 2]), np.cov(a[:, 2])),
             (np.cov(z[5:], rowvar=False), np.cov(a[5:], rowvar=False)),
             (np.cov(z, y, rowvar=False), np.cov(a, b, rowvar=False)),
             (np.cov(z, b, rowvar=False), np.cov(a, b, rowvar=False)),
             (np.cov(y, rowvar=False, dtype=np.float32), np.cov(b, rowvar=False,
                                                                dtype=np.float32)),
             (np.cov(mesh.replicate(a), rowvar=False), np.cov(a, rowvar=False))]
    for got, want in cases:
        assert got.sharding.replicated and (got.shape, got.dtype) == (want.shape, want.dtype)
        scale = np.abs(want).max()
        np.testing.assert_allclose(got.numpy() / scale, want / scale, rtol=0,
                                   atol=1e-6 if want.dtype == np.float32 else 1e-12)
    with pytest.warns(RuntimeWarning, match="Degrees of freedom"):
        np.cov(z[:2], rowvar=False, ddof=2)


def test_every_contraction_refusal_names_a_call_that_runs(meshes):
    mesh = meshes[3]
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((8, 4)), rng.standard_normal((4, 8))
    x, w = mesh.asarray(a, axis=0), mesh.asarray(b, axis=1)
    with pytest.raises(ValueError, match=r"mesh\.replicate\(b\)"):
        x @ w  # both split, neither along the axis @ sums over
    _check_values((x @ mesh.replicate(w)).numpy(), a @ b, "replicated right")
    columns = mesh.asarray(a, axis=1)
    with pytest.raises(ValueError, match=r"mesh\.replicate\(b\)"):
        columns.T @ columns  # the left split along the summed axis, the right's columns
    _check_values((columns.T @ mesh.replicate(columns)).numpy(), a.T @ a, "summed")
    with pytest.raises(ValueError, match=r"mesh\.replicate\(a\)"):
        x @ mesh.replicate(np.ones((2, 4, 3)))  # rows split, a batch of weights
    _check_values((mesh.replicate(x) @ np.ones((2, 4, 3))).numpy(), a @ np.ones((2, 4, 3)),
                  "replicated batch")
    with pytest.raises(ValueError, match=r"rebalance"):
        x[2:].T @ x[2:].rebalance()  # the summed axis split in other blocks
    _check_values((x[2:].rebalance().T @ x[2:].rebalance()).numpy(), a[2:].T @ a[2:],
                  "rebalanced")
    with pytest.raises(ValueError, match=r"different letters .*mesh\.replicate"):
        np.einsum("ij,jk->ik", x, mesh.asarray(b, axis=0))
    _check_values(np.einsum("ij,jk->ik", x, mesh.replicate(b)).numpy(), a @ b, "one split")
    with pytest.raises(ValueError, match=r"'\.\.\.'.*mesh\.replicate"):
        np.einsum("i...,i...", x, x)
    _check_values(np.einsum("i...,i...", mesh.replicate(x), mesh.replicate(x)).numpy(),
                  np.einsum("i...,i...", a, a), "ellipsis replicated")
    with pytest.raises(ValueError, match=r"diagonal.*mesh\.replicate"):
        np.einsum("ii->i", x[:4, :4])
    _check_values(np.einsum("ii->i", mesh.replicate(x[:4, :4])).numpy(), np.diag(a[:4, :4]),
                  "diagonal replicated")
    cube = rng.standard_normal((8, 2, 4))
    with pytest.raises(ValueError, match=r"np\.einsum.*mesh\.replicate"):
        np.dot(mesh.asarray(cube, axis=0), b)
    _check_values(np.dot(mesh.replicate(cube), mesh.replicate(b)).numpy(), np.dot(cube, b),
                  "dot replicated")
    _check_values(np.einsum("ijk,kl->ijl", mesh.asarray(cube, axis=0), b).numpy(),
                  np.dot(cube, b), "dot as einsum")
    with pytest.raises(ValueError, match=r"x\.reshard\(axis=0\)"):
        np.cov(x.reshard(axis=1), rowvar=False)  # split along the variables
    _check_values(np.cov(x.reshard(axis=1).reshard(axis=0), rowvar=False).numpy(),
                  np.cov(a, rowvar=False), "cov resharded")
    with pytest.raises(TypeError, match=r"\.numpy\(\)"):
        np.cov(x, rowvar=False, aweights=np.ones(8))
    np.testing.assert_allclose(np.cov(x.numpy(), rowvar=False, aweights=np.ones(8)),
                               np.cov(a, rowvar=False, aweights=np.ones(8)))


# -- fabric.function on each shard -------------------------------------------------------------

@fabric.function
def _layer(x, w, scale):
    hidden = np.tanh(x @ w) * scale
    return {"out": hidden + x.sum(axis=1, keepdims=True), "flat": hidden.ravel(), "T": hidden.T,
            "rows": x.shape[0]}


def test_a_function_is_replayed_on_each_shard_and_its_results_split_alike(meshes):
    mesh = meshes[4]
    values = np.random.default_rng(8).standard_normal((50, 6))
    weights = np.random.default_rng(9).standard_normal((6, 6))
    x, w = mesh.asarray(values, axis=0), mesh.replicate(weights)
    got = _layer(x, w, 2.0)
    hidden = np.tanh(values @ weights) * 2.0
    assert got["rows"] == 50  # a constant of the whole array's trace
    assert got["out"].sharding == x.sharding
    np.testing.assert_allclose(got["out"].numpy(), hidden + values.sum(axis=1, keepdims=True))
    assert got["flat"].sharding.blocks == (78, 78, 72, 72)  # each block's rows, flattened
    np.testing.assert_allclose(got["flat"].numpy(), hidden.ravel())
    assert got["T"].sharding.axis == 1 and got["T"].sharding.blocks == x.sharding.blocks
    np.testing.assert_allclose(got["T"].numpy(), hidden.T)
    np.testing.assert_allclose(got["out"].sum(axis=0).numpy(),  # combined as any result
                               (hidden + values.sum(axis=1, keepdims=True)).sum(axis=0))
    again = _layer(x * 3, w, 2.0)["out"]  # the same shapes: the same graphs, no new trace
    traces = len(_layer.graphs)
    np.testing.assert_allclose(again.numpy(), np.tanh(values * 3 @ weights) * 2 +
                               (values * 3).sum(axis=1, keepdims=True))
    assert len(_layer.graphs) == traces
    few = meshes[5].asarray(values[:2], axis=0)  # empty shards
    assert few.sharding.blocks == (1, 1, 0, 0, 0)
    np.testing.assert_allclose(_layer(few, meshes[5].replicate(weights), 1)["out"].numpy(),
                               np.tanh(values[:2] @ weights) + values[:2].sum(1, keepdims=True))
    copies = _layer(mesh.replicate(values), w, 2.0)["T"]  # replicated in, replicated out
    assert copies.sharding.replicated
    assert all(np.allclose(t.numpy(), hidden.T) for _, t in copies.shards)


def test_a_function_that_needs_other_shards_is_refused_before_anything_is_sent(meshes):
    mesh = meshes[3]
    values = np.arange(24.0).reshape(6, 4)
    x = mesh.asarray(values, axis=0)
    columns, one, five = x.reshard(axis=1), mesh.sessions[0].ones(4), mesh.replicate(np.ones(5))

    @fabric.function
    def centred(a):
        return a - a.mean(axis=0)

    @fabric.function
    def total(a):
        return a.sum(axis=0)

    @fabric.function
    def pair(a, b):
        return a + b

    sent = [s.stats()["ops_sent"] for s in mesh.sessions]
    with pytest.raises(ValueError, match=r"reduce it outside the function.*x\.reshard"):
        total(x)
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        total(x)
    with pytest.raises(ValueError, match=r"shape \(\)"):  # every axis reduced
        fabric.function(np.sum)(x)
    with pytest.raises(ValueError, match="reshard them alike"):
        pair(x, columns)
    with pytest.raises(TypeError, match=r"mesh\.replicate\(t\)"):
        pair(x, one)
    with pytest.raises(TypeError, match=r"mesh\.replicate\(array\)"):
        pair(x, np.ones(4))
    with pytest.raises(ValueError, match=r"\(6, ?4\).*\(5,\)|\(5,\).*\(6, ?4\)"):
        pair(x, five)  # numpy's error, with the whole array's shape
    assert [s.stats()["ops_sent"] for s in mesh.sessions] == sent
    assert centred(columns).numpy().tolist() == (values - values.mean(0)).tolist()
    assert pair(x, mesh.replicate(np.ones(4))).numpy().tolist() == (values + 1).tolist()


# -- printing ---------------------------------------------------------------------------------

class sharded_tensor(np.ndarray):
    """numpy's own repr of an array named ``sharded_tensor`` (numpy names a subclass so)."""


PRINTED = {  # (array, split axis, numpy's print options)
    "1-d floats": (np.linspace(-1e4, 1e4, 3001), 0, {}),
    "2-d int32 by rows": (np.arange(80_000, dtype=np.int32).reshape(200, 400), 0, {}),
    "2-d by columns": (np.arange(80_000.0).reshape(400, 200) / 7, 1, {}),
    "3-d, split along its short axis": (np.arange(24_000.0).reshape(40, 3, 200) * 1e-3, 1, {}),
    "complex, options": (np.arange(600.0).reshape(20, 30) * (1 + 2j), 0,
                         {"edgeitems": 2, "threshold": 100, "linewidth": 60}),
    "bool, one edge item": (np.arange(5000).reshape(50, 100) % 3 == 0, 1, {"edgeitems": 1}),
    "replicated": (np.arange(9000.0).reshape(90, 100), None, {}),
}


def _in_pieces(session, block: np.ndarray):
    """``block`` uploaded in eighths along its longest axis and joined on the device."""
    axis = int(np.argmax(block.shape))
    return np.concatenate([session.asarray(part) for part in np.array_split(block, 8, axis)],
                          axis=axis)


@pytest.mark.parametrize("name", list(PRINTED))
def test_a_large_sharded_tensor_prints_as_numpy_reading_only_what_numpy_shows(six_devices, name):
    # No message may carry a third of the array: only the summary's elements can be read.
    array, axis, options = PRINTED[name]
    with fabric.connect(six_devices.address, token=six_devices.token, shared_memory=False,
                        max_message_bytes=array.nbytes // 6) as parent, \
            parent.mesh(devices=[4, 1, 2]) as mesh:
        if axis is None:
            x = ShardedTensor(mesh, [_in_pieces(s, array) for s in mesh.sessions], None)
        else:
            x = mesh.from_shards([_in_pieces(s, block) for s, block in zip(
                mesh.sessions, np.array_split(array, 3, axis))], axis=axis)
        with np.printoptions(**options):
            assert repr(x) == repr(array.view(sharded_tensor))
            assert str(x) == str(array) and f"{x}" == f"{array}"
        with pytest.raises(fabric.MessageTooLarge):
            x.numpy()  # (the whole array is too large to read here)


def test_small_and_combined_sharded_tensors_print_their_values(meshes):
    values = np.arange(12.0).reshape(4, 3)
    x = meshes[3].asarray(values, axis=0)
    assert repr(x) == repr(values.view(sharded_tensor)) and str(x) == str(values)
    total = x.sum(axis=0)
    assert str(total) == str(values.sum(axis=0)) and f"{x.sum():.1f}" == "66.0"
    with np.printoptions(threshold=3, edgeitems=1):
        assert repr(x) == repr(values.view(sharded_tensor))


# -- differential: random chains against numpy ---------------------------------------------------

DTYPES = ["float64", "float32", "int64", "int32", "bool"]
REDUCTIONS = ["sum", "prod", "min", "max", "mean", "var", "std", "any", "all", "argmin", "argmax"]
UNARY = [np.negative, np.absolute, np.tanh, np.square, np.sin]
BINARY = [np.add, np.subtract, np.multiply, np.maximum, np.greater, np.bitwise_and]


@fabric.function
def _per_row(a, axis):
    """Work that keeps the split axis's rows apart: elementwise, and a sum along another axis."""
    return a * 2 - a.sum(axis=axis, keepdims=True)


def _step(rng: random.Random, mesh, x, ref: np.ndarray):
    """One random op: a function of (the sharded tensor, its numpy twin), and its name."""
    split = x.sharding.axis
    kind = rng.choice(["unary", "scalar", "same", "broadcast", "astype", "where", "reduce",
                       "slice", "index", "matmul", "scan", "function", "transpose",
                       "reshard"])
    if kind == "unary":
        ufunc = rng.choice(UNARY)
        return (lambda a: ufunc(a)), ufunc.__name__
    if kind == "scalar":
        ufunc, scalar, left = rng.choice(BINARY), rng.choice([2, -1, 0.5, True]), rng.random()
        return (lambda a: ufunc(a, scalar) if left < 0.5 else ufunc(scalar, a)), \
            f"{ufunc.__name__} {scalar!r} {'right' if left < 0.5 else 'left'}"
    if kind == "same":
        ufunc = rng.choice(BINARY)
        return (lambda a: ufunc(a, a * 2)), f"{ufunc.__name__} with a sibling"
    if kind == "broadcast":  # an array of 1 along the split axis: as it is, or replicated
        shape = tuple(1 if d == split else n for d, n in enumerate(ref.shape))[
            rng.randrange(0, max(ref.ndim, 1)):] if ref.ndim else ()
        other = np.random.default_rng(rng.randrange(99)).integers(-3, 4, shape).astype(
            rng.choice(DTYPES[:4]))
        replicated = rng.random() < 0.5
        ufunc = rng.choice(BINARY)
        return (lambda a: ufunc(a, mesh.replicate(other) if replicated and isinstance(
            a, ShardedTensor) else other)), f"{ufunc.__name__} {shape} replicated={replicated}"
    if kind == "astype":
        dtype = rng.choice(DTYPES)
        return (lambda a: a.astype(dtype)), f"astype {dtype}"
    if kind == "where":
        return (lambda a: np.where(a > 0, a, 3)), "where"
    if kind == "reduce":
        name, keepdims = rng.choice(REDUCTIONS), rng.random() < 0.3
        axes = [None] + list(range(ref.ndim))
        axis = rng.choice(axes)
        if name.startswith("arg"):
            return (lambda a: getattr(a, name)(axis=axis)), f"{name} axis={axis}"
        return (lambda a: getattr(a, name)(axis=axis, keepdims=keepdims)), \
            f"{name} axis={axis} keepdims={keepdims}"
    if kind == "slice" and ref.ndim:
        axis = split if split is not None else 0
        cut = slice(rng.choice([None, 0, 1, -2]), rng.choice([None, 5, -1]),
                    rng.choice([None, 1, 2, 3]))
        index = (slice(None),) * axis + (cut,)
        return (lambda a: a[index]), f"[{index}]"
    if kind == "index" and ref.ndim >= 2:
        other = next(d for d in range(ref.ndim) if d != split)
        index = (slice(None),) * other + (rng.choice([0, -1, slice(1, None), None]),)
        return (lambda a: a[index]), f"[{index}]"
    if kind == "matmul" and ref.ndim >= 2 and (split is None or split <= ref.ndim - 2) \
            and ref.dtype != bool:  # a replicated right operand: rows or batches split
        weights = np.random.default_rng(rng.randrange(99)).integers(-2, 3, (ref.shape[-1], 3))
        return (lambda a: a @ (mesh.replicate(weights) if isinstance(a, ShardedTensor)
                               else weights)), "@ replicated"
    if kind == "scan" and ref.ndim:  # along an axis inside each shard
        name = rng.choice(["cumsum", "cumprod", "sort", "argsort"])
        axis = rng.choice([d for d in range(ref.ndim) if d != split] or [None])
        if axis is not None or split is None:
            return (lambda a: getattr(np, name)(a, axis=axis)), f"{name} axis={axis}"
    if kind == "function":  # fabric.function on each shard; its plain function on numpy's
        axis = rng.choice([d for d in range(ref.ndim) if d != split] or [None])
        if axis is not None or split is None:
            return (lambda a: (_per_row if isinstance(a, ShardedTensor) else _per_row.fn)(
                a, axis)), f"function axis={axis}"
    if kind == "transpose":
        return (lambda a: a.T), "T"
    if kind == "reshard":  # the same values, split otherwise (numpy's twin: as it is)
        axis = rng.choice([None] + list(range(ref.ndim)))
        return (lambda a: a.reshard(axis) if isinstance(a, ShardedTensor) else a), \
            f"reshard {axis}"
    return (lambda a: a + 1), "+ 1"


def _same_refusal(theirs: BaseException, ours: BaseException) -> bool:
    return any(isinstance(theirs, kind) and isinstance(ours, kind)
               for kind in (TypeError, ValueError, IndexError))


def _check_values(got: np.ndarray, want: np.ndarray, where: str) -> None:
    assert (got.shape, got.dtype) == (want.shape, want.dtype), where
    if want.dtype.kind == "f":
        tolerance = 1e-4 if want.dtype == np.float32 else 1e-9
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance, equal_nan=True,
                                   err_msg=where)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


@pytest.mark.timeout(240)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_random_chains_match_numpy(meshes):
    rng = random.Random(26)
    for example in range(EXAMPLES):
        count = rng.randint(1, 5)
        mesh = meshes[count]
        shape = tuple(rng.choice([0, 1, 2, 3, 5, 8, 11]) for _ in range(rng.randint(1, 3)))
        dtype = rng.choice(DTYPES)
        ref = np.random.default_rng(example).integers(-4, 5, shape).astype(dtype)
        axis = rng.randrange(len(shape))
        x = mesh.asarray(ref, axis=axis)
        history = [f"example {example}: {shape} {dtype} on {count} devices, split {axis}"]
        for _ in range(rng.randint(1, 6)):
            op, name = _step(rng, mesh, x, ref)
            history.append(name)
            where = " -> ".join(history)
            with np.errstate(all="ignore"):
                try:
                    want = op(ref)
                except (TypeError, ValueError, IndexError) as exc:
                    with pytest.raises(Exception) as refused:
                        op(x)
                    assert _same_refusal(exc, refused.value), (where, exc, refused.value)
                    history.append("refused")
                    continue
            got = op(x)
            want = np.asarray(want)
            if not isinstance(got, ShardedTensor):  # an int along the split axis: one device
                assert isinstance(got, fabric.Tensor), where
                _check_values(got.numpy(), want, where)
                break
            assert (got.shape, got.dtype) == (want.shape, want.dtype), where
            x, ref = got, want
        _check_values(x.numpy(), ref, " -> ".join(history))


# -- refusals ------------------------------------------------------------------------------------

def test_ops_that_would_move_data_are_refused_naming_the_reshard(meshes):
    mesh = meshes[3]
    values = np.arange(24.0).reshape(6, 4)
    x = mesh.asarray(values, axis=0)
    with pytest.raises(ValueError, match=r"reshard"):
        x + x.reshard(axis=1)
    with pytest.raises(ValueError, match=r"mesh\.asarray\(array, axis=0\)"):
        x + np.ones((6, 1))
    with pytest.raises(ValueError, match="spans the split axis"):
        x * mesh.replicate(np.ones((6, 4)))
    with pytest.raises(TypeError, match=r"mesh\.replicate\(t\)"):
        x + mesh.sessions[0].ones(4)
    with pytest.raises(TypeError, match=r"reshard"):
        x.reshape(24)
    with pytest.raises(TypeError, match=r"reshard"):
        np.concatenate([x, x])
    with pytest.raises(ValueError, match=r"cumsum along axis 0 .*\(x\.reshard\(axis=1\)"):
        np.cumsum(x, axis=0)
    with pytest.raises(ValueError, match=r"sort along axis 0 .*\(x\.reshard\(axis=1\)"):
        np.sort(x, axis=0)
    with pytest.raises(ValueError, match=r"cumprod flattened .*\(mesh\.replicate\(x\)"):
        x.cumprod()
    with pytest.raises(ValueError, match=r"\(mesh\.replicate\(x\)"):
        np.argsort(x[:, 0])
    with pytest.raises(TypeError, match=r"reshard"):
        x.to(mesh.sessions[0])
    with pytest.raises(ValueError, match=r"mesh\.replicate\(b\)"):
        x @ x.T.reshard(axis=1)
    with pytest.raises(ValueError, match="spans the split axis"):  # batches of another split
        mesh.asarray(np.ones((6, 4, 4)), axis=0) @ mesh.replicate(np.ones((6, 4, 2)))
    with pytest.raises(TypeError, match="x.shards"):
        x[np.array([0, 2])]
    with pytest.raises(ValueError, match="positive step"):
        x[::-1]
    with pytest.raises(TypeError, match="x = x @ y"):  # (in place: elementwise ops only)
        x @= mesh.replicate(np.eye(4))
    with pytest.raises(TypeError, match="where="):
        x.sum(where=np.ones((6, 4), bool))
    # numpy's own errors, at the call, with the whole array's shapes
    with pytest.raises(ValueError, match=r"\(6, 4\)"):
        x + np.ones(3)
    with pytest.raises(IndexError):
        x[6]
    with pytest.raises(np.exceptions.AxisError):
        x.sum(axis=2)
    assert x.numpy().tobytes() == values.tobytes()  # nothing was harmed


def test_reshard_and_replicate_move_identical_bytes_worker_to_worker(meshes):
    mesh = meshes[4]
    values = np.random.default_rng(5).standard_normal((9, 5))
    x = mesh.asarray(values, axis=0)
    uploaded = [s.stats()["bytes_uploaded"] for s in mesh.sessions]
    columns = x.reshard(axis=1)
    assert columns.sharding.axis == 1 and columns.sharding.blocks == (2, 1, 1, 1)
    assert columns.numpy().tobytes() == values.tobytes()
    rebalanced = x[3:].rebalance()  # uneven blocks made even again
    assert x[3:].sharding.blocks == (0, 2, 2, 2) and rebalanced.sharding.blocks == (2, 2, 1, 1)
    assert rebalanced.numpy().tobytes() == values[3:].tobytes()
    copies = mesh.replicate(columns)
    assert copies.sharding.replicated
    assert all(t.numpy().tobytes() == values.tobytes() for _, t in copies.shards)
    back = copies.reshard(axis=0)
    assert back.numpy().tobytes() == values.tobytes()
    assert [s.stats()["bytes_uploaded"] for s in mesh.sessions] == uploaded  # none from here
    assert x.reshard(axis=0) is x


def test_a_device_lost_mid_chain_poisons_what_touches_it():
    with fabric.LocalCluster(workers=3, heartbeat=0.2) as cluster, cluster.connect() as parent:
        mesh = parent.mesh()
        x = mesh.asarray(np.arange(30.0).reshape(10, 3), axis=0)
        y = np.sin(x) * 2
        assert y.sum().numpy() == pytest.approx(2 * np.sin(np.arange(30.0)).sum())
        cluster.workers[1].kill()
        cluster.workers[1].wait()
        z = y + 1  # queued on every device, the lost one's too
        with pytest.raises(SessionLost, match="device 1"):
            z.numpy()
        with pytest.raises(SessionLost, match="device 1"):
            z.max().numpy()
        with pytest.raises(SessionLost, match="device 1"):
            (z * 3).sum(axis=1).numpy()
        mesh.close()  # the lost session's close is not waited for
        with parent.mesh(devices=[0, 2]) as others:  # the other devices still serve
            assert others.asarray(np.arange(4), axis=0).sum().numpy() == 6
