"""Where ``jax.numpy`` computes otherwise than numpy, the jax device computes numpy's: each
case found by the differential test (``tests/cluster/test_differential.py``), run here on the
device's own ``run`` (sans I/O) against numpy's implementation of the same op."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric.core.op_indexing import IndexArray
from fabric.core.ops import OPS, QUANTILES
from fabric.workers.backends import device_class
from value_edges import OP_CASES

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def device():
    return device_class("jax")(0)


def _both(device, name: str, args: list, params: dict) -> tuple:
    """numpy's result of op ``name`` and the jax device's, or the exception each raised."""
    outcomes = []
    for run in (lambda: np.asarray(OPS[name].impl(*args, **params)),
                lambda: device.to_host(device.run(OPS[name], [
                    device.from_host(a) if isinstance(a, np.ndarray) else a for a in args],
                    params))):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (an all-nan slice)
            try:
                outcomes.append(run())
            except Exception as exc:  # (compared below: the same type, or both values)
                outcomes.append(exc)
    return tuple(outcomes)


# numpy's quantile methods the jax device computes itself (jnp.quantile has linear and
# midpoint, and computes lower, higher and nearest otherwise)
PICKING = ["lower", "higher", "nearest", "inverted_cdf", "closest_observation"]
INTERPOLATING = ["averaged_inverted_cdf", "interpolated_inverted_cdf", "hazen", "weibull",
                 "median_unbiased", "normal_unbiased"]


@st.composite
def quantile_cases(draw: st.DrawFn) -> tuple[str, np.ndarray, dict]:
    """A quantile op, an input with ties (and nans, for a float), and one of those methods."""
    name = draw(st.sampled_from(QUANTILES))
    shape = draw(st.sampled_from([(1,), (2,), (4,), (5,), (2, 3), (3, 4), (2, 2, 3)]))
    dtype = np.dtype(draw(st.sampled_from(["bool", "int8", "int32", "int64", "float32",
                                           "float64"])))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    values = rng.integers(-3, 4, shape)
    a = (values > 0) if dtype.kind == "b" else values.astype(dtype)
    if dtype.kind == "f" and draw(st.booleans()):
        a.reshape(-1)[rng.integers(a.size, size=draw(st.integers(1, a.size)))] = np.nan
    axis = draw(st.sampled_from([None, 0, -1, (0, -1)] if a.ndim > 1 else [None, 0, -1]))
    q = draw(st.sampled_from([0.5, 0.25, 1 / 3, 0.125, 0.0, 1.0, 0.01, 0.99,
                              [0.1, 0.5, 0.9], [[0.3], [0.7]], [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]]))
    if name.endswith("percentile"):
        q = (np.asarray(q) * 100).tolist()
    return name, a, {"q": q, "axis": axis, "keepdims": draw(st.booleans()),
                     "method": draw(st.sampled_from(PICKING + INTERPOLATING))}


@pytest.mark.timeout(400)  # (each new signature is a compile, on cores other tests share)
@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(quantile_cases())
def test_a_quantile_is_numpys_by_each_of_numpys_methods(device, case):
    """jax computes lower, higher and nearest in a float (refusing a bool's, where numpy
    gives a bool) and rounds nearest's ties down, where numpy rounds them to even; it has
    none of numpy's other methods. Those that pick a value give numpy's exactly, in the
    input's dtype; those that interpolate, numpy's within its rounding."""
    name, a, params = case
    expected, got = _both(device, name, [a], params)
    if isinstance(expected, Exception):  # (interpolating bools: numpy's subtract refuses)
        assert type(got) is type(expected), (case, got)
        return
    assert not isinstance(got, Exception), (case, got)
    assert got.dtype == expected.dtype and got.shape == expected.shape, case
    if params["method"] in PICKING:
        np.testing.assert_array_equal(got, expected, err_msg=str(case))
    else:
        tolerance = 1e-6 if expected.dtype == np.float32 else 1e-14
        np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance,
                                   err_msg=str(case))


@pytest.mark.parametrize("name, args, params", [
    ("svd", [np.array([[np.nan, 1.5, 0.0], [-0.75, 3.0, 2.25]])], {"compute_uv": False}),
    ("svd", [np.array([[[1.0, 2.0], [3.0, np.nan]]] * 2)], {}),
    ("svd", [np.array([[np.nan]], np.float32)], {"full_matrices": False}),
    ("pinv", [np.array([[1.0, np.nan], [0.0, 1.0]])], {}),
    ("lstsq", [np.array([[1.0, np.nan], [0.0, 1.0], [1.0, 1.0]]), np.ones(3)], {}),
    ("lstsq_residuals", [np.array([[1.0, 0.0], [np.nan, 1.0], [1.0, 1.0]]), np.ones(3)], {}),
])
def test_a_decomposition_that_lapack_cannot_converge_raises_numpys_linalg_error(
        device, name, args, params):
    """LAPACK's SVD does not converge on a nan and numpy raises; XLA's gives nans."""
    expected, got = _both(device, name, args, params)
    assert isinstance(expected, np.linalg.LinAlgError)
    assert type(got) is type(expected) and str(got) == str(expected)


@pytest.mark.parametrize("name, args, params", [
    ("svd", [np.array([[np.inf, 1.0], [0.0, 1.0]])], {"compute_uv": False}),  # (numpy's: ok)
    ("svd", [np.array([[np.nan, 1.0], [1.0, 2.0]])], {"hermitian": True,
                                                         "compute_uv": False}),
    ("lstsq", [np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), np.array([np.nan, 1, 1])], {}),
])
def test_a_nan_numpy_computes_through_is_computed(device, name, args, params):
    expected, got = _both(device, name, args, params)
    if isinstance(expected, Exception):
        assert type(got) is type(expected)
    else:
        assert not isinstance(got, Exception), got
        np.testing.assert_allclose(got, expected, equal_nan=True)


@pytest.mark.parametrize("kind", [None, "stable", "mergesort", "quicksort", "heapsort"])
@pytest.mark.parametrize("dtype", ["bool", "int32", "int64", "float32", "float64"])
def test_sort_and_argsort_take_numpys_kind_and_order_ties_stably(device, kind, dtype):
    """numpy's default kind leaves the order of ties unspecified (on this machine's AVX-512
    numpy it is not stable past 3 elements of 4 or 8 bytes); the device's is the stable
    order, which numpy gives for kind='stable'."""
    values = np.array([[1, 0, 1, 0, -0.0, 2, 0], [0.0, 1, 0, 0, 1, 1, -0.0]]).astype(dtype)
    for axis in (-1, 0, None):
        params = {"axis": axis, "kind": kind}
        expected, got = _both(device, "argsort", [values], params)
        stable = np.argsort(values, axis=axis, kind="stable")
        assert got.dtype == expected.dtype and got.shape == expected.shape
        np.testing.assert_array_equal(got, stable)
        flat = values.reshape(-1) if axis is None else values
        along = 0 if axis is None else axis
        np.testing.assert_array_equal(np.take_along_axis(flat, got, axis=along),
                                      np.sort(flat, axis=along))
        expected, got = _both(device, "sort", [values], params)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("name, args, params", OP_CASES)
def test_values_xla_computes_otherwise_are_numpys(device, name, args, params):
    """XLA saturates a float converted to an integer (-1.0 to uint32 is 0, nan 0), divides
    an integer by zero to garbage, gives 2 ** -1 as the most negative int64 and counts a
    negative value at 0, where numpy converts through the CPU's truncation, gives 0, and
    raises ValueError."""
    expected, got = _both(device, name, args, params)
    if isinstance(expected, Exception):
        assert type(got) is type(expected) and str(got) == str(expected)
    else:
        assert not isinstance(got, Exception), got
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
        assert (np.signbit(got) == np.signbit(expected)).all()  # (a float's signed zeros)


@pytest.mark.parametrize("value", [np.arange(30000.0).reshape(10000, 3) - 0.5, 7,
                                   np.array([1.5, -2.5, 3.5], np.float32)])
def test_an_update_repeating_a_position_stores_the_last_value_as_numpys(device, value):
    """XLA's scatter stores any one of the values given for a position on a GPU (the last,
    on a CPU): the device runs numpy's own update on a host copy."""
    target, rows = np.zeros((2, 3), np.int32), np.arange(10000) % 2
    expected, got = _both(device, "setitem", [target, value, rows], {"index": (IndexArray(0),)})
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
