"""The array API standard on sharded tensors (issue 43): ``x.__array_namespace__()`` of a
tensor split across a mesh of real devices (a broker and two workers of two devices each)
runs what runs on each shard and combines, compared with numpy; what needs another device's
data is refused with the move after which it runs. Libraries take it unchanged:
array-api-extra's functions, and scikit-learn's StandardScaler, PCA and Ridge
(``array_api_dispatch=True``), their results within 1e-8 of the same on numpy, the bytes read
back from the devices counted on each of the mesh's sessions. The same on a mesh of a jax
worker's two XLA CPU devices: scikit-learn's fits, and some of the namespace's functions.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from typing import Any, Callable

import numpy as np
import pytest

import fabric
from fabric.mesh.sharded import ShardedTensor

from sklearn_fits import fit_in_a_child
from test_array_api_consumers import EXTRA, as_numpy, assert_same, compat_numpy, inputs

pytestmark = pytest.mark.timeout(120)


BACKENDS = ["numpy", pytest.param("jax", marks=pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="jax is not installed"))]


@pytest.fixture(scope="module")
def mesh(request: pytest.FixtureRequest):
    """Four numpy devices (two workers of two), or where a test asks for "jax", a jax worker's
    two XLA CPU devices (the last tests of this file, so that one cluster runs at a time)."""
    backend = getattr(request, "param", "numpy")
    layout = {"workers": 1, "backend": "jax"} if backend == "jax" else {"workers": 2}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAX_PLATFORMS", "cpu")  # (on a GPU host too: its CPU's devices)
        # (a jax device compiles each op it has not run before: seconds on a busy machine)
        with fabric.LocalCluster(devices_per_worker=2, **layout) as cluster, \
                cluster.connect(timeout=60) as parent:
            yield parent.mesh()


def bytes_read(mesh: Any) -> int:
    return sum(session.stats()["bytes_read"] for session in mesh.sessions)


def reads_of(mesh: Any, call: Callable[[], Any]) -> tuple[Any, int]:
    """``call()``'s result, and the bytes the mesh's sessions read back for it."""
    before = bytes_read(mesh)
    result = call()
    return result, bytes_read(mesh) - before


VALUES = np.random.default_rng(43).normal(size=(11, 4))
M = np.mean(VALUES, axis=0)
# (the call on the namespace and x (VALUES split along its rows), the most bytes it reads)
CASES: dict[str, tuple[Callable[[Any, Any], Any], int]] = {
    "sin": (lambda xp, x: xp.sin(x), 0),
    "scalar operand": (lambda xp, x: xp.multiply(x, 2), 0),
    "clip": (lambda xp, x: xp.clip(x, min=-0.5, max=0.5), 0),
    "where": (lambda xp, x: xp.where(x > 0, x, 0.0), 0),
    "sum across devices": (lambda xp, x: xp.sum(x, axis=0), 0),
    "mean of everything": (lambda xp, x: xp.mean(x), 0),
    "var": (lambda xp, x: xp.var(x, axis=0, correction=1), 0),
    "max along rows": (lambda xp, x: xp.max(x, axis=1), 0),
    "vector_norm": (lambda xp, x: xp.linalg.vector_norm(x, axis=1), 0),
    "astype": (lambda xp, x: xp.astype(x, xp.float32), 0),
    "Gram matrix": (lambda xp, x: xp.matmul(xp.matrix_transpose(x), x), 0),
    "mT @": (lambda xp, x: x.mT @ x, 0),
    "rows @ replicated": (lambda xp, x: x @ xp.ones((4, 2), dtype=xp.float64), 0),
    "centered": (lambda xp, x: x - xp.mean(x, axis=0), 4 * 8 * 4),  # (the mean, to each)
    "reshape keeping the split axis": (lambda xp, x: xp.reshape(xp.sum(x, axis=1), (-1, 1)), 0),
    "expand_dims": (lambda xp, x: xp.expand_dims(x, axis=0), 0),
    "broadcast_to": (lambda xp, x: xp.broadcast_to(x[:, :1], (11, 4)), 0),
    "sort along the rows": (lambda xp, x: xp.sort(x, descending=True), 0),
    "argsort along axis 1": (lambda xp, x: xp.argsort(x, axis=1), 0),
    "flip": (lambda xp, x: xp.flip(x, axis=-1), 0),
    "roll": (lambda xp, x: xp.roll(x, 1, axis=1), 0),
    "diff": (lambda xp, x: xp.diff(x, axis=1, n=2), 0),
    "cumulative_sum with the initial": (lambda xp, x: xp.cumulative_sum(
        x, axis=1, include_initial=True), 0),
    # (along the split axis: each device's total read, the carry added on each device)
    "cumulative_sum along the split axis": (lambda xp, x: xp.cumulative_sum(
        x, axis=0, include_initial=True), 4 * 4 * 8),
    "cumulative_prod of a split vector": (lambda xp, x: xp.cumulative_prod(x[:, 0]), 4 * 8),
    # (moved worker to worker so that the axis lies whole on each device, and back)
    "sort along the split axis": (lambda xp, x: xp.sort(x, axis=0, descending=True), 0),
    "argsort of a split vector": (lambda xp, x: xp.argsort(x[:, 1]), 0),
    "concat along the split axis": (lambda xp, x: xp.concat(
        [x, x[2:], xp.ones((1, 4), dtype=xp.float32)]), 0),
    "concat along another axis": (lambda xp, x: xp.concat([x, x], axis=1), 0),
    "zeros_like": (lambda xp, x: xp.zeros_like(x, dtype=xp.int32), 0),
    "full": (lambda xp, x: xp.full((3, 2), 1.5, device=x.device), 0),
    "asarray": (lambda xp, x: xp.asarray([1, 2, 3]), 0),
    "eigh of a combined matrix": (lambda xp, x: xp.linalg.eigvalsh(x.mT @ x), 4 * 16 * 8),
    "svd of a tall matrix": (lambda xp, x: xp.linalg.svd(x, full_matrices=False).S, 4 * 16 * 8),
    # (the partial sums, once, and each device's length of the result)
    "masked replicated": (lambda xp, x: (lambda s: s[s > 0])(xp.sum(x, axis=0)), 4 * 32 + 64),
    # (a mask split alike selects on each device: uneven blocks, each device's count learned)
    "a mask of rows split alike": (lambda xp, x: x[x[:, 0] > 0], 0),
    "a mask of every element": (lambda xp, x: x[x > 0], 0),
    "a mask and slices": (lambda xp, x: x[x[:, 0] > 0, 1:3, None], 0),
    "nonzero's column indexes": (lambda xp, x: xp.nonzero(x > 0)[1], 0),
    "nonzero's row indexes": (lambda xp, x: xp.nonzero(x > 0)[0], 0),
    "count_nonzero": (lambda xp, x: xp.count_nonzero(x > 0, axis=0), 0),
    "stack": (lambda xp, x: xp.stack([x, 2 * x], axis=1), 0),
    "squeeze": (lambda xp, x: xp.squeeze(x[:, 1:2], axis=1), 0),
    # (the set functions read each device's distinct values, with counts and first indexes
    # where asked: 11 rows of 4 rounded to about 9 values, 8 bytes each)
    "unique_values": (lambda xp, x: xp.unique_values(xp.round(2 * x)), 4 * 10 * 8),
    "unique_counts' counts": (lambda xp, x: xp.unique_counts(xp.round(2 * x)).counts,
                              4 * 10 * 16),
    "unique_inverse's inverse": (lambda xp, x: xp.unique_inverse(
        xp.round(2 * x)).inverse_indices, 4 * 10 * 8),
    "unique_all's indices": (lambda xp, x: xp.unique_all(xp.round(2 * x)).indices,
                             4 * 10 * 24),
    "unique_all's values of a split vector": (lambda xp, x: xp.unique_all(
        xp.round(x[:, 0])).values, 4 * 10 * 24),
}


def expected_of(name: str) -> np.ndarray:
    numpy = {"sin": np.sin(VALUES), "scalar operand": VALUES * 2,
             "clip": np.clip(VALUES, -0.5, 0.5), "where": np.where(VALUES > 0, VALUES, 0.0),
             "sum across devices": VALUES.sum(0), "mean of everything": VALUES.mean(),
             "var": VALUES.var(0, ddof=1), "max along rows": VALUES.max(1),
             "vector_norm": np.linalg.norm(VALUES, axis=1),
             "astype": VALUES.astype(np.float32), "Gram matrix": VALUES.T @ VALUES,
             "mT @": VALUES.T @ VALUES, "rows @ replicated": VALUES @ np.ones((4, 2)),
             "centered": VALUES - M, "reshape keeping the split axis": VALUES.sum(1)[:, None],
             "expand_dims": VALUES[None], "broadcast_to": np.broadcast_to(VALUES[:, :1], (11, 4)),
             "sort along the rows": -np.sort(-VALUES), "argsort along axis 1": np.argsort(
                 VALUES, axis=1, kind="stable"), "flip": VALUES[:, ::-1],
             "roll": np.roll(VALUES, 1, axis=1), "diff": np.diff(VALUES, axis=1, n=2),
             "cumulative_sum with the initial": np.concatenate(
                 [np.zeros((11, 1)), np.cumsum(VALUES, axis=1)], axis=1),
             "cumulative_sum along the split axis": np.concatenate(
                 [np.zeros((1, 4)), np.cumsum(VALUES, axis=0)]),
             "cumulative_prod of a split vector": np.cumprod(VALUES[:, 0]),
             "sort along the split axis": -np.sort(-VALUES, axis=0),
             "argsort of a split vector": np.argsort(VALUES[:, 1], kind="stable"),
             "concat along the split axis": np.concatenate([VALUES, VALUES[2:], np.ones((1, 4))]),
             "concat along another axis": np.concatenate([VALUES, VALUES], axis=1),
             "zeros_like": np.zeros((11, 4), np.int32), "full": np.full((3, 2), 1.5),
             "asarray": np.array([1, 2, 3]),
             "eigh of a combined matrix": np.linalg.eigvalsh(VALUES.T @ VALUES),
             "svd of a tall matrix": np.linalg.svd(VALUES, compute_uv=False),
             "masked replicated": VALUES.sum(0)[VALUES.sum(0) > 0],
             "a mask of rows split alike": VALUES[VALUES[:, 0] > 0],
             "a mask of every element": VALUES[VALUES > 0],
             "a mask and slices": VALUES[VALUES[:, 0] > 0, 1:3, None],
             "nonzero's column indexes": np.nonzero(VALUES > 0)[1],
             "nonzero's row indexes": np.nonzero(VALUES > 0)[0],
             "count_nonzero": np.count_nonzero(VALUES > 0, axis=0),
             "stack": np.stack([VALUES, 2 * VALUES], axis=1),
             "squeeze": VALUES[:, 1],
             "unique_values": np.unique_values(np.round(2 * VALUES)),
             "unique_counts' counts": np.unique_counts(np.round(2 * VALUES)).counts,
             "unique_inverse's inverse": np.unique_inverse(np.round(2 * VALUES)).inverse_indices,
             "unique_all's indices": np.unique_all(np.round(2 * VALUES)).indices,
             "unique_all's values of a split vector": np.unique_values(np.round(VALUES[:, 0]))}
    return numpy[name]


@pytest.mark.parametrize("name", list(CASES))
def test_the_namespace_runs_on_each_shard_and_combines(mesh, name: str) -> None:
    call, most_bytes = CASES[name]
    x = mesh.asarray(VALUES, axis=0)
    xp = x.__array_namespace__()
    found, read = reads_of(mesh, lambda: call(xp, x))
    assert isinstance(found, ShardedTensor), type(found)
    assert read <= most_bytes, f"{name} read {read} bytes"
    expected = expected_of(name)
    values = found.numpy()
    assert (values.dtype, values.shape) == (expected.dtype, expected.shape), name
    np.testing.assert_allclose(values, expected, rtol=1e-8, atol=1e-8)


def test_the_namespace_of_a_mesh_and_its_device(mesh) -> None:
    x = mesh.asarray(VALUES, axis=0)
    xp = x.__array_namespace__()
    assert xp == mesh.replicate(VALUES).__array_namespace__()  # one namespace per mesh
    assert x.device is mesh and xp.__array_namespace_info__().devices() == (mesh,)
    assert xp.zeros(3, device=x.device).device is mesh
    assert x.to_device(mesh) is x
    assert np.array_equal(x.to_device("cpu"), VALUES)  # (the explicit read)
    with pytest.raises(ValueError, match="api_version|revisions"):
        x.__array_namespace__(api_version="2019.12")
    with pytest.raises(ValueError, match="mesh"):
        xp.zeros(3, device=mesh.sessions[0].device)
    with pytest.raises(TypeError, match=r"mesh\.replicate\(t\)"):
        xp.add(x, mesh.sessions[0].ones(4))


def test_the_namespace_has_the_one_device_namespaces_signatures(mesh) -> None:
    xp = mesh.replicate(VALUES).__array_namespace__()
    one = mesh.sessions[0].asarray(VALUES).__array_namespace__()
    for name in ("sin", "sum", "zeros", "meshgrid", "astype", "isin", "reshape"):
        assert inspect.signature(getattr(xp, name)) == inspect.signature(getattr(one, name))
    for extension, name in (("linalg", "svd"), ("linalg", "vector_norm"), ("fft", "fftfreq")):
        assert inspect.signature(getattr(getattr(xp, extension), name)) == \
            inspect.signature(getattr(getattr(one, extension), name))


def test_in_place_updates_run_on_each_shard(mesh) -> None:
    x = mesh.asarray(VALUES, axis=0)
    x -= x.__array_namespace__().mean(x, axis=0)
    x *= 2
    np.testing.assert_allclose(x.numpy(), (VALUES - M) * 2, rtol=1e-12)
    gram = x.mT @ x  # (partial products, combined when read)
    gram /= 10
    np.testing.assert_allclose(gram.numpy(), 4 * (VALUES - M).T @ (VALUES - M) / 10, rtol=1e-12)
    copies = mesh.replicate(np.zeros(4))
    copies[copies.__array_namespace__().asarray([True, False, True, False])] = 1.0
    assert [t.numpy().tolist() for _, t in copies.shards] == [[1.0, 0.0, 1.0, 0.0]] * 4


def test_assignment_by_index_runs_on_each_devices_block(mesh) -> None:
    x = mesh.asarray(VALUES, axis=0)
    xp = x.__array_namespace__()
    expected = VALUES.copy()
    mask, numpy_mask = x[:, 0] > 0, VALUES[:, 0] > 0
    before = bytes_read(mesh)
    for index, value in [(5, np.arange(4.0)), ((slice(3, 9, 2), 1), 7.0), ((..., 2), 0.25),
                         ((slice(None, None, -3), 3), -1.0),
                         (slice(1, 10), np.arange(36.0).reshape(9, 4))]:
        x[index] = value
        expected[index] = value
    x[2:9] = mesh.replicate(np.arange(28.0).reshape(7, 4))  # (each device cuts its copy)
    expected[2:9] = np.arange(28.0).reshape(7, 4)
    x[mask] = mesh.replicate(np.full(4, 3.0))
    expected[numpy_mask] = 3.0
    x[x > 20] = 0.5
    expected[expected > 20] = 0.5
    assert bytes_read(mesh) == before  # (nothing read: each device assigns its own block)
    np.testing.assert_array_equal(x.numpy(), expected)
    y, doubled, before = x * 2, expected * 2, bytes_read(mesh)
    x[3:8] = y[3:8]  # (split alike: each device's block of the value)
    expected[3:8] = doubled[3:8]
    x[mask] = y[mask] + 1  # (each device's count read, to cut the value: 8 bytes each)
    expected[numpy_mask] = doubled[numpy_mask] + 1
    assert bytes_read(mesh) == before + 8 * len(mesh.sessions)
    np.testing.assert_array_equal(x.numpy(), expected)
    labels = xp.ones(11)  # (made replicated, assigned by a split mask: split as it is)
    labels[mask] = 0.0
    assert labels.sharding.blocks == x.sharding.blocks
    np.testing.assert_array_equal(labels.numpy(), np.where(numpy_mask, 0.0, 1.0))
    # A replicated tensor that a view sees (or that is a view) is not split so: the view
    # would read the other devices' blocks stale from its device's copy
    shared = xp.ones(11)
    tail = shared[-3:]
    for target, split_mask in ((shared, mask), (tail, mesh.asarray(np.array([1, 0, 1]) > 0,
                                                                   axis=0))):
        with pytest.raises(ValueError, match=r"x = x\.copy\(\)"):
            target[split_mask] = 0.0
    np.testing.assert_array_equal(tail.numpy(), np.ones(3))


def round_trips(mesh: Any) -> int:
    return sum(session.stats()["round_trips"] for session in mesh.sessions)


def test_ops_of_combined_results_wait_for_one_read_of_each_device(mesh) -> None:
    """scikit-learn's PCA computes its covariance so: each result combined from every
    device's partials stays unread until its value is needed, the ops of such results
    composed on the client, then each device's partials read at once, in one array."""
    x = mesh.asarray(VALUES, axis=0)
    xp = x.__array_namespace__()
    before = round_trips(mesh)
    mean = xp.asarray(xp.mean(x, axis=0))
    covariance = x.mT @ x
    covariance -= 11 * xp.reshape(mean, (-1, 1)) * xp.reshape(mean, (1, -1))
    covariance /= 10
    finite = xp.isfinite(xp.astype(covariance, xp.float32))
    assert round_trips(mesh) == before  # (nothing read yet)
    np.testing.assert_allclose(covariance.numpy(), np.cov(VALUES.T), rtol=1e-12)
    assert round_trips(mesh) == before + len(mesh.sessions)  # (the mean's and the Gram's)
    assert covariance.numpy().dtype == np.float64 and round_trips(mesh) == before + 4
    assert finite.numpy().all() and round_trips(mesh) == before + 4  # (of what was read)
    with pytest.raises(TypeError):  # (numpy's casting, at the call)
        mean_copy = xp.astype(xp.sum(x, axis=0), xp.int64)
        mean_copy += 0.5
    assert xp.linalg.eigvalsh(covariance).numpy() == pytest.approx(
        np.linalg.eigvalsh(np.cov(VALUES.T)), rel=1e-10)  # (uploaded, nothing read again)


