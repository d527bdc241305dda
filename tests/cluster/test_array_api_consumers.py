"""Libraries written against the array API standard, other than scikit-learn, on fabric tensors
(issue 43, item 5): array-api-extra's public functions, and xarray's ``DataArray`` wrapping a
tensor.

Each call runs on a real cluster's tensors and on numpy arrays (array-api-compat's namespace
for numpy, which array-api-extra picks for them itself, or an xarray ``DataArray`` of the same
values): the same dtype, shape and values, and the result is still a fabric tensor (inside
the DataArray). What the client read back meanwhile, counted by the session's stats, is
only what the library branches on: a byte or a few, never the data.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest

from fabric import Tensor

xpx = pytest.importorskip("array_api_extra")
xr = pytest.importorskip("xarray")
compat_numpy = pytest.importorskip("array_api_compat.numpy")


def inputs() -> dict[str, np.ndarray]:
    """The arrays every case takes, fresh (``xpx.at`` updates its target in place where it
    can, on numpy and on fabric alike)."""
    rng = np.random.default_rng(43)
    v = rng.normal(size=6)
    v[2] = np.nan
    a = rng.normal(size=(5, 4))
    a[1, 2] = np.nan
    return {"a": a, "v": v, "ints": np.array([3, 1, 2, 3, 5, 1, 0, 7]),
            "sorted": np.array([-1.5, 0.0, 0.0, 2.0, 9.0]),
            "z": rng.normal(size=4) + 1j * rng.normal(size=4), "b": rng.normal(size=(5, 4))}


def finite(d: dict[str, Any]) -> Any:
    return d["b"]  # (without NaNs: for the functions that divide, sort or power)


Case = Callable[[Any, dict[str, Any]], Any]
# array-api-extra's public functions: (the call, given the namespace and the inputs; the most
# bytes it may read back). Where the result is not determined (partition's order), the call
# takes what is.
EXTRA: dict[str, tuple[Case, int]] = {
    "angle": (lambda xp, d: xpx.angle(d["z"], deg=True), 0),
    "apply_where": (lambda xp, d: xpx.apply_where(d["v"] > 0, d["v"], xp.sqrt,
                                                  fill_value=-1.0), 0),
    "apply_where two functions": (lambda xp, d: xpx.apply_where(
        finite(d) > 0, (finite(d), d["a"]), lambda x, y: x * y, lambda x, y: x - y), 0),
    "argpartition": (lambda xp, d: xp.sort(xp.take(
        d["ints"], xpx.argpartition(d["ints"], 3)[:4])), 0),
    "partition": (lambda xp, d: xpx.partition(finite(d), 2, axis=0)[2, :], 0),
    "at set": (lambda xp, d: xpx.at(d["v"], slice(1, 3)).set(0.5), 0),
    "at add mask": (lambda xp, d: xpx.at(finite(d), finite(d) > 0).add(1.0, copy=True), 0),
    "at subtract": (lambda xp, d: xpx.at(d["a"])[..., 0].subtract(2.0), 0),
    "at multiply": (lambda xp, d: xpx.at(d["a"], (0, 1)).multiply(3.0), 0),
    "at divide": (lambda xp, d: xpx.at(d["a"], 1).divide(2.0), 0),
    "at power": (lambda xp, d: xpx.at(finite(d), (0, slice(1, 3))).power(2), 0),
    "at min integer array": (lambda xp, d: xpx.at(d["a"], (slice(None), d["ints"][:3])).min(
        0.0), 0),
    "at max": (lambda xp, d: xpx.at(d["ints"], slice(None, 4)).max(2), 0),
    "atleast_nd": (lambda xp, d: xpx.atleast_nd(d["v"], ndim=3), 0),
    "broadcast_shapes": (lambda xp, d: xpx.broadcast_shapes(d["a"].shape, (3, 1, 4)), 0),
    "cov": (lambda xp, d: xpx.cov(finite(d)), 0),
    "cov axis": (lambda xp, d: xpx.cov(finite(d), axis=0, correction=0), 0),
    "create_diagonal": (lambda xp, d: xpx.create_diagonal(d["v"], offset=-1), 0),
    "default_dtype": (lambda xp, d: xpx.default_dtype(xp, "integral"), 0),
    "deg2rad": (lambda xp, d: xpx.deg2rad(d["a"]), 0),
    "rad2deg": (lambda xp, d: xpx.rad2deg(d["a"]), 0),
    "diag_indices": (lambda xp, d: xpx.diag_indices(3, ndim=3, xp=xp), 0),
    "tril_indices": (lambda xp, d: xpx.tril_indices(4, offset=-1, xp=xp), 0),
    "triu_indices": (lambda xp, d: xpx.triu_indices(3, offset=1, m=5, xp=xp), 0),
    "expand_dims": (lambda xp, d: xpx.expand_dims(d["a"], axis=(0, -1)), 0),
    "isclose": (lambda xp, d: xpx.isclose(d["v"], d["v"] + 1e-9, equal_nan=True), 0),
    "isin": (lambda xp, d: xpx.isin(d["ints"], d["ints"][:3]), 0),
    "isin invert": (lambda xp, d: xpx.isin(d["ints"], d["ints"][2:4], invert=True), 0),
    "kron": (lambda xp, d: xpx.kron(d["a"], d["a"][:2, :3]), 0),
    "lazy_apply": (lambda xp, d: xpx.lazy_apply(lambda x: x * 2, d["ints"],
                                                shape=(8,), dtype=xp.int64), 0),
    "nan_to_num": (lambda xp, d: xpx.nan_to_num(d["v"] / 0.0, fill_value=-1.0), 0),
    # (``if xp.any(mask)``: whether any slice is all NaN, one byte)
    "nanmax": (lambda xp, d: xpx.nanmax(d["a"], axis=0), 1),
    "nanmin": (lambda xp, d: xpx.nanmin(d["v"]), 1),
    "nansum": (lambda xp, d: xpx.nansum(d["a"], axis=1), 0),
    "nanmean": (lambda xp, d: xpx.nanmean(d["a"]), 0),
    "nunique": (lambda xp, d: xpx.nunique(d["ints"]), 0),
    "one_hot": (lambda xp, d: xpx.one_hot(d["ints"], 8, dtype=xp.float32), 0),
    "pad": (lambda xp, d: xpx.pad(d["a"], 2, constant_values=1.5), 0),
    "pad pairs": (lambda xp, d: xpx.pad(d["a"], ((1, 0), (0, 2))), 0),
    "searchsorted": (lambda xp, d: xpx.searchsorted(d["sorted"], finite(d), side="right"), 0),
    "setdiff1d": (lambda xp, d: xpx.setdiff1d(d["ints"], d["ints"][:3]), 0),
    "sinc": (lambda xp, d: xpx.sinc(d["a"]), 0),
    "union1d": (lambda xp, d: xpx.union1d(d["ints"], d["ints"][:3] + 10), 0),
    "unravel_index": (lambda xp, d: xpx.unravel_index(d["ints"], (2, 4)), 0),
}
# Its names that are no function of arrays
NOT_FUNCTIONS = {"__version__", "testing"}


def test_every_public_function_of_array_api_extra_has_a_case() -> None:
    covered = {name.split()[0] if not name.startswith("at ") else "at" for name in EXTRA}
    missing = set(xpx.__all__) - NOT_FUNCTIONS - covered
    assert not missing, f"array-api-extra {xpx.__version__} adds {sorted(missing)}: add cases"


def as_numpy(result: Any) -> Any:
    """The values of a result of either side: arrays as numpy arrays, tuples item by item."""
    if isinstance(result, (tuple, list)):
        return tuple(as_numpy(r) for r in result)
    return result.numpy() if isinstance(result, Tensor) else np.asarray(result)


def assert_same(found: Any, expected: Any, label: str) -> None:
    if isinstance(expected, tuple):
        assert isinstance(found, tuple) and len(found) == len(expected), label
        for f, e in zip(found, expected):
            assert_same(f, e, label)
        return
    assert (found.dtype, found.shape) == (expected.dtype, expected.shape), label
    np.testing.assert_allclose(found, expected, rtol=1e-12, atol=1e-12, equal_nan=True,
                               err_msg=label)


def on_device(result: Any) -> bool:
    """Whether every array of ``result`` is a tensor (a shape or a dtype is none)."""
    if isinstance(result, (tuple, list)):
        return all(on_device(r) for r in result)
    return isinstance(result, Tensor) or not isinstance(result, (np.ndarray, np.generic))


def reads_of(session: Any, call: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
    """``call()``'s result, and the reads the session made for it."""
    before = session.stats()
    result = call()
    after = session.stats()
    return result, {key: after[key] - before[key] for key in ("reads", "bytes_read")}


