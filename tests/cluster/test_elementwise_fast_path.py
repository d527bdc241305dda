"""End-to-end: the elementwise operators' short way (``fabric.arrays.tensor._elementwise_pair``),
which remembers result dtypes per kind of operands by their dtypes alone, gives numpy's
dtypes, values and errors whatever order shapes, kinds and scalars come in."""

from __future__ import annotations

import operator

import numpy as np
import pytest

from fabric.core.ops import NO_PARAMS

DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float32", "float64"]
# (operator, left, right): "t" is the tensor, "u" a second tensor of its shape; the rest are
# Python scalars, both kinds numpy weakly types, on either side
CASES = [
    (operator.add, "t", 1.5), (operator.add, 1.5, "t"), (operator.mul, "t", 3),
    (operator.sub, 3, "t"), (operator.truediv, "t", "u"), (operator.lt, "t", 2.5),
    (np.power, "t", 2), (np.maximum, 0.5, "t"), (operator.add, "t", 200), (operator.sub, "t", -129),
]


def _outcome(compute):
    """numpy's (or fabric's) result as (dtype, values), or the type of its error."""
    try:
        result = compute()
    except Exception as exc:  # (numpy's refusals: the same type must come from fabric)
        return type(exc)
    values = result.numpy() if hasattr(result, "numpy") else np.asarray(result)
    return values.dtype, values.tolist()


@pytest.mark.timeout(120)
def test_every_order_of_shapes_kinds_and_scalars_matches_numpy(session):
    # 0-d first, then 1-d, then 0-d again: a dtype remembered from one ndim serves the other
    for shape in [(), (3,), ()]:
        for dtype in DTYPES:
            local = np.ones(shape, dtype)
            t, u = session.asarray(local), session.asarray(local)
            for op, left, right in CASES:
                expected = _outcome(lambda: op(_operand(left, local, local),
                                               _operand(right, local, local)))
                got = _outcome(lambda: op(_operand(left, t, u), _operand(right, t, u)))
                assert got == expected, (op, left, right, dtype, shape)


def _operand(side, tensor, other):
    """A case's operand: "t" the tensor, "u" the second one, or the scalar itself."""
    return {"t": tensor, "u": other}[side] if isinstance(side, str) else side


@pytest.mark.timeout(60)
def test_a_refusal_is_not_remembered_and_the_session_serves_on(session):
    small = session.asarray(np.array([1, 2], np.int8))
    with pytest.raises(OverflowError):  # numpy's: 300 does not fit an int8 (at the call)
        small + 300
    assert (small + 3).numpy().tolist() == [4, 5]  # a fitting int, the same kind, still goes
    with pytest.raises(OverflowError):
        small + 300  # and the refusal is not remembered as a dtype
    flags = session.asarray(np.array([True, False]))
    with pytest.raises(TypeError):  # numpy refuses negative on bools, here as there
        -flags
    assert (-small).numpy().tolist() == [-1, -2]


@pytest.mark.timeout(60)
def test_ops_without_params_travel_compact_and_share_one_dict_that_nothing_writes(session):
    # (the wire's compact entry, [out, name, *args]; the device takes NO_PARAMS for its
    # params, which nothing may write into)
    x = session.zeros(4)
    for _ in range(50):
        x = np.exp(-(x * 0.5 + 1.0))
    elementwise = [op for op in session.stream.batch if type(op) is tuple
                   and type(op[0]) is int and op[1] in ("multiply", "add", "negative", "exp")]
    assert len(elementwise) == 200
    np.testing.assert_allclose(x.numpy(), _local_steps(50))
    assert NO_PARAMS == {}


def _local_steps(steps: int) -> np.ndarray:
    x = np.zeros(4)
    for _ in range(steps):
        x = np.exp(-(x * 0.5 + 1.0))
    return x
