"""The numexpr device: it matches the numpy device op for op, and fuses what it says it fuses.

End to end, over real processes: a numpy worker and a numexpr worker (two local clusters,
one module's worth; the numexpr device fuses every size here, where by default it leaves
arrays under 32K elements to numpy) get the same uploads and the same ops, each also on
deferred copies of its inputs on the numexpr device, and every result read back from
the numexpr device must have the numpy device's dtype and shape and its values: exactly for
bool and integer results (and for nan, inf and their positions), and within floating-point
tolerance otherwise: float64 within rtol = atol = 1e-12 (1e-10 after chains of many ops,
1e-9 for sums of a million elements, added in another order), float32 within 1e-5.
(numexpr uses the C library's functions where numpy has its own SIMD ones; both are
within a few ulp of the exact result.) Where numpy fails, the numexpr device
fails alike: at the call site (the client's inference is shared) or, for data-dependent
errors, at the read, naming the same op.

Sans I/O: the backend is driven directly, and through an ``Executor``, to count what it
fuses and evaluates: a chain of N elementwise ops is one numexpr evaluation.
"""

from __future__ import annotations

import numpy as np
import pytest

from fabric import LocalCluster
from fabric.arrays.tensor import Tensor
from fabric.core.errors import QuotaExceeded, RemoteError, error_from_wire
from fabric.core.ops import OPS
from fabric.core.protocol import Kind, Message
from fabric.core.worker_options import NUMEXPR_MIN_SIZE_ENV
from fabric.workers.backends.numexpr_backend import (BLOCK, MAX_LEAVES, MAX_OPS, MIN_SIZE,
                                                     Deferred, DeferredError, NumexprDevice,
                                                     fused_ops)
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor

from conftest import HEARTBEAT

DTYPES = ["bool", "int32", "int64", "float32", "float64"]
# The op table's elementwise ufuncs (where, clip and astype are tested on their own)
UFUNCS = {name: op.impl for name, op in OPS.items()
          if op.elementwise and isinstance(op.impl, np.ufunc)}
BINARY = sorted(name for name, ufunc in UFUNCS.items() if ufunc.nin == 2)
UNARY = sorted(name for name, ufunc in UFUNCS.items() if ufunc.nin == 1)
TOLERANCE = {np.dtype("float32"): 1e-5, np.dtype("float64"): 1e-12, np.dtype("float16"): 1e-3}
# Python scalars are weak in NumPy 2 promotion, numpy scalars are not; -2..3 and 0.5 are
# exponents the device inlines; 2**40 overflows int32 (refused at the call site by both, but
# compared by value by numpy's comparisons).
SCALARS = [True, 0, 2, 3, -1, -2, 2.5, -0.5, 2**40, np.bool_(True), np.int32(3),
           np.int64(-2), np.float32(2.0), np.float64(0.5)]


# -- helpers ----------------------------------------------------------------------------------

def data(dtype, shape=(4, 5), seed=0):
    """Seeded data with zeros and negatives; floats begin with nan, inf, -inf, -0.0, 0.0."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return np.asarray(rng.random(shape) < 0.5)
    if dt.kind == "i":
        return rng.integers(-6, 7, shape).astype(dt)
    array = np.asarray(rng.uniform(-4, 4, shape)).astype(dt)
    flat = array.reshape(-1)
    flat[:5] = [np.nan, np.inf, -np.inf, -0.0, 0.0][:flat.size]
    return array


def outcome(tensor):
    """What reading a tensor gives: ("value", array) or ("error", failing op name)."""
    try:
        return "value", tensor.numpy()
    except RemoteError as exc:
        return "error", exc.details.get("op")


def assert_same(expected, got, label, rtol=None):
    """A numexpr-device outcome equals the numpy device's (floats within tolerance)."""
    assert expected[0] == got[0], f"{label}: numpy device {expected}, numexpr device {got}"
    if expected[0] == "error":
        assert expected[1] == got[1], f"{label}: failing op {expected[1]} vs {got[1]}"
        return
    want, have = expected[1], got[1]
    assert have.dtype == want.dtype and have.shape == want.shape, \
        f"{label}: {want.dtype}{want.shape} vs {have.dtype}{have.shape}"
    if want.dtype.kind == "f":
        tol = rtol or TOLERANCE[want.dtype]
        np.testing.assert_allclose(have, want, rtol=tol, atol=tol, equal_nan=True,
                                   err_msg=label)
    else:
        np.testing.assert_array_equal(have, want, err_msg=label, strict=True)


