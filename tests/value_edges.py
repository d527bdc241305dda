"""The values where numpy's result (or error) is one that CuPy and XLA compute otherwise
(``workers/backends/numpy_values.py``): each case an op of the table, its inputs and params,
run by the jax device (``tests/unit/test_jax_differences.py``) and by the cupy device's own
functions with numpy standing in (``tests/unit/test_cupy_ops.py``), against numpy's; and
through a session as a user writes them (``check_on``: the jax device here, and the cupy
and jax devices on a GPU, ``test_cupy_gpu.py``, ``test_jax_gpu.py``)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from fabric.core.errors import RemoteError
from fabric.core.ops import OPS
from fabric.workers.backends import numpy_values

# Floats out of every integer's range and in it. 64 of them: numpy's vector loop converts
# each (its scalar loop, for an array's last few elements, differs out of uint32's range)
CONVERTED = np.resize(np.array([
    np.nan, np.inf, -np.inf, -1.0, -0.5, 0.75, 1e20, -1e20, 3e9, -3e9, 4.3e9, 2.0**32,
    2.0**63, -2.0**63, 1.8e19, 2.0**64, -2.0**31 - 1, 2.0**31 - 0.5, -5e9, 70000.0, 300.7,
    -129.0, -2.0**63 - 5000]), 64)
INTEGERS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
_DIVIDEND = np.array([1.0, -1.0, 1.0, -1.0, 0.0, -0.0, np.inf, 1.0, 5.0, -7.5, 1.0, np.nan])
_DIVISOR = np.array([0.0, 0.0, np.inf, np.inf, 0.0, 3.0, 2.0, 0.1, -0.0, 2.0, -np.inf, 1.0])
_INTS = np.array([7, -7, 0, np.iinfo(np.int32).min, 5, -5, -128, np.iinfo(np.int64).min])
_INT_DIVISORS = np.array([0, 0, 0, 0, -2, 3, -1, -1])


def converts_as_x86(values: np.ndarray) -> bool:
    """Whether this machine's numpy converts ``values`` (floats out of every integer's range
    among them) to each integer as numpy_values.astype does, the x86 vector loop's way. numpy
    leaves an out-of-range conversion undefined: another CPU (an ARM's saturates) gives other
    values, and there the devices' x86 values cannot be checked against it."""
    with np.errstate(invalid="ignore"):
        return all(np.array_equal(numpy_values.astype(np, floats, target), floats.astype(target))
                   for floats in (values, values.astype(np.float32)) for target in INTEGERS)


OUT_OF_RANGE = pytest.mark.skipif(
    not converts_as_x86(CONVERTED), reason="this CPU's numpy converts floats out of an "
    "integer's range otherwise than x86's vector loop (undefined behaviour in numpy)")

CASES = [
    *[pytest.param("astype", [CONVERTED.astype(source)], {"dtype": target}, marks=OUT_OF_RANGE)
      for source in ("float64", "float32") for target in INTEGERS],
    *[(name, [_DIVIDEND.astype(dtype), _DIVISOR.astype(dtype)], {})
      for name in ("floor_divide", "remainder") for dtype in ("float64", "float32")],
    *[(name, [_INTS.astype(dtype), _INT_DIVISORS.astype(dtype)], {})
      for name in ("floor_divide", "remainder") for dtype in ("int8", "int32", "int64", "uint8")],
    *[("fmod", [_INTS.astype(dtype), _INT_DIVISORS.astype(dtype)], {})
      for dtype in ("int8", "int64", "uint8")],
    ("fmod", [np.array([2**62 + 1, -(2**62 + 1), 2**53 + 1, 7]), np.array([3, 3, 2, -3])], {}),
    ("fmod", [np.array([5.5, -5.5, 1.0, np.inf]), np.array([2.0, 2.0, 0.0, 2.0])], {}),
    ("power", [np.array([2, 1, -1, 0]), np.array([-1, -1, -3, 2])], {}),
    ("power", [np.array([2, 3], np.int32), -1], {}),
    ("power", [np.array([2, -3], np.int32), np.array([3, 2], np.int32)], {}),
    ("power", [np.array([2.0, 0.0]), np.array([-1, -2])], {}),
    ("power", [np.array([2, 3], np.uint8), np.array([7, 2], np.uint8)], {}),
    ("bincount", [np.array([1, -1, 3])], {}),
    ("bincount", [np.array([1, 0, 3])], {"minlength": 5}),
]
# And cases numpy's API spells otherwise than the op table (array counts to repeat by, a
# sorter as the third input): for the devices' own functions, not through a session
OP_CASES = CASES + [
    ("repeat", [np.array([1, 2, 3]), np.array([1, -1, 2])], {}),
    ("repeat", [np.array([1, 2, 3]), -1], {}),
    ("repeat", [np.array([[1, 2], [3, 4]]), np.array([2, 0])], {"axis": 1}),
    ("searchsorted", [np.array([3.0, 1.0, 2.0]), np.array([1.5]), np.array([1, 2, 5])], {}),
    ("searchsorted", [np.array([3.0, 1.0, 2.0]), np.array([1.5]), np.array([-1, 2, 0])], {}),
    ("searchsorted", [np.array([3.0, 1.0, 2.0]), np.array([1.5, 9.0]), np.array([1, 2, 0])],
     {"side": "right"}),
]


def check_on(session: Any, name: str, args: list, params: dict) -> None:
    """One case on ``session``'s device, called as numpy is: numpy's values and dtype (a
    float's signed zeros too), or numpy's ValueError at the call or, named by the device's
    RemoteError, at the read (or at the call, where the device tells the result's shape)."""
    with np.errstate(all="ignore"):
        try:
            expected = np.asarray(OPS[name].impl(*args, **params))
        except ValueError as exc:
            expected, refused = None, exc
    remote = [session.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    if name == "astype":
        call = lambda: remote[0].astype(params["dtype"])  # noqa: E731
    else:
        call = lambda: getattr(np, name)(*remote, **params)  # noqa: E731
    if expected is None:
        try:
            result = call()
        except ValueError as exc:
            assert str(exc) == str(refused)
            return
        except RemoteError as exc:  # (a shape the device tells: asked at the call)
            assert f"ValueError: {refused}" in str(exc)
            return
        with pytest.raises(RemoteError, match=re.escape(f"ValueError: {refused}")):
            result.numpy()
        return
    got = call().numpy()
    assert got.dtype == expected.dtype, (name, args, params)
    np.testing.assert_array_equal(got, expected, err_msg=f"{name} {params}")
    assert (np.signbit(got) == np.signbit(expected)).all(), (name, args, params)
