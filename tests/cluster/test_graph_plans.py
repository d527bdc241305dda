"""Graphs compiled per signature (issue 29): a registered graph's plan on each device, and the
numexpr device's per-op choice between numpy and numexpr.

End to end on real processes (the shared numpy cluster, and conftest's numexpr session that
fuses every size); then the worker's side without I/O: the plans
``workers.registered_graphs.register`` compiles, run on the arrays a call binds.
"""

from __future__ import annotations

import tracemalloc

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_executor import SESSION, opened, read, submit

import fabric
from fabric.core.errors import RemoteError
from fabric.core.ops import Spec
from fabric.graphs.function import Tracer, _flatten, trace_function
from fabric.workers.backends.base import GraphOpError
from fabric.workers.backends.numexpr_backend import MIN_SIZE, NumexprDevice
from fabric.workers.backends.numexpr_graphs import SERIAL_OPS
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.registered_graphs import register


def cheap(x, b, c):
    """Issue 29's step: 50 multiply/add ops."""
    for _ in range(25):
        x = x * b + c
    return x


def mixed(x, y):
    """Elementwise runs around a reduction and a view, with intermediates the caller sees."""
    doubled = x * 2.0 - y
    head = doubled[:2]  # a view of an intermediate, which dies next: its buffer is not reused
    scaled = (doubled * 3.0 + 1.0) / (y * y + 1.0)
    total = scaled.sum(axis=-1, keepdims=True)
    return head, np.tanh(scaled - total) * 0.5 + x, total, scaled


@pytest.fixture(params=["numpy", "numexpr"])
def any_session(request, shared_cluster, numexpr_session):
    """A session on each device: the shared numpy cluster's, and a numexpr device that fuses
    every size (so that these small graphs compile to programs)."""
    if request.param == "numexpr":
        yield numexpr_session
        return
    with shared_cluster.connect(device=0) as opened:
        yield opened


# -- end to end ----------------------------------------------------------------------------------

def test_one_graph_replayed_with_two_signatures_gives_numpys_results(any_session):
    traced = fabric.function(mixed)
    before = any_session.stats()
    rng = np.random.default_rng(7)
    signatures = [(rng.random(1000), rng.random(1000)),
                  (rng.random((3, 4)).astype("float32"), rng.integers(-3, 4, (3, 4)))]
    for x, y in signatures * 2:  # each signature twice: traced and registered, then replayed
        inputs = [x.copy(), y.copy()]
        results = traced(*(any_session.asarray(v) for v in inputs))
        for got, expected in zip(results, mixed(x, y)):
            assert (got.shape, got.dtype) == (expected.shape, expected.dtype)
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6 if x.dtype == "f4"
                                       else 1e-12)
    after = any_session.stats()
    assert [after[k] - before[k] for k in ("graph_registrations", "graph_replays")] == [2, 2]


def test_an_op_failing_between_compiled_runs_names_the_op_and_the_line(any_session):
    @fabric.function
    def powers(x, e):
        scaled = (x * 3 + 1) * 2 - x
        raised = scaled ** e  # integers to negative powers: numpy refuses, on the data
        return raised * 2 + scaled, scaled

    ints = any_session.asarray(np.arange(1, 4))
    bad, scaled = powers(ints, any_session.asarray(np.array([2, -1, 2])))
    with pytest.raises(RemoteError, match="Integers to negative integer powers") as caught:
        bad.numpy()
    error = caught.value
    assert (error.details["op"], error.details["graph_op"]) == ("power", 4)
    line = next(number for number, text in enumerate(open(__file__), 1)
                if text.strip().startswith("raised = scaled ** e"))
    assert f"test_graph_plans.py, line {line}" in str(error)  # the user's line
    with pytest.raises(RemoteError):
        scaled.numpy()  # every output of the failed call is poisoned
    good, scaled = powers(ints, any_session.asarray(np.array([2, 2, 2])))
    x = np.arange(1, 4)
    np.testing.assert_array_equal(scaled.numpy(), (x * 3 + 1) * 2 - x)
    np.testing.assert_array_equal(good.numpy(), ((x * 3 + 1) * 2 - x) ** 2 * 2
                                  + (x * 3 + 1) * 2 - x)