def deferred(tensor):
    """The same values, as the result of an elementwise op (a deferred value on numexpr)."""
    return tensor | False if tensor.dtype == np.bool_ else tensor * 1


class Pair:
    """A session on the numpy device and one on the numexpr device, fed the same work."""

    def __init__(self, reference, fused):
        self.sessions = (reference, fused)
        self.pending = []  # (label, numpy-device result, numexpr-device results, rtol)

    def check(self, label, fn, *args, also_deferred=True, rtol=None):
        """Apply ``fn`` to the uploaded ``args`` (arrays; anything else passes as it is) on
        both devices; with ``also_deferred``, also to deferred copies on the numexpr device.
        Call-site refusals must match at once; values are compared by ``flush``."""
        results = []
        for session, variants in zip(self.sessions, ([False], [False, True])):
            uploaded = [session.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
            for lazy in variants if also_deferred else [False]:
                operands = [deferred(a) if lazy and isinstance(a, Tensor) else a
                            for a in uploaded]
                try:
                    with np.errstate(all="ignore"):
                        results.append(fn(*operands))
                except Exception as exc:
                    results.append(type(exc))
        reference, *fused = results
        for result in fused:
            if isinstance(reference, type):
                assert result is reference, f"{label}: numpy refused with {reference}, " \
                                            f"numexpr device gave {result}"
            else:
                assert isinstance(result, Tensor), f"{label}: numexpr device refused {result}"
                assert (result.shape, result.dtype) == (reference.shape, reference.dtype)
        if not isinstance(reference, type):
            self.pending.append((label, reference, fused, rtol))

    def flush(self):
        """Read everything checked since the last flush and compare; both sessions stay clean."""
        for label, reference, fused, rtol in self.pending:
            expected = outcome(reference)
            for result in fused:
                assert_same(expected, outcome(result), label, rtol)
        self.pending.clear()
        for session in self.sessions:
            session.sync()  # every error was reported by a read: nothing is left over


@pytest.fixture(scope="module")
def clusters():
    """A numpy worker and a numexpr worker that fuses ops of every size (the small arrays
    of these tests included), each behind its own broker. Their memory budget is past any
    machine's, so that an op too big to allocate fails inside numpy and numexpr (a fused
    evaluation's failure), not at the budget (tests/cluster/test_worker_memory.py)."""
    unbounded = ("--memory-budget", "1000TiB")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(NUMEXPR_MIN_SIZE_ENV, "0")  # the workers' environment is this process's
        with LocalCluster(workers=1, heartbeat=HEARTBEAT, worker_args=unbounded) as reference, \
                LocalCluster(workers=1, backend="numexpr", heartbeat=HEARTBEAT,
                             worker_args=unbounded) as fused:
            yield reference, fused


@pytest.fixture
def pair(clusters):
    """Fresh sessions on both devices, closed after the test."""
    reference, fused = clusters
    with reference.connect() as a, fused.connect() as b:
        yield Pair(a, b)


# -- the device says what it is -------------------------------------------------------------

def test_device_settings_in_welcome_and_devices(clusters, pair):
    import numexpr
    _, fused = clusters
    [device] = fused.devices()
    settings = pair.sessions[1].device.settings  # from WELCOME
    assert device.backend == "numexpr" and settings == device.settings
    assert settings["backend"] == "numexpr" and settings["version"] == numexpr.__version__
    assert isinstance(settings["threads"], int) and settings["threads"] >= 1
    assert {"add", "multiply", "divide", "sin", "where", "less"} <= set(settings["fuses"])
    assert not {"floor_divide", "remainder", "astype", "sum", "matmul"} & set(settings["fuses"])
    assert set(settings["fuses"]) == set(fused_ops()) and settings["max_ops"] == MAX_OPS
    assert settings["min_size"] == 0  # as the fixture asked, through the environment
    assert pair.sessions[0].device.settings["fuses"] == []


# -- op for op --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", BINARY)
def test_binary_op_with_tensors_of_every_dtype(pair, name):
    fn = getattr(np, name)
    for left in DTYPES:
        for right in DTYPES:
            pair.check(f"{name}({left}, {right})", fn, data(left, seed=1), data(right, seed=2))
    pair.flush()


@pytest.mark.parametrize("name", BINARY)
def test_binary_op_with_scalars(pair, name):
    fn = getattr(np, name)
    for dtype in DTYPES:
        for scalar in SCALARS:
            label = f"{type(scalar).__name__}({scalar})"
            pair.check(f"{name}({dtype}, {label})", lambda t: fn(t, scalar), data(dtype, seed=3))
            pair.check(f"{name}({label}, {dtype})", lambda t: fn(scalar, t), data(dtype, seed=4))
    pair.flush()


@pytest.mark.parametrize("name", UNARY)
def test_unary_op_of_every_dtype(pair, name):
    fn = getattr(np, name)
    for dtype in DTYPES:
        pair.check(f"{name}({dtype})", fn, data(dtype, seed=5))
    pair.flush()


def test_where_with_every_condition_and_branch_dtype(pair):
    for cond in DTYPES:
        for x in DTYPES:
            for y in DTYPES:
                pair.check(f"where({cond}, {x}, {y})", np.where, data(cond, seed=6),
                           data(x, seed=7), data(y, seed=8))
        for scalar in [True, 2, 2.5, np.float32(1.5), np.int64(7)]:
            pair.check(f"where({cond}, f32, {scalar!r})", np.where, data(cond, seed=9),
                       data("float32", seed=10), scalar)
            pair.check(f"where({cond}, {scalar!r}, i32)", np.where, data(cond, seed=9),
                       scalar, data("int32", seed=10))
    pair.flush()


def test_ops_it_runs_eagerly_match_too(pair):
    """clip, astype, round, isclose and nan_to_num are elementwise but not fused, scans
    are not elementwise: they still take deferred inputs."""
    for dtype in DTYPES:
        a = data(dtype, seed=11)
        pair.check(f"clip {dtype}", lambda t: np.clip(t, 0, 2), a)
        pair.check(f"round {dtype}", lambda t: np.round(t, 1), a)
        pair.check(f"isclose {dtype}", lambda t: np.isclose(t, 1, equal_nan=True), a)
        pair.check(f"nan_to_num {dtype}", lambda t: np.nan_to_num(t, posinf=5), a)
        pair.check(f"cumsum {dtype}", lambda t: np.cumsum(t, axis=1), a)
        pair.check(f"sort {dtype}", lambda t: np.sort(t, axis=None), a)
        for target in DTYPES:
            pair.check(f"astype {dtype}->{target}", lambda t: t.astype(target), a)
    pair.flush()


@pytest.mark.parametrize("shapes", [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)),
                                    ((), (3, 4)), ((3, 4), ()), ((1,), (2, 1, 3)),
                                    ((0, 4), (4,))])
