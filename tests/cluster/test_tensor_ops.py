"""End-to-end: every tensor op gives numpy's result, shape and dtype, on a real device.

Each case builds seeded numpy inputs, uploads them with ``session.asarray`` and applies the
same expression to the tensors. Shape and dtype are checked before anything is read (they
are inferred on the client), then the values read back are compared with numpy's. Where
numpy raises for an input combination, the tensor expression must raise the same exception
type at the call site, and nothing failing may have been sent (the next ``sync`` is clean).
Everything runs on the module's shared broker and workers; nothing is mocked.
"""

from __future__ import annotations

import copy
import gc
import operator
import pickle
import re
import warnings

import numpy as np
import pytest

from fabric.arrays.tensor import Tensor
from fabric.core.errors import RemoteError
from fabric.core.ops import _cached_dtype

DTYPES = ["bool", "int32", "int64", "float32", "float64"]
RTOL = {2: 1e-3, 4: 1e-6, 8: 1e-12}  # float16 (bool transcendentals), float32, float64


# -- helpers ---------------------------------------------------------------------------------

def data(dtype, shape=(3, 4), kind="any", seed=0):
    """Seeded numpy data of a dtype. kind: any, positive (divisors, logs), small (0..3:
    exponents, shift counts), special (floats with nan, inf and -inf)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.ones(shape, bool) if kind == "positive" else np.asarray(rng.random(shape) < 0.5)
    if dt.kind == "i":
        low, high = {"any": (-9, 10), "positive": (1, 6), "small": (0, 4),
                     "special": (-9, 10)}[kind]
        return rng.integers(low, high, shape).astype(dt)
    low, high = {"any": (-4, 4), "positive": (0.5, 4), "small": (0, 3),
                 "special": (-4, 4)}[kind]
    array = np.asarray(rng.uniform(low, high, shape)).astype(dt)
    if kind == "special":
        flat = array.reshape(-1)
        flat[:3] = [np.nan, np.inf, -np.inf][:flat.size]
    return array


def assert_values(got, expected, approx=False):
    """The array read back equals numpy's (within float tolerance where ``approx``)."""
    assert isinstance(got, np.ndarray) and got.dtype == expected.dtype
    assert got.shape == expected.shape
    if approx and expected.dtype.kind == "f":
        rtol = RTOL[expected.dtype.itemsize]
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, expected, strict=True)


def compare(local, remote, approx=False, label=""):
    """Run the numpy thunk ``local`` and the fabric thunk ``remote``; they must agree.

    Where numpy raises, ``remote`` must raise the same exception type at the call site.
    Returns the result tensor, or None where both raised.
    """
    try:
        with np.errstate(all="ignore"):
            expected = local()
    except Exception as exc:  # numpy refuses: the tensor op must refuse alike, at once
        with pytest.raises(type(exc)):
            remote()
        return None
    expected = np.asarray(expected)
    got = remote()
    assert isinstance(got, Tensor), f"{label}: got {type(got).__name__}, not a fabric Tensor"
    assert got.shape == expected.shape, label  # inferred: nothing has been read yet
    assert got.dtype == expected.dtype, label
    assert_values(got.numpy(), expected, approx)
    return got


def expect_same(session, fn, *args, approx=False, label=""):
    """Apply ``fn`` to numpy ``args`` and to their uploaded tensors; they must agree.

    Array arguments are uploaded; anything else (scalars, None) is passed as it is.
    """
    remote = [session.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    return compare(lambda: fn(*args), lambda: fn(*remote), approx, label)


def poisoned(session):
    """A tensor whose op fails on the device: reading it raises RemoteError."""
    base = session.asarray(np.array([2, 3], np.int64))
    exponent = session.asarray(np.array([1, -1], np.int64))  # negative power: data-dependent
    return base ** exponent


# -- operators -------------------------------------------------------------------------------

BINARY = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow,
    "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
    ">=": operator.ge, ">": operator.gt,
    "&": operator.and_, "|": operator.or_, "^": operator.xor,
    "<<": operator.lshift, ">>": operator.rshift,
    "np.add": np.add, "np.maximum": np.maximum, "np.minimum": np.minimum,
    "np.arctan2": np.arctan2,
}
# (left operand's kind, right operand's kind): no zero divisors, no negative integer powers
OPERAND_KINDS = {"/": ("any", "positive"), "//": ("any", "positive"),
                 "%": ("any", "positive"), "**": ("positive", "small"),
                 "<<": ("any", "small"), ">>": ("any", "small")}
APPROX = {"/", "**", "np.arctan2"}