@pytest.mark.parametrize("name", list(EXTRA))
def test_array_api_extra_runs_on_the_device(session, name: str) -> None:
    call, most_bytes = EXTRA[name]
    local = inputs()
    tensors = {key: session.asarray(value) for key, value in local.items()}
    xp = tensors["a"].__array_namespace__()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (broadcast_shapes's: 2025.12's)
        warnings.simplefilter("ignore", RuntimeWarning)  # (numpy's, of NaNs, on both sides)
        found, read = reads_of(session, lambda: call(xp, tensors))
        expected = call(compat_numpy, local)
    assert on_device(found), f"{name} returned {type(found).__name__}, not tensors"
    assert read["bytes_read"] <= most_bytes, f"{name} read back more than it branches on: {read}"
    if name == "default_dtype":
        assert found == expected
    else:
        assert_same(as_numpy(found), as_numpy(expected), name)


# -- xarray --------------------------------------------------------------------------------

def data_arrays(make: Callable[[np.ndarray], Any]) -> tuple[Any, Any]:
    """Two DataArrays of other dimensions, their data made by ``make`` (a tensor, or the
    numpy array itself): temperatures over time, x and y with a NaN, and weights over x
    and z."""
    rng = np.random.default_rng(5)
    values = rng.normal(size=(6, 4, 3))
    values[2, 1, 0] = np.nan
    temperature = xr.DataArray(make(values), dims=("time", "x", "y"),
                               coords={"time": np.arange(6), "x": [10, 20, 30, 40]},
                               name="temperature")
    weights = xr.DataArray(make(rng.normal(size=(4, 5))), dims=("x", "z"),
                           coords={"x": [10, 20, 30, 40]})
    return temperature, weights


