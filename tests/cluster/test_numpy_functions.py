"""End-to-end parity with numpy for its everyday functions on tensors: linear algebra
(``inv``, ``solve``, ``det``, ``eig``, ``eigh``, ``svd``, ``qr``, ``cholesky``, ``slogdet``,
``lstsq``, ``pinv``, ``matrix_rank``, ``norm`` with every ``ord``), ``cov``, ``corrcoef``,
``median``, ``percentile``/``quantile``, the ``nan`` family, ``average``, ``ptp``,
``histogram``, ``searchsorted``, ``lexsort``, ``interp``, ``convolve``, ``array_equal``,
``np.fft``, ``ufunc.reduce``/``accumulate``, ``pad``, ``meshgrid``, ``bincount``, ``take``,
``diag``, ``split``/``array_split``, ``append``, ``flipud``/``fliplr``, ``atleast_*d``,
``may_share_memory``, ``tensordot``, the NaN-skipping functions (``nansum``, ``nanmean``, ...)
and the reductions' ``where=``.

Each is checked against numpy over the dtypes it takes, on the numpy device, on a numexpr
device whose inputs are deferred chains, and (the functions new with the statistics, the
transforms and the decompositions) on the jax device: the shape and dtype known before
anything is read (or, for ``bincount``, ``eig``'s dtype and ``lstsq``'s residuals, learned from
the device at the call), then the values; where numpy refuses at the call, fabric refuses
alike. Nothing is mocked.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from test_tensor_ops import DTYPES, compare, data, expect_same, poisoned

from fabric import Tensor
from fabric.core.errors import RemoteError

# Functions of a (3, 4) array t and a positive one u, over every dtype (numpy's refusals
# included: an axis out of range, a float bincount).
EVERYDAY = {
    "np.flipud": lambda t, u: np.flipud(t),
    "np.flipud 0-d": lambda t, u: np.flipud(t[0, 0]),
    "np.fliplr": lambda t, u: np.fliplr(t),
    "np.fliplr 1-d": lambda t, u: np.fliplr(t[0]),
    "np.atleast_1d": lambda t, u: np.atleast_1d(t[0, 0]),
    "np.atleast_2d": lambda t, u: np.atleast_2d(t[0]),
    "np.atleast_3d 1-d": lambda t, u: np.atleast_3d(t[0]),
    "np.atleast_3d 2-d": lambda t, u: np.atleast_3d(t),
    "np.atleast_2d several": lambda t, u: np.atleast_2d(t[0, 0], u)[0],
    "np.median": lambda t, u: np.median(t),
    "np.median axis keepdims": lambda t, u: np.median(t, axis=0, keepdims=True),
    "np.percentile": lambda t, u: np.percentile(t, 30),
    "np.percentile qs axis": lambda t, u: np.percentile(t, [10, 50, 95], axis=1),
    "np.percentile out of range": lambda t, u: np.percentile(t, 130),
    "np.quantile method": lambda t, u: np.quantile(t, [[0.2], [0.7]], axis=0, method="nearest"),
    "np.pad": lambda t, u: np.pad(t, 1),
    "np.pad pairs constant": lambda t, u: np.pad(t, ((0, 2), (1, 0)), constant_values=3),
    "np.pad edge": lambda t, u: np.pad(t, (2, 1), mode="edge"),
    "np.pad wrap": lambda t, u: np.pad(t[0], 3, mode="wrap"),
    "np.pad negative": lambda t, u: np.pad(t, -1),
    "np.meshgrid": lambda t, u: np.meshgrid(t[0], u[1, :2])[0],
    "np.meshgrid ij": lambda t, u: np.meshgrid(t[0], u[1, :2], t[2, :3], indexing="ij")[2],
    "np.meshgrid sparse": lambda t, u: np.meshgrid(t[0], u[1], sparse=True)[1],
    "np.bincount": lambda t, u: np.bincount(u.ravel()),
    "np.bincount minlength": lambda t, u: np.bincount(u[0], minlength=9),
    "np.bincount weights": lambda t, u: np.bincount(u[0], weights=t[1]),
    "np.take": lambda t, u: np.take(t, [2, 0, 2]),
    "np.take axis": lambda t, u: np.take(t, [[3, 0]], axis=1),
    "np.take wrap": lambda t, u: np.take(t, [5, -7], axis=1, mode="wrap"),
    "np.take clip scalar": lambda t, u: np.take(t, 9, axis=0, mode="clip"),
    "np.take out of bounds": lambda t, u: np.take(t, [4], axis=1),
    "np.diag": lambda t, u: np.diag(t),
    "np.diag k": lambda t, u: np.diag(t, 2),
    "np.diag k=-1": lambda t, u: np.diag(t, -1),
    "np.diag 1-d": lambda t, u: np.diag(t[0]),
    "np.diag 1-d k": lambda t, u: np.diag(t[1], -2),
    "np.split": lambda t, u: np.split(t, 2, axis=1)[1],
    "np.split indices": lambda t, u: np.split(t, [1, -1])[1],
    "np.split unequal": lambda t, u: np.split(t, 3, axis=1),
    "np.array_split": lambda t, u: np.array_split(t, 3, axis=1)[0],
    "np.array_split last": lambda t, u: np.array_split(t[0], 3)[2],
    "np.append": lambda t, u: np.append(t, u),
    "np.append axis": lambda t, u: np.append(t, u[:1], axis=0),
    "np.append list": lambda t, u: np.append(t[0], [1, 2]),
    "np.sum where": lambda t, u: np.sum(t, where=u > 2),
    "t.sum where axis": lambda t, u: t.sum(axis=0, where=u > 1),
    "np.prod where keepdims": lambda t, u: np.prod(t, axis=1, keepdims=True, where=u != 1),
    "np.mean where": lambda t, u: np.mean(t, axis=1, where=u > 1),
    "np.std where": lambda t, u: np.std(t, where=[True, False, True, True]),
    "np.max where initial": lambda t, u: np.max(t, axis=0, where=u > 2, initial=-1),
    "np.min where without initial": lambda t, u: np.min(t, where=u > 2),
    "np.any where": lambda t, u: np.any(t, axis=1, where=u > 3),
    "t.all where": lambda t, u: t.all(where=u > 1),
    "np.sum where bad shape": lambda t, u: np.sum(t, where=u[:, :1, None] > 2),
    "np.argmax where": lambda t, u: np.argmax(t, where=u > 2),
}
# The results of sums and square roots (numpy's order of operations may differ)
APPROX_EVERYDAY = {
    "np.cov": lambda t, u: np.cov(t),
    "np.cov rowvar bias": lambda t, u: np.cov(t, rowvar=False, bias=True),
    "np.cov y ddof": lambda t, u: np.cov(t[0], u[1], ddof=0),
    "np.cov dtype": lambda t, u: np.cov(t, dtype=np.float32),
    "np.cov 3-d": lambda t, u: np.cov(t[None]),
    "np.linalg.norm ord=2": lambda t, u: np.linalg.norm(t, 2),
    "np.linalg.norm fro": lambda t, u: np.linalg.norm(t, "fro"),
    "np.linalg.norm inf": lambda t, u: np.linalg.norm(t, np.inf),
    "np.linalg.norm -inf": lambda t, u: np.linalg.norm(t, -np.inf),
    "np.linalg.norm 1": lambda t, u: np.linalg.norm(t, 1),
    "np.linalg.norm -1 keepdims": lambda t, u: np.linalg.norm(t, -1, keepdims=True),
    "np.linalg.norm nuc": lambda t, u: np.linalg.norm(t, "nuc"),
    "np.linalg.norm -2": lambda t, u: np.linalg.norm(t, -2),
    "np.linalg.norm vector inf": lambda t, u: np.linalg.norm(t[0], np.inf),
    "np.linalg.norm vector 0": lambda t, u: np.linalg.norm(t, 0, axis=1),
    "np.linalg.norm vector 3": lambda t, u: np.linalg.norm(u, 3, axis=0),
    "np.linalg.norm vector 2": lambda t, u: np.linalg.norm(t[1], 2),
    "np.linalg.norm axes": lambda t, u: np.linalg.norm(t[None], 1, axis=(2, 1)),
    "np.linalg.norm bad": lambda t, u: np.linalg.norm(t, "fro", axis=0),
    "np.linalg.norm bad matrix": lambda t, u: np.linalg.norm(t, 3),
    "np.linalg.norm 3-d": lambda t, u: np.linalg.norm(t[None], 1),
    "np.tensordot": lambda t, u: np.tensordot(t, u),
    "np.tensordot pairs": lambda t, u: np.tensordot(t, u[None], ([1, 0], [2, 1])),
    "np.tensordot one axis each": lambda t, u: np.tensordot(t, u.T, (1, 0)),
    "np.tensordot outer": lambda t, u: np.tensordot(t[0], u, 0),
    "np.tensordot mismatch": lambda t, u: np.tensordot(t, u, 1),
}


# Statistics of a (3, 4) array t (nans in two places where its dtype holds them) and a
# positive one u, over every dtype
STATISTICS = {
    "np.nansum": lambda t, u: np.nansum(t),
    "np.nansum axis dtype": lambda t, u: np.nansum(t, axis=0, dtype=np.float32),
    "np.nanprod keepdims": lambda t, u: np.nanprod(t, axis=1, keepdims=True),
    "np.nanmean": lambda t, u: np.nanmean(t, axis=0),
    "np.nanstd ddof": lambda t, u: np.nanstd(t, axis=1, ddof=1),
    "np.nanvar": lambda t, u: np.nanvar(t),
    "np.nanmin": lambda t, u: np.nanmin(t, axis=1),
    "np.nanmax initial": lambda t, u: np.nanmax(t, axis=0, initial=2),
    "np.nanargmin": lambda t, u: np.nanargmin(t, axis=0),
    "np.nanargmax flat": lambda t, u: np.nanargmax(t),
    "np.nanmedian": lambda t, u: np.nanmedian(t, axis=1),
    "np.nanpercentile": lambda t, u: np.nanpercentile(t, [20, 80], axis=0),
    "np.nanquantile": lambda t, u: np.nanquantile(t, 0.3),
    "np.ptp": lambda t, u: np.ptp(t, axis=1),
    "np.ptp flat": lambda t, u: np.ptp(u),
    "np.average": lambda t, u: np.average(t),
    "np.average weights": lambda t, u: np.average(t, axis=1, weights=u[0]),
    "np.average weights keepdims": lambda t, u: np.average(t, axis=0, weights=u,
                                                           keepdims=True),
    "np.average returned": lambda t, u: np.average(t, axis=0, weights=u[:, 0],
                                                   returned=True)[1],
    "np.average weights of another axis": lambda t, u: np.average(t, axis=0, weights=u[0]),
    "np.average axes in another order": lambda t, u: np.average(t, axis=(1, 0), weights=u.T,
                                                                returned=True)[1],
    "np.histogram": lambda t, u: np.histogram(u, bins=4)[0],
    "np.histogram edges": lambda t, u: np.histogram(u, bins=4)[1],
    "np.histogram given edges": lambda t, u: np.histogram(u, bins=[0.5, 1, 2, 4.5],
                                                          weights=t, density=True)[0],
    "np.histogram range": lambda t, u: np.histogram(u, bins=3, range=(1, 3))[0],
    "np.histogram no bins": lambda t, u: np.histogram(u, bins=0),
    "np.histogram_bin_edges": lambda t, u: np.histogram_bin_edges(u, 5),
    "np.searchsorted": lambda t, u: np.searchsorted(np.sort(u.ravel()), t),
    "np.searchsorted sorter": lambda t, u: np.searchsorted(u[0], t[1], side="right",
                                                           sorter=np.argsort(u[0])),
    "np.lexsort": lambda t, u: np.lexsort((t[0], u[0])),
    "np.lexsort rows": lambda t, u: np.lexsort(u),
    "np.lexsort shapes": lambda t, u: np.lexsort((t[0], u)),
    "np.interp": lambda t, u: np.interp(t, [0, 1, 2], [1, -1, 3]),
    "np.interp tensor points": lambda t, u: np.interp(t, np.sort(u[0]), u[1], left=-9),
    "np.interp lengths": lambda t, u: np.interp(t, u[0], u[1, :3]),
    "np.convolve": lambda t, u: np.convolve(t[0], u[1]),
    "np.convolve same": lambda t, u: np.convolve(t[1], u[0, :2], mode="same"),
    "np.convolve valid": lambda t, u: np.convolve(u[0, :2], t[1], mode="valid"),
    "np.add.reduce": lambda t, u: np.add.reduce(t, axis=0),
    "np.add.reduce where": lambda t, u: np.add.reduce(t, axis=1, where=u > 1),
    "np.maximum.reduce keepdims": lambda t, u: np.maximum.reduce(t, axis=1, keepdims=True),
    "np.logical_or.reduce flat": lambda t, u: np.logical_or.reduce(t, axis=None),
    "np.subtract.reduce axes": lambda t, u: np.subtract.reduce(t, axis=(0, 1)),
    "np.multiply.accumulate": lambda t, u: np.multiply.accumulate(u, axis=1),
    "np.add.accumulate dtype": lambda t, u: np.add.accumulate(t, axis=0, dtype=np.float64),
}
# ... within rounding: the correlations and the transforms
APPROX_STATISTICS = {
    "np.corrcoef": lambda t, u: np.corrcoef(u),
    "np.corrcoef y": lambda t, u: np.corrcoef(u[0], u[2], rowvar=False),
    "np.corrcoef dtype": lambda t, u: np.corrcoef(u, dtype=np.float32),
    "np.fft.fft": lambda t, u: np.fft.fft(u),
    "np.fft.ifft n": lambda t, u: np.fft.ifft(u, n=6),
    "np.fft.rfft axis": lambda t, u: np.fft.rfft(u, axis=0),
    "np.fft.irfft": lambda t, u: np.fft.irfft(u),
    "np.fft.hfft": lambda t, u: np.fft.hfft(u, n=5),
    "np.fft.ihfft": lambda t, u: np.fft.ihfft(u),
    "np.fft.fft2": lambda t, u: np.fft.fft2(u),
    "np.fft.ifft2 s": lambda t, u: np.fft.ifft2(u, s=(2, 6)),
    "np.fft.rfft2": lambda t, u: np.fft.rfft2(u, norm="ortho"),
    "np.fft.irfft2": lambda t, u: np.fft.irfft2(u),
    "np.fft.fftn axes": lambda t, u: np.fft.fftn(u, axes=(0,)),
    "np.fft.ifftn": lambda t, u: np.fft.ifftn(u, norm="forward"),
    "np.fft.rfftn": lambda t, u: np.fft.rfftn(u),
    "np.fft.irfftn s": lambda t, u: np.fft.irfftn(u, s=(3, 4), axes=(0, 1)),
    "np.fft.fftshift": lambda t, u: np.fft.fftshift(u),
    "np.fft.ifftshift axes": lambda t, u: np.fft.ifftshift(u, axes=1),
    "np.fft.fft bad norm": lambda t, u: np.fft.fft(u, norm="sideways"),
    "np.fft.fft no points": lambda t, u: np.fft.fft(u, n=0),
}


def _with_nans(array):
    """``array`` with nans in two places (no slice of nans only) where its dtype holds
    them."""
    if array.dtype.kind == "f":
        array = array.copy()
        array[0, 0] = array[1, 2] = np.nan
    return array


@pytest.mark.filterwarnings("ignore:Mean of empty slice")  # (numpy's own, of a mask of none)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(EVERYDAY))
def test_everyday_functions(session, name, dtype):
    expect_same(session, EVERYDAY[name], data(dtype, seed=70),
                data(dtype, kind="positive", seed=71).astype(np.int64) if "bincount" in name
                else data(dtype, kind="positive", seed=71), label=name)
    session.sync()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(APPROX_EVERYDAY))
def test_everyday_functions_within_rounding(session, name, dtype):
    expect_same(session, APPROX_EVERYDAY[name], data(dtype, seed=72),
                data(dtype, kind="positive", seed=73), approx=True, label=name)
    session.sync()


# numpy's NaN-skipping functions, of a (3, 4) array holding NaNs, infinities and a row of
# NaNs alone (the dtypes without NaN: the plain functions); the same values, not only close
NAN_FUNCTIONS = {
    "np.nansum": lambda t: np.nansum(t),
    "np.nansum axis dtype": lambda t: np.nansum(t, axis=0, dtype=np.float64),
    "np.nanprod keepdims": lambda t: np.nanprod(t, axis=1, keepdims=True),
    "np.nancumsum": lambda t: np.nancumsum(t, axis=1),
    "np.nancumprod flattened": lambda t: np.nancumprod(t),
    "np.nanmean": lambda t: np.nanmean(t),
    "np.nanmean axis": lambda t: np.nanmean(t, axis=1),
    "np.nanvar ddof": lambda t: np.nanvar(t, axis=1, ddof=1),
    "np.nanvar ddof past the count": lambda t: np.nanvar(t[:, :2], axis=0, ddof=2),
    "np.nanstd keepdims": lambda t: np.nanstd(t, axis=0, keepdims=True),
    "np.nanmin": lambda t: np.nanmin(t, axis=1),
    "np.nanmax keepdims": lambda t: np.nanmax(t, axis=0, keepdims=True),
    "np.nanmax of nothing": lambda t: np.nanmax(t[:0], axis=0),
}


def _nan_data(dtype):
    t = data(dtype, kind="special", seed=76)
    if t.dtype.kind == "c":
        t = t + 1j * data("float64", kind="special", seed=77)[::-1]
    if t.dtype.kind in "fc":
        t[1] = np.nan
    return t


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # (numpy's, of slices of NaNs alone)
@pytest.mark.parametrize("dtype", [*DTYPES, "complex128"])
@pytest.mark.parametrize("name", list(NAN_FUNCTIONS))
def test_nan_skipping_functions(session, name, dtype):
    """(An all-NaN slice's nanargmin is the statistics tests': the device refuses it.)"""
    before = session.stats()["reads"]
    expect_same(session, NAN_FUNCTIONS[name], _nan_data(dtype), label=name)
    assert session.stats()["reads"] - before <= 1  # (the result's, alone, if any)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(STATISTICS))
def test_statistics(session, name, dtype):
    expect_same(session, STATISTICS[name], _with_nans(data(dtype, seed=80)),
                data(dtype, kind="positive", seed=81), label=name)
    session.sync()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(APPROX_STATISTICS))
def test_statistics_within_rounding(session, name, dtype):
    expect_same(session, APPROX_STATISTICS[name], data(dtype, seed=82),
                data(dtype, kind="positive", seed=83), approx=True, label=name)
    session.sync()


def test_array_equal_and_allclose_answer_a_python_bool_as_numpys(session):
    local = _with_nans(data("float64", seed=84))
    t = session.asarray(local)
    for other in (local, local + 1, local[:2], np.nan_to_num(local)):
        for equal_nan in (False, True):
            assert np.array_equal(t, session.asarray(other), equal_nan) is \
                np.array_equal(local, other, equal_nan)
    assert np.array_equal(t, local[:2]) is False  # (the shapes differ: nothing is read)
    assert np.allclose(t, t, equal_nan=True) is True and np.allclose(t, t) is False


def _matrix(m):
    """A well-conditioned matrix (diagonally dominant) from a (3, 4) array, numpy's or not."""
    return m[:, :3] + 12 * np.eye(3, dtype=m.dtype if m.dtype.kind == "f" else None)