def test_broadcasting(pair, shapes):
    left, right = (data("float64", shape, seed) for seed, shape in enumerate(shapes))
    for name in ["add", "arctan2", "maximum", "less"]:
        pair.check(f"{name} {shapes}", getattr(np, name), left, right)
    pair.check(f"where {shapes}", lambda a, b: np.where(a > b, a, 2 * b), left, right)
    pair.check(f"int32 {shapes}", lambda a, b: a.astype("int32") * 3 + b, left, right)
    pair.flush()


def test_empty_operands_broadcast_as_numpy_does(pair):
    # numexpr itself gives (0, 1) for (0, 1) + (1, 0): empty results are numpy's to make
    for dtype in DTYPES:
        for left, right in [((0, 1), (1, 0)), ((0, 3), (1, 3)), ((2, 1), (1, 0)), ((0,), ())]:
            pair.check(f"add {dtype} {left} {right}", np.add, np.zeros(left, dtype),
                       np.ones(right, dtype))
    pair.flush()


def test_integer_edges_wrap_and_shift_as_numpy_does(pair):
    big = np.array([2**31 - 1, -2**31, -1, 0, 7, 2**30], np.int32)
    counts = np.array([-1, 0, 1, 31, 32, 33], np.int32)
    for dtype in ["int32", "int64"]:
        a = big.astype(dtype)
        c = counts.astype(dtype) * (2 if dtype == "int64" else 1)
        for name in ["add", "multiply", "subtract", "left_shift", "right_shift"]:
            pair.check(f"{name} {dtype} edges", getattr(np, name), a, c)
        for name in ["negative", "absolute", "square", "sign", "invert"]:
            pair.check(f"{name} {dtype} edges", getattr(np, name), a)
    pair.flush()


def test_powers_take_numpys_fast_paths_for_exponents_it_does_not_step_through(pair):
    """numpy's float power loop computes x ** 0.5 as sqrt(x) (sqrt(-inf) is nan, pow's is
    inf) when the exponent is a scalar or one broadcast element, and pow otherwise."""
    for dtype in ["float32", "float64"]:
        x = data(dtype, (4, 5), seed=27)
        for exponent in [0.5, -0.5, 1.5, 2, -1, 3, 0, 0.25]:
            for shape in [(), (1,), (1, 1), (5,)]:
                e = np.full(shape, exponent, dtype)
                pair.check(f"{dtype} ** {exponent} {shape}", np.power, x, e)
            pair.check(f"{dtype} ** {exponent}", lambda t: t ** exponent, x)
    pair.flush()


