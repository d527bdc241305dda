"""The op table's shape and dtype rules of numpy's everyday functions, sans I/O: what the client
infers (``Op.infer`` on Specs, nothing allocated) is what numpy's own implementation makes of
real arrays of those shapes and dtypes, and where numpy refuses, inference refuses with the
same exception type. (The devices' values: tests/cluster/test_numpy_functions.py.)
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from fabric.core.ops import OPS, Spec, shape_from_device

RNG = np.random.default_rng(5)


def _array(shape: tuple[int, ...], dtype: str = "float64") -> np.ndarray:
    """Positive values (no zero weights, no singular matrix) of ``shape``."""
    return (RNG.random(shape) + 0.5).astype(dtype)


A, V, W = _array((3, 4)), _array((4,)), _array((3,))
NANS = ["nansum", "nanprod", "nanmean", "nanstd", "nanvar", "nanmin", "nanmax", "nanargmin",
        "nanargmax", "ptp", "nanmedian"]
CASES = {
    **{f"{name} {dtype} axis={axis} keepdims={keepdims}": (
        name, [A.astype(dtype)], {"axis": axis, "keepdims": keepdims})
       for name in NANS for dtype in ("float32", "int32", "bool") for axis in (None, 1, (0, 1), 2)
       for keepdims in (False, True)},
    **{f"{name} of 0-d axis=0": (name, [np.array(2.0)], {"axis": 0}) for name in NANS},
    **{f"{name} empty": (name, [np.empty((0, 3))], {"axis": 0}) for name in NANS},
    "nanpercentile qs": ("nanpercentile", [A], {"q": [10, 50], "axis": 1}),
    "nanquantile 0-d q": ("nanquantile", [A.astype("float32")], {"q": 0.5, "axis": 0}),
    "nanquantile out of range": ("nanquantile", [A], {"q": 1.5}),
    "average": ("average", [A], {"axis": None}),
    "average int weights": ("average", [A.astype("int8"), V.astype("float32")], {"axis": 1}),
    "average same shape": ("average", [A, A.astype("float32")], {"axis": (0, 1)}),
    "average keepdims": ("average", [A, W], {"axis": 0, "keepdims": True}),
    "average weights not along axis": ("average", [A, W], {"axis": 1}),
    "average no axis": ("average", [A, V], {"axis": None}),
    "reduce add int32": ("ufunc_reduce", [A.astype("int32")], {"ufunc": "add", "axis": 0}),
    "reduce logical_and": ("ufunc_reduce", [A], {"ufunc": "logical_and", "axis": None}),
    "reduce keepdims initial": ("ufunc_reduce", [A], {"ufunc": "maximum", "axis": 1,
                                                      "keepdims": True, "initial": 9.0}),
    "reduce 0-d": ("ufunc_reduce", [np.array(2.0)], {"ufunc": "add", "axis": 0}),
    "reduce empty no identity": ("ufunc_reduce", [np.empty((0, 3))], {"ufunc": "maximum",
                                                                      "axis": 0}),
    "reduce not reorderable": ("ufunc_reduce", [A], {"ufunc": "subtract", "axis": (0, 1)}),
    "reduce one operand": ("ufunc_reduce", [A], {"ufunc": "sin", "axis": 0}),
    "accumulate bool": ("ufunc_accumulate", [A > 1], {"ufunc": "add", "axis": 1}),
    "accumulate 0-d": ("ufunc_accumulate", [np.array(2.0)], {"ufunc": "add", "axis": 0}),
    "histogram": ("histogram", [A], {"bins": 5}),
    "histogram edges": ("histogram", [A, np.array([0.0, 1.0, 2.0])], {}),
    "histogram weighted density": ("histogram", [A, A.astype("float32")],
                                   {"bins": 3, "weighted": True, "density": True}),
    "histogram weighted": ("histogram", [A, A.astype("float32")], {"bins": 3, "weighted": True}),
    "histogram weights of another shape": ("histogram", [A, V], {"bins": 3, "weighted": True}),
    "histogram no bins": ("histogram", [A], {"bins": 0}),
    "histogram 2-d edges": ("histogram", [A, A], {}),
    "histogram range": ("histogram", [A], {"bins": 3, "range": [2, 1]}),
    "histogram_bin_edges float32": ("histogram_bin_edges", [A.astype("float32")], {"bins": 4}),
    "histogram_bin_edges int": ("histogram_bin_edges", [A.astype("int8")], {"bins": 4}),
    "interp": ("interp", [A, V, V], {}),
    "interp complex": ("interp", [A, V, V.astype("complex128")], {"left": 1.0}),
    "interp lengths": ("interp", [A, V, W], {}),
    "interp empty": ("interp", [A, V[:0], V[:0]], {}),
    "interp 2-d": ("interp", [A, A, A], {}),
    "interp period": ("interp", [A, V, V], {"period": 0}),
    **{f"convolve {mode}": ("convolve", [V, W.astype("int32")], {"mode": mode})
       for mode in ("full", "same", "valid", "bad")},
    "convolve 0-d": ("convolve", [np.array(2.0), V], {}),
    "convolve empty": ("convolve", [V[:0], V], {}),
    "convolve 2-d": ("convolve", [A, V], {}),
    "lexsort": ("lexsort", [V, V.astype("int32")], {}),
    "lexsort 2-d axis": ("lexsort", [A, A], {"axis": 0}),
    "lexsort shapes": ("lexsort", [V, W], {}),
    "lexsort axis": ("lexsort", [V], {"axis": 1}),
    "lexsort 0-d": ("lexsort", [np.array(1.0)], {}),
    "lstsq": ("lstsq", [A, W], {}),
    "lstsq float32 matrix": ("lstsq", [A.astype("float32"), A[:, :2].astype("float32")], {}),
    "lstsq rows": ("lstsq", [A, V], {}),
    "lstsq 1-d": ("lstsq", [V, V], {}),
    "lstsq 3-d b": ("lstsq", [A, A[:, :, None]], {}),
    "lstsq 0-d b": ("lstsq", [A, np.array(1.0)], {}),
    "qr complete": ("qr", [A], {"mode": "complete"}),
    "slogdet stack": ("slogdet", [np.stack([A[:, :3]] * 2)], {}),
    "pinv int": ("pinv", [A.astype("int64")], {"rtol": None}),
    "fft float32": ("fft", [A.astype("float32")], {"n": 7, "axis": 0}),
    "fft2 as fftn": ("fftn", [A], {"s": [2, 6], "axes": [-2, -1]}),
    "irfft2 as irfftn": ("irfftn", [A], {"axes": [-2, -1]}),
}


# Empty axes, which numpy's functions check before their types (a quantile's take, ptp's
# max before its subtract, pad's edges): inference refuses with numpy's type and words.
EMPTY = {"(0, 3)": np.empty((0, 3)), "(3, 0)": np.empty((3, 0)), "(0,)": np.empty(0),
         "(2, 0, 3)": np.empty((2, 0, 3))}
EMPTY_CASES = {
    **{f"{name} {dtype} {label} axis={axis}": (name, [a.astype(dtype)], {"axis": axis})
       for name in ("ptp", "min", "argmin", "nanargmax", "median", "sum")
       for dtype in ("float32", "bool") for label, a in EMPTY.items() for axis in (None, 0, -1)},
    **{f"{name} {dtype} {label} method={method}": (
        name, [a.astype(dtype)], {"q": q, "axis": 0, "method": method})
       for name, q in (("quantile", 0.5), ("percentile", [25, 50]), ("nanquantile", 0.5))
       for dtype in ("float64", "int32", "bool") for label, a in EMPTY.items()
       for method in ("linear", "lower")},
    **{f"pad {mode} {label}": ("pad", [a], {"pad_width": 1, "mode": mode})
       for mode in ("edge", "constant", "reflect", "wrap", "empty")
       for label, a in EMPTY.items()},
    **{f"average {label} axis={axis}{' weighted' if weighted else ''}": (
        "average", [a, np.ones(a.shape[axis])] if weighted else [a], {"axis": axis})
       for label, a in EMPTY.items() for axis in (0, -1) for weighted in (False, True)},
    "pad edge, the empty axis not padded": ("pad", [EMPTY["(0, 3)"]],
                                            {"pad_width": [[0, 0], [1, 2]], "mode": "edge"}),
}


def _numpys(name: str, arrays: list[np.ndarray], params: dict) -> np.ndarray | Exception:
    """What numpy's own implementation of op ``name`` makes of ``arrays``, or its error."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (numpy's, of a slice of nans or of nothing)
            return np.asarray(OPS[name].impl(*arrays, **params))
    except Exception as exc:
        return exc