def _symmetric(m):
    square = _matrix(m)
    return square + square.T


def _positive_definite(m):
    square = _matrix(m)
    return square @ square.T


# Linear algebra of well-conditioned matrices (numpy's LAPACK runs on the worker: its very
# results, whatever the sign conventions)
LINALG = {
    "inv": lambda t, u: np.linalg.inv(_matrix(t)),
    "inv batched": lambda t, u: np.linalg.inv(np.stack([_matrix(t), _matrix(u)])),
    "inv not square": lambda t, u: np.linalg.inv(t),
    "inv 1-d": lambda t, u: np.linalg.inv(t[0]),
    "det": lambda t, u: np.linalg.det(_matrix(t)),
    "det batched": lambda t, u: np.linalg.det(np.stack([_matrix(t), _matrix(u)])),
    "solve vector": lambda t, u: np.linalg.solve(_matrix(t), u[0, :3]),
    "solve matrix": lambda t, u: np.linalg.solve(_matrix(t), u[:, 1:]),
    "solve batched": lambda t, u: np.linalg.solve(np.stack([_matrix(t)] * 2), u[None, :, :2]),
    "solve mismatch": lambda t, u: np.linalg.solve(_matrix(t), u[0]),
    "eig values": lambda t, u: np.linalg.eig(_symmetric(t))[0],
    "eig vectors": lambda t, u: np.linalg.eig(_symmetric(t)).eigenvectors,
    "eig not square": lambda t, u: np.linalg.eig(t),
    "eigh values": lambda t, u: np.linalg.eigh(_symmetric(t))[0],
    "eigh vectors U": lambda t, u: np.linalg.eigh(_symmetric(t), UPLO="U")[1],
    "svd U": lambda t, u: np.linalg.svd(t)[0],
    "svd S": lambda t, u: np.linalg.svd(t).S,
    "svd Vh": lambda t, u: np.linalg.svd(t)[2],
    "svd thin Vh": lambda t, u: np.linalg.svd(t, full_matrices=False)[2],
    "svd values": lambda t, u: np.linalg.svd(np.stack([t, u]), compute_uv=False),
    "qr Q": lambda t, u: np.linalg.qr(t)[0],
    "qr R": lambda t, u: np.linalg.qr(t).R,
    "qr complete Q": lambda t, u: np.linalg.qr(t.T, mode="complete").Q,
    "qr r": lambda t, u: np.linalg.qr(t, mode="r"),
    "qr bad mode": lambda t, u: np.linalg.qr(t, mode="sideways"),
    "slogdet sign": lambda t, u: np.linalg.slogdet(_matrix(t))[0],
    "slogdet log": lambda t, u: np.linalg.slogdet(np.stack([_matrix(t), _matrix(u)])).logabsdet,
    "cholesky": lambda t, u: np.linalg.cholesky(_positive_definite(t)),
    "cholesky upper": lambda t, u: np.linalg.cholesky(_positive_definite(u), upper=True),
    "cholesky not square": lambda t, u: np.linalg.cholesky(t),
    "pinv": lambda t, u: np.linalg.pinv(t),
    "pinv rcond": lambda t, u: np.linalg.pinv(t, rcond=0.1),
    "pinv rtol None": lambda t, u: np.linalg.pinv(u, rtol=None),
    "pinv hermitian": lambda t, u: np.linalg.pinv(_symmetric(t), hermitian=True),
    "pinv both": lambda t, u: np.linalg.pinv(t, rcond=0.1, rtol=0.1),
    "matrix_rank": lambda t, u: np.linalg.matrix_rank(t),
    "matrix_rank tol": lambda t, u: np.linalg.matrix_rank(t, tol=0.5),
    "matrix_rank deficient": lambda t, u: np.linalg.matrix_rank(np.stack([t[0], t[0] * 2])),
    "lstsq x": lambda t, u: np.linalg.lstsq(t.T, u[0])[0],
    "lstsq residuals": lambda t, u: np.linalg.lstsq(t.T, u[0])[1],
    "lstsq rank": lambda t, u: np.linalg.lstsq(t.T, u[0])[2],
    "lstsq s": lambda t, u: np.linalg.lstsq(t.T, u[0])[3],
    "lstsq matrix": lambda t, u: np.linalg.lstsq(t.T, u.T, rcond=1e-3)[0],
    "lstsq matrix residuals": lambda t, u: np.linalg.lstsq(t.T, u.T)[1],
    "lstsq deficient residuals": lambda t, u: np.linalg.lstsq(
        np.stack([t[0], t[0]], axis=1), u[1])[1],
    "lstsq mismatch": lambda t, u: np.linalg.lstsq(t, u[0]),
}