def test_signed_zero_scalars_keep_their_sign(pair):
    x = np.array([1.0, -2.0, 0.0, np.inf])
    signs = []
    for session in pair.sessions:
        t = session.asarray(x)
        results = [np.copysign(t, 0.0), np.copysign(t, -0.0), t * -0.0, 1 / (t * 0 - 0.0)]
        signs.append([np.signbit(r.numpy()).tolist() for r in results])
    assert signs[0] == signs[1]


def test_views_and_zero_dimensional_inputs(pair):
    a = data("float64", (4, 6), seed=12)
    pair.check("transposed", lambda t: np.sin(t.T) * t.T[::-1] + 1, a)
    pair.check("sliced", lambda t: t[1:, ::2] * 2 - t[:-1, 1::2], a)
    pair.check("0-d", lambda t: t * 2 + 1, np.array(3.5))
    pair.check("0-d float32 with a Python float", lambda t: t * 2.5 + 1, np.array(3.5, np.float32))
    pair.flush()


# -- chains ----------------------------------------------------------------------------------

def test_long_fused_chains_match_and_are_evaluated_in_few_expressions(pair):
    a, b = data("float64", (50, 40), seed=13), data("float64", (50, 40), seed=14)
    a, b = np.nan_to_num(a, posinf=1, neginf=-1), np.nan_to_num(b, posinf=1, neginf=-1)

    def chain(x, y, steps=300):
        for i in range(steps):
            x = [lambda: x * 0.999 + y / 7, lambda: np.sin(x) + 0.5 * np.cos(y),
                 lambda: np.where(x > 0.1, x - 0.01, np.tanh(x)), lambda: (x + 1) ** 2 / 3,
                 lambda: np.maximum(x, y * 0.5) - np.abs(y) / 9][i % 5]()
        return x

    fused = pair.sessions[1]
    before = fused.stats()
    pair.check("300-op chain", chain, a, b, also_deferred=False, rtol=1e-10)
    pair.flush()
    after = fused.stats()
    ops = after["ops_fused"] - before["ops_fused"]
    evaluated = after["expressions_evaluated"] - before["expressions_evaluated"]
    # MAX_OPS ops at most per evaluation; values read several times (x in the where) cut
    # expressions earlier, but an evaluation still serves 20 ops or more on average
    assert ops >= 300 and ops / MAX_OPS <= evaluated <= ops / 20


def test_chains_across_dtypes(pair):
    i32, i64, f32, b = data("int32", seed=15), data("int64", seed=16), \
        data("float32", seed=17), data("bool", seed=18)

    def mixed(i32, i64, f32, b):
        x = (i32 + 1) * 3 - i64  # int64
        y = x / 2 + f32 * 2.5  # float64
        z = (f32 * 2.5 + 1) * f32  # float32 throughout: Python floats are weak
        w = np.where(b, z, i32 * 2)  # float64
        return (y > w) | (b & (x > 0)) | ~np.isfinite(z)

    pair.check("mixed dtypes", mixed, i32, i64, f32, b)
    pair.check("float32 stays float32", lambda f, i: (f * 2.5 - 1) / (f + 0.5) + i, f32,
               data("float32", seed=19))
    pair.check("bool arithmetic", lambda p, q: (p + q) * (p > q) + 2 * p, b,
               data("bool", seed=20))
    pair.check("int to float upcasts", lambda p, q: np.sqrt(np.abs(p * q)) + p / q,
               data("int32", seed=21), data("int32", seed=22))
    pair.flush()


def test_chains_mixed_with_reductions_and_matmul(pair):
    a, b = data("float64", (6, 5), seed=23), data("float64", (5, 4), seed=24)
    a, b = np.nan_to_num(a), np.nan_to_num(b)

    def mixed(a, b):
        s = (a * 2 + 1).sum(axis=1, keepdims=True)  # a reduction consumes a chain
        m = (np.tanh(a) - s / 10) @ (b * b + 1)  # matmul consumes two
        return np.sqrt(np.abs(m)) * 3 - m.max(axis=0)  # and a chain continues

    pair.check("reductions and matmul", mixed, a, b)
    pair.check("mean of a chain", lambda a: (np.exp(a / 4) - 1).mean(), a)
    pair.check("argmax of a chain", lambda a, b: (a[:, :4] * b[:4] - 1).argmax(axis=1), a, b)
    pair.flush()