@pytest.mark.parametrize("name", ["unique_values", "unique_counts", "unique_inverse",
                                  "unique_all"])
def test_set_functions_merge_each_devices_own_as_numpy_does(mesh, name: str) -> None:
    """NaNs each apart (numpy's and the standard's), some devices' blocks empty."""
    values = np.array([1.0, 2.0, 3.0, np.nan, 3.0, np.nan, 2.0, -0.0, 0.0])
    x = mesh.asarray(values, axis=0)[3:]  # (blocks [0, 2, 2, 2]: a NaN on two devices)
    assert x.sharding.blocks == (0, 2, 2, 2)
    found = getattr(x.__array_namespace__(), name)(x)
    expected = getattr(np, name)(values[3:])
    found, expected = ((found,), (expected,)) if name == "unique_values" else (found, expected)
    for each, wanted in zip(found, expected):
        assert each.numpy().dtype == wanted.dtype, name
        np.testing.assert_array_equal(each.numpy(), wanted)
    if name in ("unique_inverse", "unique_all"):  # (the inverse stays split as x)
        assert found[-2 if name == "unique_all" else 1].sharding.blocks == x.sharding.blocks


def test_numpys_nonzero_of_a_split_tensor_runs_on_each_device(mesh) -> None:
    x = mesh.asarray(VALUES, axis=0)
    found, read = reads_of(mesh, lambda: np.nonzero(x > 0.5))
    assert read == 0 and all(isinstance(f, ShardedTensor) for f in found)
    for each, expected in zip(found, np.nonzero(VALUES > 0.5)):
        np.testing.assert_array_equal(each.numpy(), expected)
    copies = np.nonzero(mesh.replicate(VALUES) > 0.5)  # (on each copy)
    np.testing.assert_array_equal(copies[1].numpy(), np.nonzero(VALUES > 0.5)[1])