@pytest.mark.parametrize("label", list(CASES))
def test_inferred_shape_and_dtype_are_numpys(label):
    name, arrays, params = CASES[label]
    op = OPS[name]
    specs = [Spec(a.shape, a.dtype) for a in arrays]
    made = _numpys(name, arrays, params)
    if isinstance(made, Exception):  # numpy refuses: inference refuses alike, nothing made
        with pytest.raises(type(made)):
            op.infer(specs, params)
        return
    assert op.infer(specs, params) == (made.shape, made.dtype)


@pytest.mark.parametrize("label", list(EMPTY_CASES))
def test_empty_axes_are_refused_as_numpy_refuses_them(label):
    name, arrays, params = EMPTY_CASES[label]
    made = _numpys(name, arrays, params)
    for _ in range(2):  # (the second time from the cache of dtypes per signature)
        specs = [Spec(a.shape, a.dtype) for a in arrays]
        if isinstance(made, Exception):
            with pytest.raises(type(made)) as refused:
                OPS[name].infer(specs, params)
            assert str(refused.value) == str(made)
        else:
            assert OPS[name].infer(specs, params) == (made.shape, made.dtype)


def test_lstsq_residuals_are_learned_from_the_device_and_checked_at_the_call():
    assert shape_from_device("lstsq_residuals", [])
    assert OPS["lstsq_residuals"].infer([Spec((3, 4), np.dtype("float32"))] * 2, {}) == (
        (0,), np.dtype("float32"))
    with pytest.raises(np.linalg.LinAlgError):
        OPS["lstsq_residuals"].infer([Spec((3, 4), np.dtype("float64")),
                                      Spec((4,), np.dtype("float64"))], {})