def test_whole_reductions_of_large_chains_match(pair):
    """Evaluated a block at a time on the numexpr device, without the chain's temporary."""
    size = 4 * BLOCK + 12345
    rng = np.random.default_rng(31)
    a, b = rng.random(size), rng.random(size) * 2 - 1
    w4 = lambda a, b: 2 * a + 3 * b * a - a / (b + 1.5)  # noqa: E731
    for name in ["sum", "max", "min", "prod"]:
        pair.check(f"{name} of a chain", lambda a, b: getattr(w4(a, b), name)(), a, b,
                   also_deferred=False, rtol=1e-9)
    pair.check("sum keepdims", lambda a: (np.sin(a) ** 2).sum(keepdims=True), a)
    pair.check("any/all", lambda a, b: ((a > b) & (b < 0)).any() | (a >= 0).all(), a, b)
    pair.check("int sum", lambda a: ((a * 100).astype("int32") * 3 - 7).sum(), a)
    for name, initial in [("sum", 1e6), ("max", 50.0), ("min", -50.0)]:  # counted once
        pair.check(f"{name} from {initial}",
                   lambda a, b: getattr(w4(a, b), name)(initial=initial), a, b,
                   also_deferred=False, rtol=1e-9)
    pair.flush()


def test_poisoning_inside_a_chain_names_the_op_that_failed(pair):
    base = np.array([2, 3, 4], np.int64)
    exponent = np.array([1, -1, 2], np.int64)  # integer to a negative power: data-dependent
    outcomes = []
    for session in pair.sessions:
        x, e = session.asarray(base), session.asarray(exponent)
        doubled = x * 2
        powered = doubled ** e  # fails on the device
        after = (powered + 1) * 3  # poisoned, downstream
        sibling = doubled + 3  # fine
        total = after.sum()  # a non-elementwise consumer: poisoned too
        outcomes.append([outcome(sibling), outcome(after), outcome(total), outcome(powered)])
        session.sync()  # the reads reported the error: the next sync is clean
    reference, fused = outcomes
    for label, expected, got in zip(["sibling", "after", "sum", "power"], reference, fused):
        assert_same(expected, got, label)
    assert fused[1] == ("error", "power") and fused[0][0] == "value"


def test_a_failure_inside_a_fused_evaluation_poisons_the_op_that_failed(pair):
    """The chain only fails when evaluated (the add's result cannot be allocated): the error
    still names the add, the add's tensor is poisoned, and it is reported once."""
    for session in pair.sessions:
        a = session.zeros((2**20, 1))
        b = session.zeros((1, 2**20))
        big = a + b  # 8 TiB: numpy fails here, the numexpr device when it evaluates
        scaled = big * 2
        total = scaled.sum()
        with pytest.raises(RemoteError) as raised:
            total.numpy()
        assert raised.value.details["op"] == "add"
        assert "MemoryError" in str(raised.value)
        with pytest.raises(RemoteError, match="add failed"):
            big.numpy()
        with pytest.raises(RemoteError, match="add failed"):
            scaled.numpy()
        session.sync()  # reported once


def test_reading_an_intermediate_then_continuing_the_chain(pair):
    a, b = data("float64", seed=25), data("float32", seed=26)

    def run(session):
        x, y = session.asarray(a), session.asarray(b)
        t = x * y + 1  # float64
        u = np.sin(t) * 2
        first = t.numpy()  # the intermediate, read in the middle of the chain
        v = u + t / 3  # continues from the evaluated t and the deferred u
        w = t * 0  # reuses t's value
        return [first, u.numpy(), v.numpy(), w.numpy(), t.numpy()]

    for expected, got in zip(run(pair.sessions[0]), run(pair.sessions[1])):
        assert_same(("value", expected), ("value", got), "intermediate")


def test_a_deferred_value_moves_to_another_session(clusters, pair):
    _, fused = clusters
    a = np.nan_to_num(data("float64", seed=33))
    source = pair.sessions[1]
    with fused.connect() as other:
        chain = np.cos(source.asarray(a)) * 2 + 1  # deferred on the device
        moved = chain.to(other)
        np.testing.assert_array_equal(moved.numpy(), chain.numpy())
        np.testing.assert_allclose(moved.numpy(), np.cos(a) * 2 + 1, rtol=1e-12)