@pytest.mark.parametrize("dtype", ["int64", "float32", "float64"])
@pytest.mark.parametrize("name", list(LINALG))
def test_linear_algebra(session, name, dtype):
    expect_same(session, LINALG[name], data(dtype, seed=74),
                data(dtype, kind="positive", seed=75), approx=True, label=name)
    session.sync()


def test_decompositions_are_numpys_result_types_and_eig_learns_its_dtype(session):
    rotation = np.array([[0.0, -1.0], [1.0, 0.0]])  # eigenvalues +-i: numpy's are complex
    for matrix in (rotation, np.diag([2.0, 3.0])):  # ... and here real
        expected, got = np.linalg.eig(matrix), np.linalg.eig(session.asarray(matrix))
        assert type(got) is type(expected)
        for want, have in zip(expected, got):
            assert isinstance(have, Tensor) and have.dtype == want.dtype
            np.testing.assert_allclose(have.numpy(), want)
    assert type(np.linalg.svd(session.eye(3))) is type(np.linalg.svd(np.eye(3)))
    assert type(np.linalg.eigh(session.eye(3))) is type(np.linalg.eigh(np.eye(3)))


def test_a_singular_matrix_fails_at_the_read_naming_the_op(session):
    inverse = np.linalg.inv(session.zeros((3, 3)))  # (numpy raises at the call: the values
    assert inverse.shape == (3, 3)  # are on the device)
    with pytest.raises(RemoteError, match="inv.*Singular matrix"):
        inverse.numpy()