def test_the_same_reduction_of_unchanged_shards_reads_nothing_again(mesh) -> None:
    """scikit-learn checks X finite at each step of a fit (``xp.isfinite(xp.sum(X))``), of
    copies of X too: the same reduction of the same shards' values (or of a copy's) takes the
    partials read before; an update in place makes new values, read again."""
    x = mesh.asarray(VALUES, axis=0)
    xp = x.__array_namespace__()
    assert bool(xp.isfinite(xp.sum(x)))
    before = round_trips(mesh)
    assert bool(xp.isfinite(xp.sum(xp.asarray(x))))
    copied = xp.asarray(x, copy=True)  # (a copy holds the same values: check_array's)
    assert bool(xp.isfinite(xp.sum(copied))) and bool(xp.isfinite(xp.sum(x.copy())))
    assert float(xp.sum(x)) == pytest.approx(VALUES.sum()) and round_trips(mesh) == before
    x[0] = np.inf
    assert not bool(xp.isfinite(xp.sum(x)))
    assert round_trips(mesh) == before + len(mesh.sessions)
    assert bool(xp.isfinite(xp.sum(copied)))  # (its values, read before the update)
    assert round_trips(mesh) == before + len(mesh.sessions)
    copied[1] = np.nan
    assert not bool(xp.isfinite(xp.sum(copied)))