def test_graphs_replayed_on_the_numexpr_device_fuse_and_match(pair):
    """A traced function's elementwise chain is fused on each replay, from programs compiled
    on the first call; results match the numpy device's."""
    import fabric

    @fabric.function
    def step(a, b, c):
        return 2 * a + 3 * b * c - a / (b + 1), (np.sin(a) ** 2 + np.cos(b) ** 2).sum()

    values = [np.nan_to_num(data("float64", (30, 20), seed)) for seed in (28, 29, 30)]
    results = []
    for session in pair.sessions:
        tensors = [session.asarray(v) for v in values]
        for _ in range(3):
            out, total = step(*tensors)
        results.append((out.numpy(), total.numpy(), session.stats()))
    (ref_out, ref_total, _), (out, total, stats) = results
    np.testing.assert_allclose(out, ref_out, rtol=1e-12)
    np.testing.assert_allclose(total, ref_total, rtol=1e-12)
    assert stats["graph_replays"] == 2 and stats["ops_fused"] >= 3 * 11
    assert stats["expressions_evaluated"] <= 3 * 2  # two chains per call, one evaluation each


# -- sans I/O: the backend -------------------------------------------------------------------

def run(device, name, *inputs, **params):
    return device.run(OPS[name], list(inputs), params)


def test_a_chain_of_elementwise_ops_is_one_evaluation():
    device = NumexprDevice(0, min_size=0)
    a, b = np.linspace(-1, 1, 1000), np.linspace(2, 3, 1000)
    x = a
    for i in range(20):
        x = run(device, ["add", "multiply", "sin", "subtract"][i % 4], x,
                *([] if i % 4 == 2 else [b]))
    assert isinstance(x, Deferred) and device.expressions_evaluated == 0
    result = device.materialize(x)
    expected = a
    for i in range(20):
        expected = [np.add, np.multiply, np.sin, np.subtract][i % 4](
            expected, *([] if i % 4 == 2 else [b]))
    np.testing.assert_allclose(result, expected, rtol=1e-12)
    assert (device.ops_fused, device.expressions_evaluated, device.ops_eager) == (20, 1, 0)
    assert device.materialize(x) is result and device.expressions_evaluated == 1  # kept