# Python scalars are weak in NumPy 2 promotion, numpy scalars are not; 2**40 overflows int32;
# ``t ** 2`` is numpy's square (a bool array's is int8, its np.power int64).
SCALARS = [True, 2, 3, -2, 2.5, 2**40, np.bool_(True), np.int32(3), np.int64(-2),
           np.float32(2.0), np.float64(0.5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_tensor_with_tensor(session, op, dtype):
    left_kind, right_kind = OPERAND_KINDS.get(op, ("any", "any"))
    left = data(dtype, kind=left_kind, seed=1)
    for other in DTYPES:
        right = data(other, kind=right_kind, seed=2)
        expect_same(session, BINARY[op], left, right, approx=op in APPROX,
                    label=f"{dtype} {op} {other}")
    session.sync()  # every refusal happened at the call site: nothing failing was sent


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_tensor_with_scalar(session, op, dtype):
    fn = BINARY[op]
    left_kind, right_kind = OPERAND_KINDS.get(op, ("any", "any"))
    as_left, as_right = data(dtype, kind=left_kind, seed=3), data(dtype, kind=right_kind, seed=4)
    for scalar in SCALARS:
        name = f"{type(scalar).__name__}({scalar})"
        expect_same(session, lambda t: fn(t, scalar), as_left, approx=op in APPROX,
                    label=f"{dtype} {op} {name}")
        expect_same(session, lambda t: fn(scalar, t), as_right, approx=op in APPROX,
                    label=f"{name} {op} {dtype} (reflected)")
    session.sync()


BROADCAST_SHAPES = [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((), (3, 4)),
                    ((3, 4), ()), ((1,), (2, 1, 3))]


@pytest.mark.parametrize("dtypes", [("int32", "int64"), ("float32", "float64"),
                                    ("bool", "float32")], ids="-".join)
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
def test_binary_broadcasting(session, shapes, dtypes):
    for op, fn in BINARY.items():
        left_kind, right_kind = OPERAND_KINDS.get(op, ("any", "any"))
        left = data(dtypes[0], shapes[0], left_kind, seed=5)
        right = data(dtypes[1], shapes[1], right_kind, seed=6)
        expect_same(session, fn, left, right, approx=op in APPROX,
                    label=f"{shapes[0]} {op} {shapes[1]}")
    session.sync()


@pytest.mark.parametrize("shapes", [((3, 4), (3,)), ((2, 3), (3, 2)), ((2, 3, 4), (2, 4))],
                         ids=str)
def test_binary_shape_mismatch_raises_at_call_site(session, shapes):
    left, right = session.asarray(np.ones(shapes[0])), session.asarray(np.ones(shapes[1]))
    for fn in (operator.add, operator.lt, np.maximum):
        with pytest.raises(ValueError):
            fn(left, right)
        with pytest.raises(ValueError):
            fn(right, left)
    session.sync()


def test_binary_with_numpy_arrays_uploads_them(session):
    array, other = data("float32", seed=7), data("int64", (4,), seed=8)
    expect_same(session, lambda t: t + other, array)
    expect_same(session, lambda t: other * t, array)  # ndarray on the left defers to us
    expect_same(session, lambda t: np.maximum(other, t), array)
    session.sync()


def test_zero_dimensional_results(session):
    for dtype in DTYPES:
        a, b = data(dtype, (3,), seed=9), data(dtype, (3,), "positive", seed=10)
        expect_same(session, lambda x, y: x[0] * y[1], a, b, label=dtype)
        expect_same(session, lambda x, y: x.sum() / y[2] + 1, a, b, label=dtype)
        expect_same(session, lambda x: x[1].sum(), a, label=dtype)
    session.sync()


def test_zero_dimensional_uploads(session):
    for dtype in DTYPES:
        a, b = data(dtype, (), seed=9), data(dtype, (), "positive", seed=10)
        expect_same(session, lambda x: x, a, label=dtype)
        expect_same(session, operator.mul, a, b, label=dtype)
        expect_same(session, lambda x, y: x / y + 1, a, b, label=dtype)
        expect_same(session, lambda x: x.sum(axis=None), a, label=dtype)
    matrix = data("float64", (3, 4), seed=11)
    expect_same(session, lambda m, z: m @ z, matrix, data("float64", ()))  # ValueError
    expect_same(session, np.dot, matrix, data("float64", ()))  # multiplies
    expect_same(session, lambda x, y: np.concatenate([x, y]), data("int32", ()),
                data("int32", ()))  # ValueError: zero-dimensional arrays
    session.sync()


def test_a_refusal_names_the_users_value_not_an_inference_stand_in(session):
    t = session.asarray(np.ones(2, np.int8))
    for call in (lambda: t + 200, lambda: np.add(t, 200), lambda: np.maximum(t, 200)):
        with pytest.raises(OverflowError, match="Python integer 200 out of bounds for int8"):
            call()


def test_python_int_out_of_bounds_raises_overflow_at_call_site(session):
    for dtype in ("int32", "int64"):
        for scalar in (2**40, -2**40, 2**63, 2**70):
            for fn in (operator.add, operator.mul, np.maximum):
                expect_same(session, lambda t: fn(t, scalar), data(dtype, seed=11),
                            label=f"{dtype} with {scalar}")
    session.sync()


def test_elementwise_results_are_remembered_by_kind_never_a_refusal(session):
    # Elementwise ops remember their result dtype by the operands' kinds: what numpy
    # refuses must be refused every time, and a kind's neighbours keep their own results.
    tensor, floats = session.asarray(data("int32", seed=13)), session.asarray(data("float32"))
    for _ in range(2):
        with pytest.raises(TypeError):
            ~floats
        with pytest.raises(OverflowError):
            tensor + 2**40
        with pytest.raises(TypeError):
            tensor & 1.5
        with pytest.raises(TypeError):
            1.5 << tensor
    for fn in (lambda t: t + 2**20, lambda t: 2**20 - t, lambda t: t + 1.5,
               lambda t: 1.5 - t, lambda t: t & 3):
        expect_same(session, fn, data("int32", seed=13))
    session.sync()


def test_python_int_beyond_64_bits_with_a_float_tensor(session):
    kept = session.asarray(data("float64", seed=48))
    expect_same(session, lambda t: t + 2**70, data("float64", seed=49))
    np.testing.assert_array_equal(kept.numpy(), data("float64", seed=48))


def test_negative_python_int_power_of_integer_tensor_raises_at_call_site(session):
    for dtype in ("int32", "int64", "bool"):
        for exponent in (-1, -2, np.int64(-1)):
            with pytest.raises(ValueError):
                np.asarray(data(dtype, seed=12)) ** exponent  # numpy's own refusal
            with pytest.raises(ValueError, match="negative integer powers"):
                session.asarray(data(dtype, seed=12)) ** exponent
    session.sync()


# -- unary math ------------------------------------------------------------------------------

UNARY = {
    "-t": (operator.neg, "any"), "+t": (operator.pos, "any"), "abs(t)": (abs, "any"),
    "~t": (operator.invert, "any"),
    "np.negative": (np.negative, "any"), "np.positive": (np.positive, "any"),
    "np.abs": (np.abs, "any"), "np.invert": (np.invert, "any"),
    "np.logical_not": (np.logical_not, "any"),
    "np.exp": (np.exp, "any"), "np.exp2": (np.exp2, "any"), "np.expm1": (np.expm1, "any"),
    "np.log": (np.log, "positive"), "np.log2": (np.log2, "positive"),
    "np.log10": (np.log10, "positive"), "np.log1p": (np.log1p, "positive"),
    "np.sqrt": (np.sqrt, "positive"), "np.cbrt": (np.cbrt, "any"),
    "np.square": (np.square, "any"), "np.reciprocal": (np.reciprocal, "positive"),
    "np.sin": (np.sin, "any"), "np.cos": (np.cos, "any"), "np.tan": (np.tan, "any"),
    "np.arctan": (np.arctan, "any"), "np.sinh": (np.sinh, "any"),
    "np.tanh": (np.tanh, "any"), "np.deg2rad": (np.deg2rad, "any"),
    "np.floor": (np.floor, "any"), "np.ceil": (np.ceil, "any"), "np.rint": (np.rint, "any"),
    "np.trunc": (np.trunc, "any"), "np.sign": (np.sign, "any"),
    "np.isnan": (np.isnan, "special"), "np.isinf": (np.isinf, "special"),
    "np.isfinite": (np.isfinite, "special"),
}
EXACT_UNARY = {"-t", "+t", "abs(t)", "~t", "np.negative", "np.positive", "np.abs",
               "np.invert", "np.logical_not", "np.square", "np.floor", "np.ceil", "np.rint",
               "np.trunc", "np.sign", "np.isnan", "np.isinf", "np.isfinite"}


@pytest.mark.parametrize("name", list(UNARY))
def test_unary(session, name):
    fn, kind = UNARY[name]
    for dtype in DTYPES:
        expect_same(session, fn, data(dtype, kind=kind, seed=13),
                    approx=name not in EXACT_UNARY, label=f"{name} {dtype}")
    session.sync()


def test_invert_of_floats_raises_type_error_at_call_site(session):
    for dtype in ("float32", "float64"):
        t = session.asarray(data(dtype))
        with pytest.raises(TypeError):
            ~t
        with pytest.raises(TypeError):
            np.bitwise_and(t, 1)
    with pytest.raises(TypeError):
        -session.asarray(data("bool"))  # numpy refuses boolean negative
    session.sync()


# -- where, clip, maximum/minimum --------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_where(session, dtype):
    condition = data("bool", seed=14)
    x = data(dtype, seed=15)
    for other in [*DTYPES, 0, 2.5, True, np.float32(1), 2**40]:
        y = data(other, seed=16) if isinstance(other, str) else other
        expect_same(session, np.where, condition, x, y, label=f"where {dtype} {other!r}")
        expect_same(session, np.where, condition, y, x, label=f"where {other!r} {dtype}")
    # broadcasting, and a non-bool condition (its truth value)
    expect_same(session, np.where, data("bool", (3, 1), seed=17), x, data(dtype, (4,), seed=18))
    expect_same(session, np.where, data("int32", seed=19), x, 7)
    with pytest.raises(ValueError):
        np.where(session.asarray(data("bool", (2, 4))), session.asarray(x), 0)
    session.sync()


CLIP_BOUNDS = [(1, 5), (None, 3), (-2, None), (2.5, None), (None, np.float32(0.5)),
               (None, None), (True, None), ("tensor", 2), (-1, "tensor")]


@pytest.mark.parametrize("dtype", DTYPES)
def test_clip(session, dtype):
    array = data(dtype, seed=20)
    for low, high in CLIP_BOUNDS:
        bounds = [data(dtype, (4,), seed=21) if b == "tensor" else b for b in (low, high)]
        expect_same(session, lambda t, lo, hi: t.clip(lo, hi), array, *bounds,
                    label=f"t.clip({low!r}, {high!r})")
        expect_same(session, np.clip, array, *bounds, label=f"np.clip({low!r}, {high!r})")
    session.sync()


def test_clip_min_max_keywords(session):
    array = data("float64", seed=22)
    expect_same(session, lambda t: t.clip(max=1.5), array)
    expect_same(session, lambda t: np.clip(t, min=-1), array)
    session.sync()


def test_maximum_minimum_propagate_nan_and_fmax_fmin_do_not(session):
    left, right = data("float64", kind="special", seed=23), data("float32", seed=24)
    for fn in (np.maximum, np.minimum, np.fmax, np.fmin):
        expect_same(session, fn, left, right, label=fn.__name__)
        expect_same(session, lambda t: fn(t, 0), left, label=fn.__name__)
    session.sync()


# -- reductions ----------------------------------------------------------------------------------

REDUCTIONS = ["sum", "mean", "prod", "min", "max", "argmin", "argmax", "std", "var", "any",
              "all"]
AXES = [None, 1, -1, (0, 2), (-1, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", REDUCTIONS)
def test_reduction(session, name, dtype):
    array = data(dtype, (2, 3, 4), seed=25)
    approx = name in ("sum", "mean", "prod", "std", "var")
    for axis in AXES:
        for keepdims in (False, True):
            label = f"{name}(axis={axis}, keepdims={keepdims}) of {dtype}"
            expect_same(session, lambda t: getattr(t, name)(axis=axis, keepdims=keepdims),
                        array, approx=approx, label="method " + label)
            expect_same(session, lambda t: getattr(np, name)(t, axis, keepdims=keepdims),
                        array, approx=approx, label="np." + label)
    expect_same(session, lambda t: getattr(t, name)(), array, approx=approx)
    expect_same(session, lambda t: getattr(np, name)(t, axis=1), array, approx=approx)
    session.sync()


@pytest.mark.parametrize("reduce", [
    lambda m: m.sum(dtype="float32"), lambda m: np.mean(m, axis=0, dtype=np.float32),
    lambda m: m.prod(axis=1, dtype=np.int32), lambda m: np.var(m, ddof=1, dtype="float32"),
    lambda m: np.max(m, axis=0, initial=np.int64(5)), lambda m: np.sum(m, dtype=None),
], ids=["sum dtype", "np.mean dtype", "prod dtype", "np.var dtype", "np.max initial",
        "dtype None"])
def test_reductions_take_numpys_other_keywords(session, reduce):
    compare(lambda: reduce(data("int64", seed=27)),
            lambda: reduce(session.asarray(data("int64", seed=27))), approx=True)
    session.sync()


REDUCTIONS_INTO_OUT = {  # (a, out) -> the result, on numpy arrays and on tensors alike
    "sum": lambda a, out: np.sum(a, out=out[0, 0, ...]),
    "mean axis": lambda a, out: np.mean(a, axis=0, out=out[0]),
    "max keepdims": lambda a, out: np.max(a, axis=1, keepdims=True, out=out[:, :1]),
    "sum into ints (numpy casts)": lambda a, out: np.sum(a, axis=0, out=out[0].astype(int)),
    "argmax": lambda a, out: np.argmax(a, axis=0, out=out[0].astype(np.intp)),
    "std ddof": lambda a, out: np.std(a, axis=1, ddof=1, out=out[:, 0]),
    "any into floats": lambda a, out: np.any(a > 0, axis=0, out=out[1]),
    "std into ints": lambda a, out: np.std(a, out=out[0, 0, ...].astype(int)),  # refused
    "wrong shape": lambda a, out: np.sum(a, axis=0, out=out[0, :2]),
}


@pytest.mark.parametrize("name", list(REDUCTIONS_INTO_OUT))
def test_reductions_store_into_out_as_numpys(session, name):
    array, into = data("float64", seed=28), np.zeros((3, 4))
    program = REDUCTIONS_INTO_OUT[name]
    try:
        expected = program(array, into)
    except Exception as exc:
        with pytest.raises(type(exc)):
            program(session.asarray(array), session.asarray(np.zeros((3, 4))))
        return
    t_into = session.asarray(np.zeros((3, 4)))
    got = program(session.asarray(array), t_into)
    assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(t_into.numpy(), into, rtol=1e-12)  # (out a view: seen there)


def test_a_reduction_into_a_numpy_array_is_refused_saying_so(session):
    with pytest.raises(TypeError, match="must be a tensor of the same session"):
        np.sum(session.asarray(data("float64", seed=28)), out=np.empty(()))
    session.sync()


def test_reduction_errors_at_call_site(session):
    array = data("float64", (2, 3, 4), seed=26)
    for fn in [lambda t: t.sum(axis=3), lambda t: np.mean(t, axis=-4),
               lambda t: t.max(axis=(0, 0)), lambda t: t.argmin(axis=(0, 1)),
               lambda t: np.argmax(t, axis=3), lambda t: t.std(axis=(1, 5))]:
        expect_same(session, fn, array)
    empty = np.zeros((0, 3))
    for fn in [lambda t: t.min(), lambda t: t.argmax(axis=0), lambda t: np.max(t, axis=0),
               lambda t: t.max(axis=1), lambda t: t.sum(axis=0)]:
        expect_same(session, fn, empty)
    session.sync()


def test_inference_does_not_warn_where_numpy_does_not(session):
    _cached_dtype.cache_clear()  # inference runs afresh, not from an earlier test's cache
    array = data("float64", (4, 5, 6), seed=50)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy gives no warning for these shapes
        expect_same(session, lambda t: t.std(axis=(0, 2), ddof=3, keepdims=True), array,
                    approx=True)
        expect_same(session, lambda t: np.var(t, ddof=1), array, approx=True)
    session.sync()


def test_std_var_ddof(session):
    array = data("float32", (3, 5), seed=27)
    for ddof in (0, 1, 2):
        expect_same(session, lambda t: t.std(axis=1, ddof=ddof), array, approx=True)
        expect_same(session, lambda t: np.var(t, axis=0, ddof=ddof), array, approx=True)
    session.sync()


# -- matmul and dot --------------------------------------------------------------------------

MATMUL_SHAPES = [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 5)), ((3, 4), (4, 5)),
                 ((2, 3, 4), (2, 4, 5)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 5)),
                 ((1, 3, 4), (2, 4, 5))]
MATMUL_DTYPES = [("float64", "float64"), ("float32", "float32"), ("int32", "int64"),
                 ("bool", "bool"), ("int32", "float32"), ("bool", "float64")]


@pytest.mark.parametrize("dtypes", MATMUL_DTYPES, ids="-".join)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul_and_dot(session, shapes, dtypes):
    left = data(dtypes[0], shapes[0], seed=28)
    right = data(dtypes[1], shapes[1], seed=29)
    expect_same(session, operator.matmul, left, right, approx=True, label="@")
    expect_same(session, np.matmul, left, right, approx=True, label="np.matmul")
    expect_same(session, lambda a, b: a.dot(b), left, right, approx=True, label="dot")
    expect_same(session, np.dot, left, right, approx=True, label="np.dot")
    session.sync()


def test_matmul_with_numpy_array_on_either_side(session):
    left, right = data("float64", (3, 4), seed=30), data("float32", (4, 2), seed=31)
    expect_same(session, lambda t: t @ right, left, approx=True)
    expect_same(session, lambda t: left @ t, right, approx=True)  # __rmatmul__
    session.sync()


@pytest.mark.parametrize("shapes", [((3, 4), (5,)), ((3, 4), (3, 4)), ((2, 3, 4), (3, 4, 5)),
                                    ((4,), (5,))], ids=str)
def test_matmul_shape_mismatch_raises_value_error_at_call_site(session, shapes):
    left, right = data("float64", shapes[0], seed=32), data("float64", shapes[1], seed=33)
    for fn in (operator.matmul, np.matmul):
        with pytest.raises(ValueError):
            fn(left, right)  # numpy's own refusal
        with pytest.raises(ValueError):
            fn(session.asarray(left), session.asarray(right))
    expect_same(session, lambda a, b: a.dot(b), left, right)  # dot's own rule
    with pytest.raises(ValueError):
        session.asarray(left) @ 2  # a scalar has no core dimension
    with pytest.raises(ValueError):
        2.5 @ session.asarray(left)
    session.sync()


def test_dot_with_a_scalar_multiplies(session):
    array = data("int32", seed=34)
    expect_same(session, lambda t: t.dot(2), array)
    expect_same(session, lambda t: np.dot(t, 2.5), array)
    expect_same(session, lambda t: np.dot(np.float32(3), t), array)
    session.sync()


# -- views: reshape, transpose, swapaxes, expand_dims, squeeze, indexing --------------------------

VIEWS = {
    "reshape(6, 4)": lambda t: t.reshape(6, 4),
    "reshape((4, -1))": lambda t: t.reshape((4, -1)),
    "reshape(-1)": lambda t: t.reshape(-1),
    "reshape(2, -1, 2)": lambda t: t.reshape(2, -1, 2),
    "np.reshape": lambda t: np.reshape(t, (3, 8)),
    "reshape(5, -1)": lambda t: t.reshape(5, -1),
    "reshape(-1, -1)": lambda t: t.reshape(-1, -1),
    ".T": lambda t: t.T,
    "transpose()": lambda t: t.transpose(),
    "transpose(1, 0, 2)": lambda t: t.transpose(1, 0, 2),
    "transpose((2, 0, 1))": lambda t: t.transpose((2, 0, 1)),
    "np.transpose": lambda t: np.transpose(t),
    "np.transpose axes": lambda t: np.transpose(t, (1, 2, 0)),
    "transpose(0, 0, 1)": lambda t: t.transpose(0, 0, 1),
    "transpose(0, 1)": lambda t: t.transpose(0, 1),
    "swapaxes(0, 2)": lambda t: t.swapaxes(0, 2),
    "swapaxes(-1, 0)": lambda t: t.swapaxes(-1, 0),
    "np.swapaxes": lambda t: np.swapaxes(t, 1, 2),
    "swapaxes(0, 3)": lambda t: t.swapaxes(0, 3),
    "np.expand_dims 0": lambda t: np.expand_dims(t, 0),
    "np.expand_dims -1": lambda t: np.expand_dims(t, -1),
    "np.expand_dims (0, 2)": lambda t: np.expand_dims(t, (0, 2)),
    "np.expand_dims 4": lambda t: np.expand_dims(t, 4),
    "copy()": lambda t: t.copy(),
    "np.copy": lambda t: np.copy(t),
}
SQUEEZES = {
    "squeeze()": lambda t: t.squeeze(),
    "squeeze(0)": lambda t: t.squeeze(0),
    "squeeze(-2)": lambda t: t.squeeze(-2),
    "squeeze((0, 2))": lambda t: t.squeeze((0, 2)),
    "np.squeeze axis": lambda t: np.squeeze(t, axis=(2,)),
    "np.squeeze": lambda t: np.squeeze(t),
    "squeeze(1)": lambda t: t.squeeze(1),
    "squeeze(4)": lambda t: t.squeeze(4),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view(session, name):
    for dtype in ("bool", "int32", "float64"):
        expect_same(session, VIEWS[name], data(dtype, (2, 3, 4), seed=35), label=dtype)
    session.sync()


@pytest.mark.parametrize("name", list(SQUEEZES))
def test_squeeze(session, name):
    expect_same(session, SQUEEZES[name], data("float32", (1, 3, 1, 4), seed=36))
    session.sync()


INDICES = [
    1, -1, (0, 2), (-1, -2, -3), slice(None), slice(1, None), slice(None, None, 2),
    slice(None, None, -1), slice(-2, 0, -1), (slice(None), slice(1, 3)),
    (slice(None), slice(None), slice(None, None, 3)), None, (None, 1), (Ellipsis, 0),
    (Ellipsis, None), (0, Ellipsis, slice(1, 4, 2)), (slice(None), None, -1, slice(2, 5)),
    (1, 2, 3), (), (slice(5, 10),), np.int64(1), (np.int32(-1), slice(None, None, -2)),
    # out of range or too many: IndexError at the call site
    2, -3, (0, 3), (0, 0, 4), (0, 0, -5), (0, 0, 0, 0), (Ellipsis, Ellipsis),
    # not an index at all: IndexError, as numpy says
    1.0, (0, "a"), (slice(None), 0.5),
]


@pytest.mark.parametrize("index", INDICES, ids=repr)
def test_basic_indexing(session, index):
    for dtype in ("bool", "int64", "float32"):
        expect_same(session, lambda t: t[index], data(dtype, (2, 3, 4), seed=37), label=dtype)
    session.sync()


def test_indexing_a_zero_dimensional_result_and_chains(session):
    array = data("float64", (2, 3, 4), seed=38)
    expect_same(session, lambda t: t[1][2][3], array)
    expect_same(session, lambda t: t[1, 2, 3][()], array)
    expect_same(session, lambda t: t[::-1].T[1:, None], array)
    session.sync()


# -- concatenate, stack, astype -----------------------------------------------------------------

JOINS = {
    "concatenate": lambda a, b, c: np.concatenate([a, b, c]),
    "concatenate axis=1": lambda a, b, c: np.concatenate((a, b, c), axis=1),
    "concatenate axis=-1": lambda a, b, c: np.concatenate([a, b, c], axis=-1),
    "concatenate axis=None": lambda a, b, c: np.concatenate([a, b, c], axis=None),
    "concatenate axis=2": lambda a, b, c: np.concatenate([a, b, c], axis=2),
    "stack": lambda a, b, c: np.stack([a, b, c]),
    "stack axis=1": lambda a, b, c: np.stack((a, b, c), axis=1),
    "stack axis=-1": lambda a, b, c: np.stack([a, b, c], axis=-1),
    "stack axis=3": lambda a, b, c: np.stack([a, b, c], axis=3),
}


@pytest.mark.parametrize("dtypes", [("float64",) * 3, ("int32", "float32", "bool"),
                                    ("bool",) * 3, ("int32", "int64", "int32")],
                         ids="-".join)
@pytest.mark.parametrize("name", list(JOINS))
def test_join(session, name, dtypes):
    a, b, c = (data(d, (2, 3), seed=39 + i) for i, d in enumerate(dtypes))
    expect_same(session, JOINS[name], a, b, c)
    session.sync()


def test_join_mismatch_errors(session):
    join = [
        (np.concatenate, [(2, 3), (2, 4)], {}),       # sizes differ off the axis
        (np.concatenate, [(2, 3), (2, 4)], {"axis": 1}),  # ... but fine on it
        (np.concatenate, [(2, 3), (3,)], {}),          # ndim differs
        (np.concatenate, [(2, 3), (2, 3)], {"axis": 2}),
        (np.stack, [(2, 3), (3, 2)], {}),              # shapes differ
        (np.stack, [(2, 3), (2, 3)], {"axis": -4}),
    ]
    for fn, shapes, kwargs in join:
        arrays = [data("float64", s, seed=42) for s in shapes]
        expect_same(session, lambda *ts: fn(list(ts), **kwargs), *arrays,
                    label=f"{fn.__name__} {shapes} {kwargs}")
    # a tensor joined with a numpy array: the array is uploaded
    expect_same(session, lambda t: np.concatenate([t, np.ones((1, 3))]), data("int32", (2, 3)))
    session.sync()


@pytest.mark.parametrize("dtype", DTYPES)
def test_astype(session, dtype):
    array = data(dtype, seed=43)
    for target in [*DTYPES, "float16", "uint8", np.int16, bool, float]:
        expect_same(session, lambda t: t.astype(target), array, label=f"{dtype}->{target}")
    session.sync()


def test_copy_is_a_new_tensor(session):
    t = session.asarray(data("float64", seed=44))
    copied = t.copy()
    assert copied.id != t.id and copied.shape == t.shape and copied.dtype == t.dtype
    del t
    np.testing.assert_array_equal(copied.numpy(), data("float64", seed=44))
    session.sync()


@pytest.mark.parametrize("how", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
def test_the_copy_module_copies_values_and_either_tensor_may_be_let_go(session, how):
    # A copy of the handle alone would share the device's array, and free it with itself.
    t = session.asarray(data("float64", seed=45))
    copied = how(t)
    assert copied.id != t.id and copied.session is t.session
    del copied
    gc.collect()
    np.testing.assert_array_equal(t.numpy(), data("float64", seed=45))
    again = how(t)
    del t
    np.testing.assert_array_equal(again.numpy(), data("float64", seed=45))
    session.sync()


def test_a_tensor_cannot_be_pickled_and_is_told_what_to_pickle(session):
    with pytest.raises(TypeError, match=r"pickle t\.numpy\(\) instead"):
        pickle.dumps(session.ones(2))


def test_iterating_gives_rows_and_a_zero_dimensional_tensor_refuses_as_numpy_does(session):
    a = data("int32", shape=(3, 2), seed=46)
    rows = list(session.asarray(a))
    assert [(r.shape, r.dtype) for r in rows] == [((2,), np.dtype("int32"))] * 3
    np.testing.assert_array_equal(np.stack([r.numpy() for r in rows]), a)
    with pytest.raises(TypeError, match="iteration over a 0-d"):
        iter(np.array(1.0))  # (numpy's own refusal)
    with pytest.raises(TypeError, match="iteration over a 0-d"):
        list(session.asarray(1.0))
    session.sync()


# -- creation on the device ----------------------------------------------------------------------

CREATION = {
    "zeros": (lambda s: s.zeros((2, 3)), lambda: np.zeros((2, 3))),
    "zeros int32": (lambda s: s.zeros((2, 3), "int32"), lambda: np.zeros((2, 3), "int32")),
    "zeros int": (lambda s: s.zeros(4, np.int64), lambda: np.zeros(4, np.int64)),
    "zeros ()": (lambda s: s.zeros(()), lambda: np.zeros(())),
    "zeros (0, 3)": (lambda s: s.zeros((0, 3)), lambda: np.zeros((0, 3))),
    "ones bool": (lambda s: s.ones((3,), bool), lambda: np.ones((3,), bool)),
    "ones float32": (lambda s: s.ones((2, 2), "float32"), lambda: np.ones((2, 2), "float32")),
    "full int": (lambda s: s.full((2, 2), 7), lambda: np.full((2, 2), 7)),
    "full float32": (lambda s: s.full(3, 2.5, "float32"), lambda: np.full(3, 2.5, "float32")),
    "full bool": (lambda s: s.full((2,), True), lambda: np.full((2,), True)),
    "full float": (lambda s: s.full((1, 2), -0.5), lambda: np.full((1, 2), -0.5)),
    "arange(5)": (lambda s: s.arange(5), lambda: np.arange(5)),
    "arange(1, 10, 3)": (lambda s: s.arange(1, 10, 3), lambda: np.arange(1, 10, 3)),
    "arange(10, 0, -3)": (lambda s: s.arange(10, 0, -3), lambda: np.arange(10, 0, -3)),
    "arange(3, 1)": (lambda s: s.arange(3, 1), lambda: np.arange(3, 1)),
    "arange(0.0, 1.1, 0.1)": (lambda s: s.arange(0.0, 1.1, 0.1),
                              lambda: np.arange(0.0, 1.1, 0.1)),
    "arange(0.5, 3)": (lambda s: s.arange(0.5, 3), lambda: np.arange(0.5, 3)),
    "arange(1, 2, 0.25)": (lambda s: s.arange(1, 2, 0.25), lambda: np.arange(1, 2, 0.25)),
    "arange float32": (lambda s: s.arange(6, dtype="float32"),
                       lambda: np.arange(6, dtype="float32")),
    "arange int32": (lambda s: s.arange(2, 9, 2, dtype="int32"),
                     lambda: np.arange(2, 9, 2, dtype="int32")),
    "arange step 0": (lambda s: s.arange(0, 5, 0), lambda: np.arange(0, 5, 0)),
    "linspace": (lambda s: s.linspace(0, 1, 5), lambda: np.linspace(0, 1, 5)),
    "linspace no endpoint": (lambda s: s.linspace(0, 1, 5, endpoint=False),
                             lambda: np.linspace(0, 1, 5, endpoint=False)),
    "linspace float32": (lambda s: s.linspace(-1, 1, 7, dtype="float32"),
                         lambda: np.linspace(-1, 1, 7, dtype="float32")),
    "linspace default num": (lambda s: s.linspace(2, 3), lambda: np.linspace(2, 3)),
    "linspace num=-1": (lambda s: s.linspace(0, 1, -1), lambda: np.linspace(0, 1, -1)),
    "eye(3)": (lambda s: s.eye(3), lambda: np.eye(3)),
    "eye(3, 4, k=1)": (lambda s: s.eye(3, 4, k=1, dtype="int32"),
                       lambda: np.eye(3, 4, k=1, dtype="int32")),
    "eye(4, k=-2)": (lambda s: s.eye(4, k=-2, dtype=bool), lambda: np.eye(4, k=-2, dtype=bool)),
    "eye(-1)": (lambda s: s.eye(-1), lambda: np.eye(-1)),
    "zeros((-1, 3))": (lambda s: s.zeros((-1, 3)), lambda: np.zeros((-1, 3))),
    # dtypes inferred by numpy's rules, from every argument; numpy's scalars as arguments
    "arange(6.0)": (lambda s: s.arange(6.0), lambda: np.arange(6.0)),
    "arange(0, 6.0)": (lambda s: s.arange(0, 6.0), lambda: np.arange(0, 6.0)),
    "arange(True, 3)": (lambda s: s.arange(True, 3), lambda: np.arange(True, 3)),
    "arange numpy scalars": (lambda s: s.arange(np.float32(1), np.int64(5), np.int8(2)),
                             lambda: np.arange(np.float32(1), np.int64(5), np.int8(2))),
    "linspace float32 start": (lambda s: s.linspace(np.float32(0), 1, 5),
                               lambda: np.linspace(np.float32(0), 1, 5)),
    "linspace int32 ends": (lambda s: s.linspace(np.int32(0), np.int32(4), np.int64(5)),
                            lambda: np.linspace(np.int32(0), np.int32(4), np.int64(5))),
    "full numpy scalars": (lambda s: s.full(np.int64(3), np.float32(1.5)),
                           lambda: np.full(np.int64(3), np.float32(1.5))),
    "full cast": (lambda s: s.full(2, 2.7, "int32"), lambda: np.full(2, 2.7, "int32")),
    "full int past 64 bits": (lambda s: s.full(2, 2 ** 70, "float32"),
                              lambda: np.full(2, 2 ** 70, "float32")),
    "full overflow": (lambda s: s.full(2, 300, "int8"), lambda: np.full(2, 300, "int8")),
    "full of a row": (lambda s: s.full((2, 2), [1, 2]), lambda: np.full((2, 2), [1, 2])),
    "zeros numpy shape": (lambda s: s.zeros((np.int64(2), np.int32(3))),
                          lambda: np.zeros((np.int64(2), np.int32(3)))),
    "eye numpy ints": (lambda s: s.eye(np.int64(3), k=np.int64(1)),
                       lambda: np.eye(np.int64(3), k=np.int64(1))),
    # what is not an integer is not a size or a count (before: truncated, or an odd error)
    "zeros(2.5)": (lambda s: s.zeros(2.5), lambda: np.zeros(2.5)),
    "zeros((2.5, 1))": (lambda s: s.zeros((2.5, 1)), lambda: np.zeros((2.5, 1))),
    "zeros(None)": (lambda s: s.zeros(None), lambda: np.zeros(None)),
    "ones(float64 2)": (lambda s: s.ones(np.float64(2)), lambda: np.ones(np.float64(2))),
    "linspace num=2.0": (lambda s: s.linspace(0, 1, 2.0), lambda: np.linspace(0, 1, 2.0)),
    "eye(2.0)": (lambda s: s.eye(2.0), lambda: np.eye(2.0)),
    "reshape(3.0)": (lambda s: s.ones(3).reshape(3.0), lambda: np.ones(3).reshape(3.0)),
    "reshape((1, 3.0))": (lambda s: s.ones(3).reshape((1, 3.0)),
                          lambda: np.ones(3).reshape((1, 3.0))),
}


@pytest.mark.parametrize("name", list(CREATION))
def test_creation(session, name):
    remote, local = CREATION[name]
    compare(local, lambda: remote(session), label=name)
    session.sync()


@pytest.mark.parametrize("dtype", DTYPES)
def test_empty_has_shape_and_dtype(session, dtype):
    t = session.empty((2, 0, 3), dtype)
    assert isinstance(t, Tensor) and t.shape == (2, 0, 3) and t.dtype == np.dtype(dtype)
    t = session.empty(5, dtype)
    assert t.shape == (5,) and t.dtype == np.dtype(dtype)
    read = t.numpy()
    assert read.shape == (5,) and read.dtype == np.dtype(dtype)
    session.sync()


def _draws(s, seed):
    s.random.seed(seed)
    draws = [s.random.uniform(-1, 2, size=(3, 4), dtype="float32"),
             s.random.normal(5, 0.5, size=7),
             s.random.uniform(size=(2,)),
             s.random.normal(size=())]
    specs = [(d.shape, d.dtype) for d in draws]
    assert specs == [((3, 4), np.dtype("float32")), ((7,), np.dtype("float64")),
                     ((2,), np.dtype("float64")), ((), np.dtype("float64"))]
    return [d.numpy() for d in draws]


def test_random_integers_and_random_are_numpys_and_reproducible(session):
    def draws():
        session.random.seed(7)
        return [session.random.integers(5, size=(3, 4)),
                session.random.integers(-2, 2, size=50, dtype="int8", endpoint=True),
                session.random.integers(0, 2, size=9, dtype=bool),
                session.random.random((2, 3), dtype="float32")]
    first, again = draws(), draws()
    assert [(d.shape, d.dtype) for d in first] == [
        ((3, 4), np.dtype("int64")), ((50,), np.dtype("int8")), ((9,), np.dtype(bool)),
        ((2, 3), np.dtype("float32"))]
    first, again = [d.numpy() for d in first], [d.numpy() for d in again]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b, strict=True)
    assert first[0].min() >= 0 and first[0].max() < 5
    assert set(np.unique(first[1])) == {-2, -1, 0, 1, 2}  # endpoint: 2 comes too, 50 draws
    assert 0 <= first[3].min() and first[3].max() < 1
    with pytest.raises(ValueError, match="low >= high"):
        session.random.integers(3, 3)
    with pytest.raises(TypeError, match="not an integer dtype"):
        session.random.integers(3, dtype="float32")
    for low, high, dtype, endpoint in [(0, 300, "int8", False), (-200, 3, "int8", False),
                                       (0, 128, "int8", True), (0, 2, "bool", True),
                                       (-1, 1, "uint8", False)]:  # numpy's refusals, at the call
        with pytest.raises(ValueError, match="out of bounds for"):
            np.random.default_rng(0).integers(low, high, dtype=dtype, endpoint=endpoint)
        with pytest.raises(ValueError, match="out of bounds for"):
            session.random.integers(low, high, dtype=dtype, endpoint=endpoint)
    assert session.random.integers(0, 128, 4, dtype="int8").numpy().max() < 128
    session.sync()


@pytest.mark.parametrize("seed, error", [(-1, ValueError), (2 ** 64, ValueError),
                                         ("x", TypeError), (2.5, TypeError)])
def test_a_seed_out_of_range_is_refused_at_the_call_and_nothing_is_stuck(session, seed, error):
    # before: 2**64 and past stopped every later batch (msgpack cannot carry it), -1 failed
    # on the device
    with pytest.raises(error):
        session.random.seed(seed)
    session.random.seed(2 ** 64 - 1)
    assert session.random.uniform(size=3).numpy().shape == (3,)


def test_random_seed_is_reproducible_across_seeds_and_sessions(session, shared_cluster):
    first = _draws(session, 1234)
    again = _draws(session, 1234)
    other = _draws(session, 1235)
    with shared_cluster.connect(device=0) as second, shared_cluster.connect(device=1) as third:
        on_second, on_third = _draws(second, 1234), _draws(third, 1234)
    for a, b, c, d in zip(first, again, on_second, on_third):
        np.testing.assert_array_equal(a, b, strict=True)
        np.testing.assert_array_equal(a, c, strict=True)
        np.testing.assert_array_equal(a, d, strict=True)
    assert all(not np.array_equal(a, b) for a, b in zip(first, other))
    uniform = first[0]
    assert uniform.min() >= -1 and uniform.max() < 2 and np.unique(uniform).size > 1
    session.random.seed(1)  # two draws in a row differ: the generator advances
    x, y = session.random.uniform(size=4), session.random.uniform(size=4)
    assert not np.array_equal(x.numpy(), y.numpy())
    session.sync()


# numpy's scalars where Python's go: an axis from np.argmax, an index from np.arange, ...
I0, I1, I2 = np.int64(0), np.int64(1), np.intp(2)
NUMPY_SCALAR_PARAMS = {
    "sum axis": lambda x: x.sum(axis=I1),
    "sum axes": lambda x: np.sum(x, axis=(I0, I2), keepdims=np.True_),
    "argmax axis": lambda x: x.argmax(axis=I2),
    "std ddof": lambda x: x.std(axis=I1, ddof=I1),
    "transpose": lambda x: x.transpose(I1, I0, I2),
    "swapaxes": lambda x: x.swapaxes(I0, I2),
    "squeeze": lambda x: x.squeeze(axis=I0),
    "expand_dims": lambda x: np.expand_dims(x, I1),
    "reshape": lambda x: x.reshape(I2 * 3, np.int32(1)),
    "concatenate": lambda x: np.concatenate([x, x], axis=I1),
    "stack": lambda x: np.stack([x, x], axis=I2),
    "index": lambda x: x[I0, I1],
    "slice": lambda x: x[:, I0:I2:I1],
    "clip": lambda x: x.clip(np.float32(1), np.int64(4)),
    "where": lambda x: np.where(x > np.int8(2), x, np.float32(0)),
}


@pytest.mark.parametrize("name", list(NUMPY_SCALAR_PARAMS))
def test_numpy_scalars_as_params_and_args(session, name):
    a = np.arange(6.0).reshape(1, 2, 3)
    compare(lambda: NUMPY_SCALAR_PARAMS[name](a),
            lambda: NUMPY_SCALAR_PARAMS[name](session.asarray(a)), label=name)
    session.sync()


@pytest.mark.parametrize("call", [
    lambda s: s.zeros(3, dtype="U1"), lambda s: s.ones(2, dtype=object),
    lambda s: s.empty(2, dtype="datetime64[s]"), lambda s: s.full(2, "x"),
    lambda s: s.arange(3, dtype="S2"), lambda s: s.linspace(0, 1, 3, dtype=object),
    lambda s: s.eye(2, dtype="U3"), lambda s: s.ones(2).astype(str),
    lambda s: s.asarray(np.array(["a", "b"])),
    lambda s: s.random.uniform(size=2, dtype="m8[s]"),
], ids=["zeros U1", "ones object", "empty datetime", "full str", "arange bytes",
        "linspace object", "eye U3", "astype str", "asarray str", "uniform timedelta"])
def test_dtypes_a_device_cannot_hold_are_refused_at_the_call(session, call):
    with pytest.raises(TypeError, match="cannot live on a device: use a numeric or bool dtype"):
        call(session)
    np.testing.assert_array_equal((session.arange(3) * 2).numpy(), [0, 2, 4])  # nothing stuck
    session.sync()


@pytest.mark.parametrize("call", [
    lambda s: s.random.normal(loc=1j, size=2),
    lambda s: s.arange(2 ** 70, 2 ** 70 + 2, dtype="float64"),
    lambda s: s.ones((2, 2)).sum(axis=object()),
    lambda s: s.random.normal(loc=np.datetime64(1, "s"), size=2),
], ids=["complex param", "int past 64 bits", "object axis", "datetime param"])
def test_values_msgpack_cannot_carry_are_refused_at_the_call_and_nothing_is_stuck(session, call):
    # Queued, such a value would fail the whole batch when it is sent, and every batch after.
    with pytest.raises(TypeError):
        call(session)
    np.testing.assert_array_equal((session.arange(3) * 2).numpy(), [0, 2, 4])
    session.sync()


def test_complex_scalars_travel_as_0d_tensors_of_numpys_dtype(session):
    # No op's args or params carry a complex: an operand goes as a 0-d upload of the dtype
    # numpy's weak scalar takes beside the tensor, a fill value as one broadcast.
    z = np.array([1 + 1j, -2], np.complex64)
    t = session.asarray(z)
    for found, expected in [(t + 1j, z + 1j), (2j * t, 2j * z), (t == 0j, z == 0j),
                            (np.multiply(t, np.complex128(1j)), z * np.complex128(1j)),
                            (session.ones(2, "float32") - 1j, np.ones(2, "float32") - 1j),
                            (session.full(2, 1 - 1j), np.full(2, 1 - 1j))]:
        assert found.dtype == expected.dtype
        np.testing.assert_array_equal(found.numpy(), expected)
    t[0] = 3j
    assert t.numpy().tolist() == [3j, -2]
    with pytest.raises(TypeError):  # (into a real tensor: numpy's TypeError, at the call)
        session.ones(2)[0] = 1j


# -- what is not supported, and what must not happen ------------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda t: np.diff(t, prepend=0), "diff"),
    (lambda t: np.linalg.eigvals(t), "eigvals"),
    (lambda t: np.linalg.matrix_power(t, 2), "matrix_power"),
    (lambda t: np.einsum(t, [0]), "einsum"),  # (the form with lists of axes)
    (lambda t: np.add.reduceat(t, [0]), "add.reduceat"),
    (lambda t: np.add.reduce(t, out=t), "add.reduce"),
    (lambda t: np.add.outer(t, t), "add.outer"),
    (lambda t: np.spacing(t), "spacing"),
    (lambda t: np.sin(t, out=np.empty(2)), "sin"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_unsupported_numpy_function_raises_type_error_without_reading(session, call, name):
    t = poisoned(session)  # reading it would raise RemoteError: a TypeError proves no read
    with pytest.raises(TypeError, match=name):
        call(t)
    with pytest.raises(RemoteError):
        t.numpy()  # ... and the tensor was indeed unreadable


NESTED = {  # a nested list (or tuple) holding tensors, as a user might write one
    "list": lambda a, b, c: [a, b, c],
    "tuple": lambda a, b, c: (c, a),
    "rows and an array": lambda a, b, c: [[a[0], b[1]], [np.ones(3, np.float32), c[0]]],
    "0-d tensors among scalars": lambda a, b, c: [1, a[0, 0], [True, c[1, 2]][1]],
    "ragged": lambda a, b, c: [a, b[0]],
}


@pytest.mark.parametrize("dtypes", [("float64",) * 3, ("int32", "bool", "int64")], ids="-".join)
@pytest.mark.parametrize("name", list(NESTED))
def test_asarray_builds_a_nested_list_of_tensors_on_the_device(session, name, dtypes):
    arrays = [data(d, (2, 3), seed=50 + i) for i, d in enumerate(dtypes)]
    tensors = [session.asarray(a) for a in arrays]
    compare(lambda: np.asarray(NESTED[name](*arrays)),
            lambda: session.asarray(NESTED[name](*tensors)), label=name)
    compare(lambda: np.asarray(NESTED[name](*arrays), dtype="float32"),
            lambda: session.asarray(NESTED[name](*tensors), dtype="float32"), label=name)
    session.sync()


def test_a_list_of_tensors_is_never_read_back(session):
    t = poisoned(session)  # any download would raise RemoteError here
    stacked, summed = session.asarray([t, [t, t][0]]), t + [t]
    assert (stacked.shape, summed.shape) == ((2, 2), (1, 2))
    for result in (stacked, summed):
        with pytest.raises(RemoteError):
            result.numpy()  # the poison flowed through on the device


# numpy's other everyday functions and methods, each checked against numpy over every dtype
# (numpy's refusals included: a bad axis raises its error at the call)
EVERYDAY = {
    "np.round": lambda t, u: np.round(t * 0.37, 1),
    "np.around -1": lambda t, u: np.around(t * 10, -1),
    "t.round()": lambda t, u: (t * 1.5).round(),
    "round(t)": lambda t, u: round(t * 2.5),  # refused, as numpy 2 refuses it for arrays
    "t.ravel()": lambda t, u: t.T.ravel(),
    "t.flatten()": lambda t, u: t.flatten(),
    "np.ravel": lambda t, u: np.ravel(t[1:]),
    "np.isclose": lambda t, u: np.isclose(t, u * 1.000001),
    "np.isclose nan": lambda t, u: np.isclose(t / 0, u / 0, rtol=0.1, equal_nan=True),
    "np.nan_to_num": lambda t, u: np.nan_to_num(t / u, posinf=9.0, nan=-1.0),
    "t.cumsum()": lambda t, u: t.cumsum(),
    "t.cumsum(1, dtype)": lambda t, u: t.cumsum(1, dtype="float32"),
    "np.cumprod axis=-1": lambda t, u: np.cumprod(t, axis=-1),
    "np.cumsum axis=2": lambda t, u: np.cumsum(t, axis=2),
    "np.sort": lambda t, u: np.sort(t),
    "np.sort axis=0 stable": lambda t, u: np.sort(t, axis=0, kind="stable"),
    "np.sort axis=None": lambda t, u: np.sort(t, axis=None),
    "np.sort 0-d": lambda t, u: np.sort(t[0, 0]),
    "t.argsort(0)": lambda t, u: t.argsort(0, kind="stable"),
    "np.argsort": lambda t, u: np.argsort(u, kind="stable"),
    "np.logaddexp": lambda t, u: np.logaddexp(t, u),
    "np.logaddexp2": lambda t, u: np.logaddexp2(t, 1.5),
    "np.float_power": lambda t, u: np.float_power(abs(t), 2),
    "np.heaviside": lambda t, u: np.heaviside(t, 0.5),
    "np.fabs": lambda t, u: np.fabs(t),
    "np.signbit": lambda t, u: np.signbit(t),
    "divmod quotient": lambda t, u: divmod(t, u)[0],
    "divmod remainder": lambda t, u: divmod(t, 3)[1],
    "rdivmod": lambda t, u: divmod(7, u)[1],
    "np.divmod": lambda t, u: np.divmod(t, u)[0],
    "np.moveaxis": lambda t, u: np.moveaxis(t[None], 0, -1),
    "np.moveaxis several": lambda t, u: np.moveaxis(t[None], (0, 1), (2, 0)),
    "np.moveaxis bad": lambda t, u: np.moveaxis(t, 0, 5),
    "np.hstack": lambda t, u: np.hstack([t, u]),
    "np.hstack 1-d and a scalar": lambda t, u: np.hstack([t[0], u[1], 5]),
    "np.vstack": lambda t, u: np.vstack((t, u[0])),
    "np.outer": lambda t, u: np.outer(t[0], u[1:]),
    "np.zeros_like": lambda t, u: np.zeros_like(t),
    "np.ones_like dtype": lambda t, u: np.ones_like(t, dtype="float32"),
    "np.full_like": lambda t, u: np.full_like(t, 7),
    "np.full_like shape": lambda t, u: np.full_like(u, 2, shape=(2,)),
    "t.max(initial)": lambda t, u: t.max(axis=0, initial=1),
    "t.min(initial) of nothing": lambda t, u: t[:0].min(axis=0, initial=2),
    "np.max(initial) of nothing": lambda t, u: np.max(t[:0], initial=-1, keepdims=True),
    "t.sum(initial)": lambda t, u: t.sum(initial=3),
    "t.prod(axis, initial)": lambda t, u: u.prod(axis=1, initial=2),
    "np.broadcast_to": lambda t, u: np.broadcast_to(t[0], (2, 3, 4)),
    "np.flip": lambda t, u: np.flip(t),
    "np.flip axis": lambda t, u: np.flip(t, axis=-1),
    "np.diff": lambda t, u: np.diff(t),
    "np.diff n=2 axis=0": lambda t, u: np.diff(t, n=2, axis=0),
    "np.diff n=-1": lambda t, u: np.diff(t, n=-1),
    "np.roll": lambda t, u: np.roll(t, 5),
    "np.roll axis": lambda t, u: np.roll(t, -1, axis=1),
    "np.roll axis, by 0": lambda t, u: np.roll(t, 0, axis=0),
    "np.roll axis, past its length": lambda t, u: np.roll(t, 7, axis=-1),
    "np.roll axis of a transposed view": lambda t, u: np.roll(t.T, -2, axis=0),
    "np.roll axes": lambda t, u: np.roll(t, (1, 2), axis=(0, 1)),
    "np.roll one shift, two axes": lambda t, u: np.roll(t, 3, axis=(0, -1)),
    "np.roll shifts, no axis": lambda t, u: np.roll(t, [1, 2]),
    "np.roll 0-d": lambda t, u: np.roll(t[0, 0], 1),
    "np.roll axis out of range": lambda t, u: np.roll(t, 1, axis=2),
    "np.roll float shift": lambda t, u: np.roll(t, 1.5),
    "np.roll shifts and axes disagree": lambda t, u: np.roll(t, (1, 2, 3), axis=(0, 1)),
    "np.tril": lambda t, u: np.tril(t),
    "np.triu k=1": lambda t, u: np.triu(t, 1),
    "np.tril k=-1 batched": lambda t, u: np.tril(np.stack([t, u]), -1),
    "np.triu 1-d": lambda t, u: np.triu(t[0]),
    "np.tril 0-d": lambda t, u: np.tril(t[0, 0]),
    "np.repeat": lambda t, u: np.repeat(t, 2),
    "np.repeat axis": lambda t, u: np.repeat(t, 3, axis=0),
    "np.repeat axis=-1": lambda t, u: np.repeat(t[0], 2, axis=-1),
    "np.tile": lambda t, u: np.tile(t, 2),
    "np.tile more reps than axes": lambda t, u: np.tile(t[0], (2, 1, 3)),
    "np.tile fewer reps than axes": lambda t, u: np.tile(t, (3,)),
    "np.tile 0-d": lambda t, u: np.tile(t[0, 0], ()),
    "np.tile negative": lambda t, u: np.tile(t, -1),
    "np.einsum": lambda t, u: np.einsum("ij,kj->ik", t, u),
    "np.einsum implicit": lambda t, u: np.einsum("ij,ij", t, u),
    "np.einsum diagonal": lambda t, u: np.einsum("ii->i", t[:, :3]),
    "np.einsum ellipsis": lambda t, u: np.einsum("...j,...j->...", t, u[0]),
    "np.einsum batched": lambda t, u: np.einsum("bij,bkj->bik", np.stack([t, u]),
                                                np.stack([u, t]), optimize=True),
    "np.einsum sizes disagree": lambda t, u: np.einsum("ij,jk", t, u),
    "np.einsum bad output": lambda t, u: np.einsum("ij->k", t),
}
APPROX_EVERYDAY = {"np.linalg.norm": lambda t, u: np.linalg.norm(t),  # (a dot or a sum:
                   "np.linalg.norm axis": lambda t, u: np.linalg.norm(t, axis=1),  # rounding)
                   "np.linalg.norm keepdims": lambda t, u: np.linalg.norm(u, keepdims=True)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(EVERYDAY))
def test_everyday_numpy_functions(session, name, dtype):
    expect_same(session, EVERYDAY[name], data(dtype, seed=60),
                data(dtype, kind="positive", seed=61), label=name)
    session.sync()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", list(APPROX_EVERYDAY))
def test_everyday_numpy_functions_within_rounding(session, name, dtype):
    expect_same(session, APPROX_EVERYDAY[name], data(dtype, seed=64),
                data(dtype, kind="positive", seed=65), approx=True, label=name)
    session.sync()


def test_everyday_reads_and_descriptions(session):
    array = data("int32", seed=62)
    t = session.asarray(array)
    assert t.tolist() == array.tolist() and t[0, 0].tolist() == array[0, 0].tolist()
    assert t.itemsize == array.itemsize == 4
    assert (int(array[1, 2]) in t) is True and (100 in t) is False
    assert np.allclose(t, array) is True and np.allclose(t, t + 1) is False
    empty = np.empty_like(t, dtype="float32")
    assert (type(empty), empty.shape, empty.dtype) == (Tensor, (3, 4), np.dtype("float32"))


def test_a_keyword_fabric_does_not_take_is_named_in_numpys_terms(session):
    t = session.asarray(data("float64", seed=63))
    with pytest.raises(TypeError, match=r"numpy.concatenate on fabric tensors: got an "
                                        r"unexpected keyword argument 'dtype'; read"):
        np.concatenate([t, t], dtype="float32")
    with pytest.raises(TypeError, match=r"numpy.zeros_like on fabric tensors: .*'order'"):
        np.zeros_like(t, order="F")


def test_an_unsupported_numpy_function_is_named_with_its_submodule(session):
    t = session.asarray(np.eye(3))
    for call, name in ((np.linalg.eigvals, "numpy.linalg.eigvals"),
                       (lambda t: np.linalg.matrix_power(t, 2), "numpy.linalg.matrix_power"),
                       (np.linalg.tensorinv, "numpy.linalg.tensorinv")):
        with pytest.raises(TypeError, match=rf"^{re.escape(name)} is not supported"):
            call(t)


def test_numpy_functions_stay_remote(session):
    t = poisoned(session)  # any download would raise RemoteError here
    results = [np.sum(t, axis=0), np.mean(t), np.sin(t), np.add(t, 1), np.maximum(t, t),
               np.where(t > 0, t, 0), np.clip(t, 0, 1), np.concatenate([t, t]),
               np.stack([t, t]), np.expand_dims(t, 0), np.transpose(t), np.reshape(t, (2, 1)),
               np.matmul(t, t), np.dot(t, t), np.argmax(t), np.copy(t), np.float32(2) * t,
               np.int64(3) + t, np.round(t), np.ravel(t), np.isclose(t, t), np.cumsum(t),
               np.sort(t), np.argsort(t), np.nan_to_num(t), np.moveaxis(t, 0, 0),
               np.hstack([t, t]), np.vstack([t, t]), np.outer(t, t), np.divmod(t, t)[0],
               np.logaddexp(t, t), np.zeros_like(t)[0] + t[0], np.flip(t), np.diff(t),
               np.roll(t, 1), np.repeat(t, 2), np.linalg.norm(t),
               np.tril(np.stack([t, t])), np.einsum("i,i", t, t)]
    assert all(isinstance(r, Tensor) for r in results)
    assert np.shape(t) == (2,) and np.ndim(t) == 1 and np.size(t) == 2
    with pytest.raises(RemoteError):
        results[0].numpy()  # the poison flowed through, as it should


def test_tensors_of_two_sessions_in_one_op_raise_value_error(session, shared_cluster):
    with shared_cluster.connect(device=0) as other_session:
        mine = session.asarray(data("float64", seed=45))
        theirs = other_session.asarray(data("float64", seed=46))
        for fn in [operator.add, lambda a, b: b - a, np.maximum,
                   lambda a, b: a @ b.T, lambda a, b: np.where(a > 0, a, b),
                   lambda a, b: np.concatenate([a, b]), lambda a, b: np.stack([b, a]),
                   lambda a, b: a.clip(b, None), lambda a, b: np.dot(a, b.T)]:
            with pytest.raises(ValueError, match="another session"):
                fn(mine, theirs)
        session.sync()
        other_session.sync()
        np.testing.assert_array_equal((mine + 1).numpy(), data("float64", seed=45) + 1)


def test_asarray_of_another_sessions_tensor_is_not_silently_foreign(session, shared_cluster):
    with shared_cluster.connect(device=0) as other_session:
        theirs = other_session.asarray(data("float64", seed=47))
        try:
            moved = session.asarray(theirs)
        except ValueError:
            return  # refusing is fine too
        assert moved.session is session
        np.testing.assert_array_equal(moved.numpy(), data("float64", seed=47))


def test_descriptions_do_not_read(session):
    t = poisoned(session)  # reading it would raise
    assert (t.ndim, t.size, t.nbytes, len(t), np.shape(t)) == (1, 2, 16, 2, (2,))
    for text in (repr(t), str(t)):  # (printing reads: a failed op is shown, not raised)
        assert "(2,)" in text and "int64" in text and "unreadable: RemoteError" in text
    with pytest.raises(RemoteError):
        t.numpy()


def test_tensors_are_made_by_sessions_not_by_the_class(session):
    with pytest.raises(TypeError, match="made by a session: use session.asarray"):
        Tensor(session, 1, (2,), np.dtype("float64"))
    made = [session.zeros((2, 3)), session.asarray(np.ones(4)), session.zeros(3) + 1.0,
            -session.zeros(5), session.zeros((2, 2)).sum(axis=0)]
    assert [(t.shape, t.size, t.session) for t in made] == [
        ((2, 3), 6, session), ((4,), 4, session), ((3,), 3, session), ((5,), 5, session),
        ((2,), 2, session)]
    assert len({t.id for t in made}) == len(made)