def test_may_share_memory_for_views_and_other_handles(session):
    a = session.asarray(data("float64", seed=76))
    b = a.copy()
    assert np.may_share_memory(a, a[1:]) and np.may_share_memory(a[0], a.T)
    assert np.shares_memory(np.diag(a), a)
    assert not np.may_share_memory(a, b) and not np.may_share_memory(a, a + 1)
    assert not np.may_share_memory(a, data("float64", seed=76))


def test_diag_of_a_matrix_is_a_read_only_view_and_split_gives_views(session):
    local = data("float64", seed=77)
    a = session.asarray(local)
    diagonal, (left, right) = np.diag(a), np.split(a, 2, axis=1)
    with pytest.raises(ValueError, match="read-only"):
        diagonal[0] = 5
    a[1, 1] = 9.0  # the diagonal sees it, as numpy's view does
    right[0] = -1.0  # a write through a split reaches the array, as numpy's
    local[1, 1], local[0, 2:] = 9.0, -1.0
    np.testing.assert_array_equal(diagonal.numpy(), np.diag(local))
    np.testing.assert_array_equal(a.numpy(), local)
    np.testing.assert_array_equal(left.numpy(), local[:, :2])


def test_data_dependent_lengths_and_new_functions_stay_remote(session):
    t = poisoned(session)  # any read would raise RemoteError; the round trip of bincount too
    results = [np.flipud(t), np.atleast_2d(t), np.median(t), np.percentile(t, 50),
               np.pad(t, 1), np.meshgrid(t, t)[0], np.take(t, [1]), np.diag(t),
               np.split(t, 2)[0], np.append(t, t), np.sum(t, where=t > 0), np.cov(t),
               np.linalg.norm(t, 1), np.linalg.det(np.outer(t, t)), np.nanmean(t),
               np.nanpercentile(t, 5), np.average(t, weights=t), np.ptp(t), np.corrcoef(t, t),
               *np.histogram(t), np.searchsorted(t, t), np.lexsort((t,)), np.interp(t, t, t),
               np.convolve(t, t), np.add.reduce(t), np.fft.fft(t), np.fft.fftshift(t),
               *np.linalg.qr(np.outer(t, t)), *np.linalg.slogdet(np.outer(t, t)),
               np.linalg.pinv(np.outer(t, t)), np.linalg.matrix_rank(np.outer(t, t))]
    assert all(isinstance(r, Tensor) for r in results)
    with pytest.raises(RemoteError):
        np.bincount(t)  # its length is learned at the call: the op's error is raised there
    with pytest.raises(RemoteError):  # (lstsq's residuals' too)
        np.linalg.lstsq(np.outer(t, t), t)
    with pytest.raises(RemoteError):
        results[-1].numpy()