# xarray's operations on a DataArray of a tensor: (the operation; the most bytes it may read)
XARRAY: dict[str, tuple[Callable[[Any, Any], Any], int]] = {
    "arithmetic": (lambda t, w: (t * 2 + 1) / (abs(t) + 1) - t ** 2, 0),
    "numpy ufunc": (lambda t, w: np.exp(np.sin(t)), 0),
    "mean over time": (lambda t, w: t.mean("time"), 0),
    "mean over two dimensions": (lambda t, w: t.mean(("x", "y")), 0),
    "mean without skipping NaNs": (lambda t, w: t.mean("time", skipna=False), 0),
    "sum": (lambda t, w: t.sum("x"), 0),
    "sum of everything": (lambda t, w: t.sum(), 0),
    "std": (lambda t, w: t.std("time", ddof=1), 0),
    "var": (lambda t, w: t.var(("time", "y")), 0),
    "max": (lambda t, w: t.max("y"), 0),
    "min": (lambda t, w: t.min("time"), 0),
    "prod": (lambda t, w: t.prod("x"), 0),
    "cumsum": (lambda t, w: t.cumsum("time"), 0),
    "argmax": (lambda t, w: t.argmax("time"), 0),  # (numpy's nanargmax, on the device)
    "median": (lambda t, w: t.median("time"), 0),  # (numpy's nanmedian, on the device)
    "where": (lambda t, w: t.where(t > 0), 0),
    "where with other": (lambda t, w: t.where(t > 0, -1.0), 0),
    "xr.where": (lambda t, w: xr.where(t > 0, t, w), 0),
    "broadcasting": (lambda t, w: t + w, 0),
    "broadcasting, reduced": (lambda t, w: (t * w).sum("x"), 0),
    "xr.dot": (lambda t, w: xr.dot(t, w, dim="x"), 0),
    "selection": (lambda t, w: t.isel(time=slice(1, 4)).sel(x=20), 0),
    "transpose": (lambda t, w: t.transpose("y", "time", "x"), 0),
    "astype": (lambda t, w: t.astype(np.float32), 0),
    "clip": (lambda t, w: t.clip(-0.5, 0.5), 0),
    "diff": (lambda t, w: t.diff("time"), 0),
    "concat": (lambda t, w: xr.concat([t, t * 2], "time"), 0),
    "groupby": (lambda t, w: t.groupby(t.time % 2).mean(), 0),
    "fillna": (lambda t, w: t.fillna(0.0), 0),
}


@pytest.mark.parametrize("name", list(XARRAY))
def test_xarray_data_array_of_a_tensor_stays_on_the_device(session, name: str) -> None:
    operation, most_bytes = XARRAY[name]
    temperature, weights = data_arrays(session.asarray)
    found, read = reads_of(session, lambda: operation(temperature, weights))
    expected = operation(*data_arrays(lambda values: values))
    assert isinstance(found.data, Tensor), f"{name}: the data is {type(found.data).__name__}"
    assert read["bytes_read"] <= most_bytes, f"{name} read more than it branches on: {read}"
    assert found.dims == expected.dims and found.coords.to_dataset().identical(
        expected.coords.to_dataset()), name
    assert_same(found.data.numpy(), expected.values, name)


# What xarray asks of an array's namespace beyond the standard (numpy's names): refused, the
# data not read. (array-api-strict's arrays fail alike; the namespace keeps to the standard.)
OUTSIDE_THE_STANDARD = {
    "shift": (lambda t: t.shift(time=1), "pad"),  # xp.pad
    "rolling": (lambda t: t.rolling(time=2).mean(), "pad"),
    "quantile": (lambda t: t.quantile(0.5, "time"), "transpose"),  # xp.transpose, xp.quantile
}


@pytest.mark.parametrize("name", list(OUTSIDE_THE_STANDARD))
def test_what_xarray_asks_beyond_the_standard_is_refused_without_a_read(session,
                                                                         name: str) -> None:
    operation, missing = OUTSIDE_THE_STANDARD[name]
    temperature, _ = data_arrays(session.asarray)
    before = session.stats()["bytes_read"]
    with pytest.raises((AttributeError, TypeError), match=missing):
        operation(temperature)
    assert session.stats()["bytes_read"] == before


def test_a_data_array_of_a_tensor_is_read_only_when_asked(session) -> None:
    temperature, _ = data_arrays(session.asarray)
    mean, read = reads_of(session, lambda: temperature.mean("time"))
    assert read["reads"] == 0
    values, read = reads_of(session, lambda: mean.values)  # (np.asarray of the tensor)
    assert read == {"reads": 1, "bytes_read": mean.data.nbytes}
    np.testing.assert_allclose(values, data_arrays(lambda v: v)[0].mean("time").values)