# (the call on a row-split x, the words its refusal says)
REFUSED = {
    "flip of every axis": (lambda xp, x: xp.flip(x), r"x\.reshard"),
    "reshape mixing rows": (lambda xp, x: xp.reshape(x, (-1,)), r"x\.reshard"),
    "concat split otherwise": (lambda xp, x: xp.concat([x, x.reshard(1)]), r"x\.reshard"),
    "concat of other widths": (lambda xp, x: xp.concat([x, x[:, :2]]), "match exactly"),
    "inv": (lambda xp, x: xp.linalg.inv(x), r"x\.reshard"),
    "svd of all of U": (lambda xp, x: xp.linalg.svd(x), r"mesh\.replicate\(x\)"),
    "a mask split otherwise": (lambda xp, x: x[x.reshard(1) > 0], r"x\.reshard"),
    "nonzero of columns split": (lambda xp, x: xp.nonzero(x.reshard(1) > 0), r"x\.reshard"),
    "stack split otherwise": (lambda xp, x: xp.stack([x, x.reshard(1)]), r"x\.reshard"),
    "squeeze of the split axis": (lambda xp, x: xp.squeeze(x[:1], axis=0), r"x\.reshard"),
    "assigning by integer arrays": (lambda xp, x: x.__setitem__([0, 2], 1.0), r"x\.shards"),
    "assigning a value split otherwise": (lambda xp, x: x.__setitem__(slice(0, 5), x[6:]),
                                          r"x\.reshard"),
    "assigning of another shape": (lambda xp, x: x.__setitem__(slice(0, 5), np.ones((4, 4))),
                                   "could not broadcast"),
    "@ mixing rows": (lambda xp, x: x @ x.mT, r"mesh\.replicate"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_what_needs_other_devices_data_is_refused_before_anything_is_read(mesh,
                                                                        name: str) -> None:
    call, words = REFUSED[name]
    x = mesh.asarray(VALUES, axis=0)
    before = bytes_read(mesh)
    with pytest.raises((TypeError, ValueError), match=words):
        call(x.__array_namespace__(), x)
    assert bytes_read(mesh) == before
    assert np.array_equal(x.numpy(), VALUES)


# array-api-extra's functions that run on tensors split along their first axis (partition
# by sorting along it, moved worker to worker; updates by basic index or a mask split alike,
# padding and set functions, on each device's block); the others need another device's rows
# (updates and takes by integer arrays, searches, covariances of split variables, kron)
EXTRA_ON_A_MESH = ["angle", "apply_where", "apply_where two functions", "at add mask",
                   "at divide", "at max", "at multiply", "at power", "at set", "at subtract",
                   "atleast_nd", "broadcast_shapes", "default_dtype", "deg2rad", "rad2deg",
                   "diag_indices", "tril_indices", "triu_indices", "expand_dims", "isclose",
                   "lazy_apply", "nan_to_num", "nanmax", "nanmin", "nansum", "nanmean",
                   "nunique", "one_hot", "pad", "pad pairs", "partition", "setdiff1d", "sinc",
                   "union1d", "unravel_index"]

# (the set functions read each device's distinct values, with their counts: at most twice the
# 8 ints' 64 bytes)
SET_READS = {"nunique": 128, "setdiff1d": 128, "union1d": 128}


@pytest.mark.parametrize("name", sorted(set(EXTRA) - set(EXTRA_ON_A_MESH)))
def test_array_api_extra_refuses_with_a_typed_error(mesh, name: str) -> None:
    call, _ = EXTRA[name]
    tensors = {key: mesh.asarray(value, axis=0) for key, value in inputs().items()}
    with warnings.catch_warnings(), pytest.raises((TypeError, ValueError),
                                                  match=r"reshard|replicate|x\.shards"):
        warnings.simplefilter("ignore", DeprecationWarning)
        call(tensors["a"].__array_namespace__(), tensors)


@pytest.mark.parametrize("name", EXTRA_ON_A_MESH)
def test_array_api_extra_runs_on_a_mesh(mesh, name: str) -> None:
    call, most_bytes = EXTRA[name]
    local = inputs()
    tensors = {key: mesh.asarray(value, axis=0) for key, value in local.items()}
    xp = tensors["a"].__array_namespace__()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (broadcast_shapes's: 2025.12's)
        warnings.simplefilter("ignore", RuntimeWarning)  # (numpy's, of NaNs, on both sides)
        found, read = reads_of(mesh, lambda: call(xp, tensors))
        expected = call(compat_numpy, local)
    # (what it branches on, from each device that holds a part: a byte or a partial each)
    assert read <= SET_READS.get(name, max(most_bytes, 1) * 64), f"{name} read back {read} bytes"
    if name == "default_dtype":
        assert found == expected
        return
    results = found if isinstance(found, tuple) else (found,)
    assert all(isinstance(r, ShardedTensor) or not isinstance(r, np.ndarray) for r in results)
    assert_same(as_numpy(found), as_numpy(expected), name)


# -- scikit-learn -----------------------------------------------------------------------------

# (case, the most bytes its fit may read back from the devices: X is 4000 x 8 float64,
# 256,000 bytes, split over 2 devices; LDA, GaussianNB and LogisticRegression take the
# classes by unique_values and the rows of each by a mask split as X is)
SKLEARN = {"standard_scaler": 2048, "pca_covariance_eigh": 4096, "pca_full": 4096,
           "ridge": 4096, "lda": 4096, "gaussian_nb": 4096, "accuracy_score": 256,
           "logistic_regression": 4096, "min_max_scaler": 2048}
# (the rest return a result split along X's rows)
SCALARS = {"accuracy_score", "logistic_regression"}
# (on a mesh of jax devices, the first four: each further fit's ops compile there, half a
# minute more in all on a busy machine; they all pass there too)
NUMPY_ONLY = {"lda", "gaussian_nb", "accuracy_score", "logistic_regression", "min_max_scaler"}


@pytest.fixture(scope="module", params=BACKENDS)
def fitted(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    pytest.importorskip("sklearn")
    names = sorted(SKLEARN) if request.param == "numpy" else sorted(set(SKLEARN) - NUMPY_ONLY)
    return fit_in_a_child(request.param, "mesh", names)


@pytest.mark.timeout(300)  # (the first test sets the child's fits up: a minute on jax)
@pytest.mark.parametrize("case", sorted(SKLEARN))
def test_scikit_learn_fits_on_a_mesh(fitted: dict[str, dict[str, Any]], case: str) -> None:
    if case not in fitted:
        pytest.skip("run on a mesh of numpy devices only: a jax device compiles each new "
                    "op, and the mesh's namespace is the same")
    result = fitted[case]
    assert result["difference"] <= 1e-8, result
    kind = "tensor" if case in SCALARS else "split along rows"
    assert result["kind"] == kind, f"{case}'s result is not split as X is: {result}"
    assert result["bytes"] <= SKLEARN[case], f"{case} read back more than it branches on"


# -- a mesh of jax devices --------------------------------------------------------------------

# (the namespace's cases that run on each jax device's shard and combine)
ON_JAX = ["sin", "where", "sum across devices", "var", "astype", "Gram matrix", "centered",
          "sort along the rows", "cumulative_sum along the split axis",
          "sort along the split axis", "concat along the split axis", "svd of a tall matrix",
          "masked replicated"]


@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
@pytest.mark.parametrize("mesh", ["jax"], indirect=True)
@pytest.mark.parametrize("name", ON_JAX)
def test_the_namespace_runs_on_a_mesh_of_jax_devices(mesh, name: str) -> None:
    test_the_namespace_runs_on_each_shard_and_combines(mesh, name)