@pytest.mark.parametrize("call, error", [
    (lambda t: np.median(t, out=t), TypeError),
    (lambda t: np.percentile(t, 50, weights=t), TypeError),
    (lambda t: np.cov(t, fweights=[1, 2]), TypeError),
    (lambda t: np.pad(t, 1, mode=lambda *a: None), TypeError),
    (lambda t: np.pad(t, 1.5), TypeError),
    (lambda t: np.linalg.eigh(t, UPLO="X"), ValueError),
    (lambda t: np.diag(t[None, None]), ValueError),
    (lambda t: np.meshgrid(t, indexing="yx"), ValueError),
    (lambda t: np.histogram(t, bins="auto"), TypeError),
    (lambda t: np.nanmedian(t, out=t), TypeError),
    (lambda t: np.linalg.qr(np.outer(t, t), mode="raw"), TypeError),
    (lambda t: np.fft.fft(t, out=t), TypeError),
], ids=["median out", "percentile weights", "cov weights", "pad function", "pad float",
        "eigh UPLO", "diag 3-d", "meshgrid indexing", "histogram rule", "nanmedian out",
        "qr raw", "fft out"])
def test_forms_fabric_does_not_take_are_refused_at_the_call_saying_what_to_do(session, call,
                                                                              error):
    t = poisoned(session)
    with pytest.raises(error):
        call(t)