def test_ops_on_small_arrays_run_eagerly_by_default():
    device = NumexprDevice(0)
    assert device.min_size == MIN_SIZE > 0
    small, large = np.ones(MIN_SIZE - 1), np.ones(MIN_SIZE)
    assert isinstance(run(device, "add", run(device, "sin", small), 1), np.ndarray)
    assert isinstance(run(device, "add", run(device, "sin", large), 1), Deferred)
    assert (device.ops_eager, device.ops_fused) == (2, 2)
    broadcast = run(device, "add", np.ones((MIN_SIZE // 4, 1)), np.ones(4))  # by result size
    assert isinstance(broadcast, Deferred)


def test_a_whole_reduction_of_a_chain_is_evaluated_blockwise_and_the_chain_stays():
    device = NumexprDevice(0, min_size=0)
    a = np.random.default_rng(32).random(4 * BLOCK + 7)
    chain = run(device, "multiply", run(device, "sin", a), 3.0)
    total = run(device, "sum", chain, axis=None, keepdims=False)
    assert isinstance(total, np.ndarray) and total.dtype == np.float64
    np.testing.assert_allclose(total, np.sum(np.sin(a) * 3.0), rtol=1e-12)
    assert chain.value is None and device.expressions_evaluated == 1  # no temporary made
    assert run(device, "max", chain, axis=None, keepdims=True).shape == (1,)
    # along an axis, or over broadcast inputs: the ordinary way, by evaluating the chain
    wide = run(device, "add", a[:BLOCK].reshape(-1, 1), np.ones(8))
    np.testing.assert_allclose(run(device, "sum", wide, axis=None, keepdims=False),
                               8 * a[:BLOCK].sum() + 8 * BLOCK, rtol=1e-12)
    assert wide.value is not None


def test_compiled_programs_are_reused_across_chains_and_arrays():
    device = NumexprDevice(0, min_size=0)
    for seed in range(5):
        a, b, c = (np.random.default_rng(seed + k).random(100) for k in range(3))
        value = device.materialize(
            run(device, "subtract", run(device, "add", run(device, "multiply", 2, a),
                                        run(device, "multiply", run(device, "multiply", 3, b),
                                            c)),
                run(device, "divide", a, run(device, "add", b, 1))))
        np.testing.assert_allclose(value, 2 * a + 3 * b * c - a / (b + 1), rtol=1e-12)
    assert device.expressions_evaluated == 5 and device.programs_compiled == 1


def test_bounds_evaluate_long_chains_and_wide_expressions():
    device = NumexprDevice(0, min_size=0)
    x = np.zeros(10)
    for _ in range(MAX_OPS * 3):
        x = run(device, "add", x, 1.0)
    assert device.expressions_evaluated == 2  # every MAX_OPS ops, and not before
    np.testing.assert_array_equal(device.materialize(x), np.full(10, MAX_OPS * 3.0))
    assert device.expressions_evaluated == 3

    device = NumexprDevice(0, min_size=0)
    arrays = [np.full(4, float(i)) for i in range(MAX_LEAVES + 8)]
    total = arrays[0]
    for array in arrays[1:]:
        total = run(device, "add", total, array)
    assert device.expressions_evaluated == 1  # when the inputs passed MAX_LEAVES
    np.testing.assert_array_equal(device.materialize(total), np.full(4, sum(range(40)) * 1.0))


def test_values_read_several_times_are_evaluated_once_when_a_bound_cuts():
    device = NumexprDevice(0, min_size=0)
    x = np.linspace(0.5, 1.5, 8)
    for _ in range(200):  # x + x spells x twice: the text doubles at each step
        x = run(device, "multiply", run(device, "add", x, x), 0.5)
    np.testing.assert_allclose(device.materialize(x), np.linspace(0.5, 1.5, 8), rtol=1e-12)
    # each cut evaluates the shared x once (not each of its uses): 8 ops or more per program
    assert device.expressions_evaluated <= 400 // 8 and device.programs_compiled == 1
    y = np.linspace(-1, 1, 8)
    for _ in range(100):
        y = run(device, "where", run(device, "greater", y, 0.5), run(device, "tanh", y),
                run(device, "multiply", y, 0.9))
    expected = np.linspace(-1, 1, 8)
    for _ in range(100):
        expected = np.where(expected > 0.5, np.tanh(expected), expected * 0.9)
    np.testing.assert_allclose(device.materialize(y), expected, rtol=1e-12)


def test_ops_numexpr_computes_differently_run_eagerly_with_numpy():
    device = NumexprDevice(0, min_size=0)
    a = np.array([-7, -1, 0, 5, 2**31 - 1], np.int32)
    b = np.array([2, -3, 4, 0, -1], np.int32)
    with np.errstate(all="ignore"):
        for name in ["floor_divide", "remainder", "fmod"]:  # integer division and modulo
            got = run(device, name, run(device, "add", a, 0), b)
            assert isinstance(got, np.ndarray)
            np.testing.assert_array_equal(got, getattr(np, name)(a, b), strict=True)
        assert device.ops_eager == 3 and device.expressions_evaluated == 3  # inputs evaluated
        for name in ["cbrt", "exp2"]:  # numexpr has no such function
            assert isinstance(run(device, name, a.astype(np.float64)), np.ndarray)
        f16 = np.array([0.5, 2.0], np.float16)  # numexpr has no float16
        assert run(device, "add", f16, f16).dtype == np.float16
        assert isinstance(run(device, "sin", np.array([True])), np.ndarray)  # float16 result
        with pytest.raises(ValueError, match="negative integer powers"):
            run(device, "power", a, b)  # numpy's data-dependent error, at once


def test_float32_with_python_scalars_stays_float32_and_numpy_scalars_promote():
    device = NumexprDevice(0, min_size=0)
    f = np.linspace(0, 1, 5, dtype=np.float32)
    weak = run(device, "add", run(device, "multiply", f, 2.5), 1)
    strong = run(device, "multiply", f, np.float64(2.5))
    assert weak.dtype == np.float32 and strong.dtype == np.float64
    np.testing.assert_array_equal(device.materialize(weak), f * 2.5 + 1, strict=True)
    np.testing.assert_array_equal(device.materialize(strong), f * np.float64(2.5), strict=True)
    ints = run(device, "divide", np.arange(5, dtype=np.int32), 2)
    assert ints.dtype == np.float64
    np.testing.assert_array_equal(device.materialize(ints), np.arange(5) / 2, strict=True)


def test_a_deferred_value_is_an_array_for_code_that_asks():
    device = NumexprDevice(0, min_size=0)
    x = run(device, "multiply", np.arange(4.0), 2)
    assert (x.shape, x.dtype, x.nbytes) == ((4,), np.dtype(np.float64), 32)
    np.testing.assert_array_equal(np.asarray(x), [0, 2, 4, 6])
    assert device.expressions_evaluated == 1


def test_a_failed_evaluation_names_the_op_and_flows_to_dependents():
    device = NumexprDevice(0, min_size=0)
    big = run(device, "add", np.zeros((2**20, 1)), np.zeros((1, 2**20)))
    scaled = run(device, "multiply", big, 2.0)
    shifted = run(device, "add", scaled, 1.0)
    with pytest.raises(DeferredError) as raised:
        device.materialize(shifted)
    assert raised.value.deferred is big and isinstance(raised.value.cause, MemoryError)
    with pytest.raises(DeferredError) as again:
        run(device, "sum", scaled)  # a consumer of a failed chain fails the same way
    assert again.value.deferred is big


# -- sans I/O: the executor's hook -----------------------------------------------------------

SESSION = 0x5E55


def opened(device, memory_limit=None):
    executor = Executor(device, memory_limit)
    assert executor.handle(Message(Kind.OPEN, SESSION, 1, {"device": 0}))[0].kind == Kind.OPENED
    return executor


def submit(executor, *ops, buffers=()):
    body = {"ops": list(ops)}
    assert executor.handle(Message(Kind.SUBMIT, SESSION, 0, body, buffers)) == []


def request(executor, **body):
    [reply] = executor.handle(Message(Kind.REQUEST, SESSION, 9, body))
    return reply


def test_executor_reads_and_syncs_evaluate_deferred_values():
    executor = opened(NumexprDevice(0, min_size=0))
    device = executor.device
    submit(executor,
           ["arange", 1, [], {"start": 0, "stop": 6, "step": 1, "dtype": "<f8"}],
           *[["multiply" if i % 2 else "add", i + 2, [i + 1, [1.5]], {}] for i in range(10)],
           ["sin", 20, [11], {}])
    session = executor.sessions[SESSION]
    assert isinstance(session.tensors[11], Deferred) and device.expressions_evaluated == 0
    reply = request(executor, op="read", id=11)
    expected = np.arange(6.0)
    for i in range(10):
        expected = expected * 1.5 if i % 2 else expected + 1.5
    got = np.frombuffer(reply.buffers[0], reply.body["dtype"]).reshape(reply.body["shape"])
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    assert device.expressions_evaluated == 1 and isinstance(session.tensors[11], np.ndarray)
    assert request(executor, op="sync").body == {"ok": True}  # evaluates what is left
    assert not any(isinstance(v, Deferred) for v in session.tensors.values())
    stats = request(executor, op="stats").body
    assert (stats["ops_fused"], stats["expressions_evaluated"]) == \
        (11, device.expressions_evaluated)


def test_executor_charges_deferred_values_their_full_size_as_numpy_would():
    for device in (NumpyDevice(0), NumexprDevice(0, min_size=0)):
        executor = opened(device, memory_limit=3 * 800)
        submit(executor,
               ["zeros", 1, [], {"shape": [100], "dtype": "<f8"}],
               ["add", 2, [1, [1.0]], {}],
               ["multiply", 3, [2, [2.0]], {}],  # the third 800-byte tensor: at the limit
               ["sin", 4, [3], {}])  # one too many, though nothing was computed yet
        error = error_from_wire(request(executor, op="read", id=4).body["error"])
        assert isinstance(error, QuotaExceeded) and error.details["op"] == "sin"
        assert executor.sessions[SESSION].resident == 3 * 800
        assert getattr(device, "expressions_evaluated", 0) == 0


def test_executor_poisons_the_failing_op_of_a_fused_chain_and_reports_it_once():
    executor = opened(NumexprDevice(0, min_size=0))
    submit(executor,
           ["zeros", 1, [], {"shape": [2**20, 1], "dtype": "<f8"}],
           ["zeros", 2, [], {"shape": [1, 2**20], "dtype": "<f8"}],
           ["add", 3, [1, 2], {}],
           ["multiply", 4, [3, [2.0]], {}],
           ["add", 5, [4, [1.0]], {}])
    sync = request(executor, op="sync").body  # evaluates 3, 4 and 5: the add of 3 fails
    error = error_from_wire(sync["error"])
    assert error.details == {"op": "add", "tensor": 3}
    assert "MemoryError" in error.message
    session = executor.sessions[SESSION]
    assert {3, 4, 5} <= set(session.poisoned) and not {3, 4, 5} & set(session.tensors)
    assert request(executor, op="sync").body == {"ok": True}
    assert error_from_wire(request(executor, op="read", id=5).body["error"]).details["op"] == "add"