def test_buffers_reused_inside_a_graph_are_never_ones_the_caller_sees(any_session):
    x_np, y_np = np.linspace(-1, 1, 6).reshape(2, 3), np.linspace(2, 3, 6).reshape(2, 3)
    x, y = any_session.asarray(x_np), any_session.asarray(y_np)
    traced = fabric.function(mixed)
    for _ in range(2):
        outputs = [t.numpy() for t in traced(x, y)]
    for got, expected in zip(outputs, mixed(x_np, y_np)):
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_array_equal(x.numpy(), x_np)  # inputs unchanged
    np.testing.assert_array_equal(y.numpy(), y_np)


# -- the worker's side, without I/O --------------------------------------------------------------

def registered(device, fn, *specs):
    """``fn`` traced for ``specs`` (shape, dtype) by the client's tracer and registered on
    ``device`` as the worker does: its RegisteredGraph."""
    tracer = Tracer("inputs")
    leaves = [tracer.placeholder(Spec(shape, np.dtype(dtype))) for shape, dtype in specs]
    graph = trace_function(fn, fn.__name__, _flatten((tuple(leaves), {}), []), leaves)
    return register(msgpack.unpackb(msgpack.packb(graph.register_op[3])), device)  # as sent


def test_a_plan_writes_each_intermediate_into_a_dying_ones_buffer():
    n = 100_000
    graph = registered(NumpyDevice(0), cheap, *[((n,), "f8")] * 3)
    x, b, c = np.random.default_rng(1).random((3, n))
    inputs = [x.copy(), b.copy(), c.copy()]
    graph.plan(inputs, None)  # (numpy's first calls may allocate for themselves)
    tracemalloc.start()
    try:
        [result] = graph.plan(inputs, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * x.nbytes  # one buffer for all 50 ops: without out=, two at once
    np.testing.assert_allclose(result, cheap(x, b, c), rtol=1e-12)
    for array, original in zip(inputs, (x, b, c)):
        np.testing.assert_array_equal(array, original)
        assert not np.shares_memory(result, array)


def test_a_plans_outputs_and_inputs_never_share_a_reused_buffer():
    for device in (NumpyDevice(0), NumexprDevice(0, min_size=0)):
        graph = registered(device, mixed, ((4, 5), "f8"), ((4, 5), "f8"))
        x, y = np.random.default_rng(2).random((2, 4, 5))
        inputs = [x.copy(), y.copy()]
        outputs = graph.plan(inputs, None)
        for got, expected in zip(outputs, mixed(x, y)):
            np.testing.assert_allclose(got, expected, rtol=1e-12)
        for index, one in enumerate(outputs):
            assert not any(np.shares_memory(one, other) for other in outputs[index + 1:])
        assert not any(np.shares_memory(o, i) for o in outputs for i in inputs)
        np.testing.assert_array_equal(inputs[0], x)


def test_the_numexpr_device_compiles_a_long_small_run_once_and_leaves_short_ones_to_numpy():
    device = NumexprDevice(0, min_size=MIN_SIZE)  # the default: 1,000 elements are small
    long = registered(device, cheap, *[((1000,), "f8")] * 3)
    assert device.programs_compiled == 1  # at registration, not at the first call
    x, b, c = np.random.default_rng(3).random((3, 1000))
    for _ in range(3):
        [result] = long.plan([x, b, c], None)
    np.testing.assert_allclose(result, cheap(x, b, c), rtol=1e-12)
    assert (device.ops_fused, device.expressions_evaluated, device.programs_compiled) == \
        (3 * 50, 3, 1)

    def short(x, b):
        return (x * b + 1.0) * b  # fewer than SERIAL_OPS ops: numpy's calls are faster
    assert 3 < SERIAL_OPS
    registered(device, short, ((1000,), "f8"), ((1000,), "f8")).plan([x, b], None)
    assert (device.expressions_evaluated, device.programs_compiled) == (3, 1)


def test_a_program_that_fails_names_the_op_that_fails_when_run_one_at_a_time():
    def two(x, y):
        return x * 2.0 + y

    device = NumexprDevice(0, min_size=0)
    graph = registered(device, two, ((3,), "f8"), ((3,), "f8"))
    # (the executor checks a call's shapes first; bound directly, numexpr fails to broadcast)
    with pytest.raises(GraphOpError) as caught:
        graph.plan([np.ones(3), np.ones(4)], None)
    assert caught.value.index == 1 and "broadcast" in str(caught.value.cause)
    assert device.expressions_evaluated == 0


def test_small_streamed_ops_on_the_numexpr_device_are_numpys_calls_and_large_ones_defer():
    device = NumexprDevice(0, min_size=MIN_SIZE)
    executor = opened(device=device)
    for tensor, size in ((1, 1000), (2, MIN_SIZE)):
        submit(executor, ["arange", tensor, [], {"start": 0, "stop": size, "step": 1,
                                                 "dtype": "<f8"}])
    eager = device.ops_eager
    submit(executor, ["multiply", 3, [1, 2.0], {}], ["add", 4, [3, 1], {}],
           ["multiply", 5, [2, 2.0], {}], ["add", 6, [5, 2], {}])
    tensors = executor.sessions[SESSION].tensors
    assert [type(tensors[t]).__name__ for t in (3, 4, 5, 6)] == \
        ["ndarray", "ndarray", "Deferred", "Deferred"]
    assert (device.ops_eager - eager, device.ops_fused) == (0, 2)  # small ones never reach it
    np.testing.assert_array_equal(read(executor, 4), np.arange(1000.0) * 3)
    np.testing.assert_array_equal(read(executor, 6), np.arange(float(MIN_SIZE)) * 3)


EXACT_BINARY = ["add", "subtract", "multiply", "maximum", "minimum", "greater", "equal",
                "logical_or"]
EXACT_UNARY = ["negative", "absolute", "square", "floor"]


@st.composite
def elementwise_graphs(draw):
    """Input dtypes and a chain of exact elementwise ops, each reading earlier values (inputs
    included, some more than once) or scalars, and which of the values it returns."""
    dtypes = [draw(st.sampled_from(["bool", "int32", "int64", "float32", "float64"]))
              for _ in range(2)]
    steps = []
    for made in range(2, 2 + draw(st.integers(1, 24))):
        source = st.integers(0, made - 1)
        if draw(st.booleans()):
            other = draw(st.one_of(source, st.sampled_from([(2,), (0.5,), (-3.0,), (True,)])))
            steps.append((draw(st.sampled_from(EXACT_BINARY)), draw(source), other))
        else:
            steps.append((draw(st.sampled_from(EXACT_UNARY)), draw(source), None))
    made = 2 + len(steps)
    returned = sorted(set(draw(st.lists(st.integers(0, made - 1), min_size=1, max_size=4))
                          + [made - 1]))
    return dtypes, steps, returned


def chain_function(steps, returned):
    def chain(x, y):
        values = [x, y]
        for name, source, other in steps:
            ufunc = getattr(np, name)
            args = [values[source]] + ([] if other is None else  # (a scalar: in a tuple)
                                       [values[other] if type(other) is int else other[0]])
            values.append(ufunc(*args))
        return tuple(values[i] for i in returned)
    return chain


@settings(max_examples=60, deadline=None, derandomize=True)
@given(elementwise_graphs())
def test_compiled_elementwise_chains_agree_with_numpy_on_both_devices(graph):
    dtypes, steps, returned = graph
    chain = chain_function(steps, returned)
    rng = np.random.default_rng(len(steps))
    x, y = (np.asarray(rng.integers(-3, 4, (4, 5)) * 0.75).astype(d) for d in dtypes)
    with np.errstate(all="ignore"):
        try:
            expected = chain(x, y)
        except TypeError:  # numpy refuses it (negative of a bool): so does the trace
            return
        for device in (NumpyDevice(0), NumexprDevice(0, min_size=0)):
            inputs = [x.copy(), y.copy()]
            got = registered(device, chain, ((4, 5), dtypes[0]), ((4, 5), dtypes[1])).plan(
                inputs, None)
            for one, other in zip(got, expected):
                assert np.asarray(one).dtype == other.dtype
                np.testing.assert_allclose(np.asarray(one, float), np.asarray(other, float),
                                           rtol=1e-6)
            np.testing.assert_array_equal(inputs[0], x)
            np.testing.assert_array_equal(inputs[1], y)