# numpy's functions that check an empty axis before anything else, on a (0, 3) array
EMPTY_AXES = {
    "np.take": lambda t: np.take(t, [0, -1], axis=0),
    "np.take wrap": lambda t: np.take(t, 1, axis=0, mode="wrap"),
    "np.quantile lower": lambda t: np.quantile(t, 0.5, axis=0, method="lower"),
    "np.percentile": lambda t: np.percentile(t, [25, 50]),
    "np.ptp": lambda t: np.ptp(t, axis=0),
    "np.pad edge": lambda t: np.pad(t, 1, mode="edge"),
}


@pytest.mark.parametrize("dtype", ["bool", "float64"])
@pytest.mark.parametrize("name", list(EMPTY_AXES))
def test_an_empty_axis_is_refused_at_the_call_with_numpys_words(session, name, dtype):
    empty = np.empty((0, 3), dtype)
    with pytest.raises(Exception) as numpys:
        EMPTY_AXES[name](empty)
    with pytest.raises(type(numpys.value)) as refused:
        EMPTY_AXES[name](session.asarray(empty))
    assert str(refused.value) == str(numpys.value)


@pytest.mark.filterwarnings("ignore:Mean of empty slice")  # (numpy's, of the where= of none)
@pytest.mark.parametrize("table", [EVERYDAY, APPROX_EVERYDAY, LINALG, STATISTICS,
                                   APPROX_STATISTICS],
                         ids=["everyday", "rounding", "linalg", "statistics", "transforms"])
def test_the_numexpr_device_gives_numpys_results_from_deferred_inputs(numexpr_session, table):
    local_t, local_u = data("float64", seed=78), data("float64", kind="positive", seed=79)
    for name, function in table.items():
        # (each input a deferred chain on the device: the functions take its evaluation)
        t = numexpr_session.asarray(local_t) * 1.0 + 0.0
        u = numexpr_session.asarray(local_u) * 1.0 + 0.0
        if "bincount" in name:
            local, remote = local_u.astype(np.int64), u.astype(np.int64)
            compare(lambda: function(local_t, local), lambda: function(t, remote), label=name)
        else:
            compare(lambda: function(local_t, local_u), lambda: function(t, u), approx=True,
                    label=name)
    numexpr_session.sync()


def _within(local, remote, rtol, label):
    """As ``compare``, the values within ``rtol`` (complex ones too): XLA's transforms and
    decompositions round otherwise than numpy's, and in single precision where numpy's are
    single precision (float32 in, float32 out) or are cast from double precision."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = np.asarray(local())
    except Exception as exc:
        with pytest.raises(type(exc)):
            remote()
        return
    got = remote()
    assert isinstance(got, Tensor) and (got.shape, got.dtype) == (expected.shape,
                                                                  expected.dtype), label
    single = expected.dtype in (np.float32, np.complex64)
    np.testing.assert_allclose(got.numpy(), expected, rtol=max(rtol, 1e-4 * single),
                               atol=max(rtol, 1e-4 * single), equal_nan=True, err_msg=label)


@pytest.mark.timeout(300)  # (XLA compiles each new op signature on its first call)
@pytest.mark.parametrize("dtype", ["int32", "float32", "float64"])
@pytest.mark.parametrize("table", [STATISTICS, APPROX_STATISTICS, LINALG],
                         ids=["statistics", "transforms", "linalg"])
def test_the_jax_device_gives_numpys_results(jax_session, table, dtype):
    local_t = data(dtype, seed=85)
    local_t = _with_nans(local_t) if table is STATISTICS else local_t
    local_u = data(dtype, kind="positive", seed=86)
    t, u = jax_session.asarray(local_t), jax_session.asarray(local_u)
    rtol = 1e-9 if dtype == "float64" else 1e-4
    for name, function in table.items():
        if "vectors" not in name:  # (their signs are each library's own choice)
            _within(lambda: function(local_t, local_u), lambda: function(t, u), rtol,
                    f"{name} {dtype}")
    jax_session.sync()


def test_the_jax_device_refuses_what_numpy_refuses_on_the_values(jax_session):
    nans = jax_session.asarray(np.array([[np.nan, 1.0], [np.nan, 2.0]]))
    for call, error in [(lambda: np.nanargmin(nans, axis=0), "All-NaN slice"),
                        (lambda: np.average(nans, axis=1, weights=[1, -1]), "sum to zero"),
                        (lambda: np.histogram(nans, bins=[2, 1, 3])[0], "monotonically")]:
        with pytest.raises(RemoteError, match=error):
            call().numpy()
