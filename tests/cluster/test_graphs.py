"""Graphs: trace once per signature, register once, replay; the worker's side without I/O.

End-to-end tests run on the real processes of the shared cluster; the worker's rules are
also driven directly on ``workers.executor.Executor``, with the helpers of test_executor.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from test_executor import SESSION, opened, read, request, submit

import fabric
from fabric.arrays.stream import MAX_BATCH_GRAPH_OPS
from fabric.core.errors import GraphError, ProtocolError, RemoteError, TraceError, error_from_wire
from fabric.core.ops import OPS, Spec
from fabric.core.protocol import Kind, Message
from fabric.core.wire import GRAPH_CACHE_SIZE
from fabric.graphs.function import Tracer, _flatten, call, trace_function
from fabric.workers.backends.base import GraphStep, graph_step
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor


def step(a, b, c):
    """The issue's example: an elementwise chain and a reduction."""
    return 2 * a + 3 * b * c - a / (b + 1), (a * b).sum()


def arrays(n: int = 50, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random(n), rng.random(n), rng.random(n)]


# -- end to end: results, registration and replay ---------------------------------------------

def test_graph_calls_are_sent_at_graph_batch_ops_of_their_ops_whatever_is_freed_between(session):
    def twenty_ops(x):
        for _ in range(20):
            x = x + 1.0
        return x

    traced = fabric.function(twenty_ops)
    x = session.zeros(10)
    traced(x).numpy()  # traced and registered
    calls = -(-MAX_BATCH_GRAPH_OPS // 20)
    sent = session.stream.counts["batches_sent"]
    for _ in range(calls - 1):  # each call's input is freed after it: entries, not calls
        x = traced(x)
    assert session.stream.counts["batches_sent"] == sent
    x = traced(x)
    assert session.stream.counts["batches_sent"] == sent + 1
    assert x.numpy()[0] == 20.0 * calls


def test_replay_equals_eager_execution_and_numpy(session):
    values = arrays()
    a, b, c = (session.asarray(v) for v in values)
    traced = fabric.function(step)
    expected = step(*values)
    for _ in range(3):
        out, total = traced(a, b, c)
        np.testing.assert_allclose(out.numpy(), expected[0], rtol=1e-12)
        np.testing.assert_allclose(total.numpy(), expected[1], rtol=1e-12)
    eager_out, eager_total = step(a, b, c)
    assert (out.shape, out.dtype, total.shape) == (eager_out.shape, eager_out.dtype, ())
    np.testing.assert_array_equal(out.numpy(), eager_out.numpy())
    np.testing.assert_array_equal(total.numpy(), eager_total.numpy())


def test_one_registration_then_replays_of_one_small_op_each(session):
    a, b, c = (session.asarray(v) for v in arrays())
    traced = fabric.function(step)
    traced(a, b, c)
    before = session.stats()
    for _ in range(10):
        out, total = traced(a, b, c)
    after = session.stats()
    assert after["ops_sent"] - before["ops_sent"] == 10  # one op per call, whatever the graph
    assert (after["graph_registrations"], after["graph_replays"]) == (1, 10)
    assert after["bytes_saved_by_replay"] > 10 * 100  # the graph's ops were not sent again
    assert (after["ops_fused"], after["expressions_evaluated"]) == (0, 0)  # numpy: none
    assert after["graphs"] == 1
    assert total.numpy() == pytest.approx(float((a * b).sum().numpy()))


def test_results_keep_the_functions_structure_and_constants(session):
    @fabric.function
    def parts(x, scale, pair):
        first, second = pair
        return {"scaled": x * scale, "both": [first + second, (first - second, 7)],
                "same": x}

    x_np, p_np, q_np = arrays(8)
    x, p, q = (session.asarray(v) for v in (x_np, p_np, q_np))
    result = parts(x, 2.5, (p, q))
    assert set(result) == {"scaled", "both", "same"}
    np.testing.assert_allclose(result["scaled"].numpy(), x_np * 2.5)
    total, (difference, seven) = result["both"]
    np.testing.assert_allclose(total.numpy(), p_np + q_np)
    np.testing.assert_allclose(difference.numpy(), p_np - q_np)
    assert seven == 7
    np.testing.assert_array_equal(result["same"].numpy(), x_np)


def test_a_new_signature_traces_again_and_a_known_one_does_not(session):
    traced = fabric.function(lambda x, k: x * k + 1)
    small, large = session.ones(4), session.ones(6)
    np.testing.assert_array_equal(traced(small, 2).numpy(), [3] * 4)
    np.testing.assert_array_equal(traced(large, 2).numpy(), [3] * 6)  # new shape
    np.testing.assert_array_equal(traced(small.astype("float32"), 2).numpy(), [3] * 4)  # dtype
    np.testing.assert_array_equal(traced(small, 3).numpy(), [4] * 4)  # new constant
    traced(small, 2.0)  # 2.0 is not 2: a float constant promotes differently
    assert len(traced.graphs) == 5
    traced(large, 2)
    traced(small, 3)
    assert len(traced.graphs) == 5
    assert session.stats()["graph_registrations"] == 5


def test_graphs_past_the_cache_size_are_evicted_and_registered_again(session):
    traced = fabric.function(lambda x: x + 1)
    tensors = [session.zeros(n) for n in range(1, GRAPH_CACHE_SIZE + 2)]  # one graph each
    for tensor in tensors:
        traced(tensor)
    stats = session.stats()
    assert stats["graph_registrations"] == GRAPH_CACHE_SIZE + 1
    assert stats["graphs"] == GRAPH_CACHE_SIZE  # the first one was freed
    np.testing.assert_array_equal(traced(tensors[0]).numpy(), [1.0])  # registered again
    np.testing.assert_array_equal(traced(tensors[-1]).numpy(), [1.0] * (GRAPH_CACHE_SIZE + 1))
    stats = session.stats()
    assert stats["graph_registrations"] == GRAPH_CACHE_SIZE + 2
    assert stats["graphs"] == GRAPH_CACHE_SIZE
    assert len(traced.graphs) == GRAPH_CACHE_SIZE + 1  # traced once each, all along


def test_a_function_keeps_its_most_recently_called_traces_only(session, monkeypatch):
    monkeypatch.setattr(fabric.graphs.function, "TRACE_CACHE_SIZE", 3)
    traced = fabric.function(lambda x, k: x + k)
    x = session.zeros(2)
    for k in range(5):  # every new constant is a new trace
        traced(x, k)
    traced(x, 2)  # used again: kept ahead of 3
    traced(x, 5)
    assert [key[1][-1] for key in traced.graphs] == [(int, 4), (int, 2), (int, 5)]
    np.testing.assert_array_equal(traced(x, 0).numpy(), [0.0, 0.0])  # traced again, right
    assert len(traced.graphs) == 3


def test_a_graph_is_registered_again_on_another_session(session, shared_cluster):
    traced = fabric.function(step)
    values = arrays()
    with shared_cluster.connect(device=1) as other:
        for target in (session, other, session, other):
            out, _ = traced(*(target.asarray(v) for v in values))
            np.testing.assert_allclose(out.numpy(), step(*values)[0])
        assert other.stats()["graph_registrations"] == 1
        with pytest.raises(ValueError, match="another session"):
            traced(session.ones(50), other.ones(50), other.ones(50))
    assert session.stats()["graph_registrations"] == 1
    assert len(traced.graphs) == 1


def test_session_compile_binds_the_session_and_uploads_arrays(session, shared_cluster):
    compiled = session.compile(lambda x, y: (x @ y).sum(axis=0))
    x_np, y_np = np.arange(6.0).reshape(2, 3), np.ones((3, 2))
    np.testing.assert_array_equal(compiled(x_np, y_np).numpy(), (x_np @ y_np).sum(axis=0))
    with shared_cluster.connect(device=1) as other:
        with pytest.raises(ValueError, match="another session"):
            compiled(other.asarray(x_np), other.asarray(y_np))


def test_random_ops_and_creation_inside_a_graph_use_the_session(session):
    traced = fabric.function(lambda x: x + x.session.random.uniform(size=x.shape)
                             + x.session.ones(x.shape))
    x = session.zeros(5)
    session.random.seed(3)
    first = traced(x).numpy()
    session.random.seed(3)
    np.testing.assert_array_equal(traced(x).numpy(), first)
    np.testing.assert_allclose(first, np.random.default_rng(3).uniform(size=5) + 1)


def test_a_traced_function_called_from_another_is_inlined(session):
    inner = fabric.function(lambda x: x * 2)
    outer = fabric.function(lambda x: inner(x) + inner(x + 1))
    np.testing.assert_array_equal(outer(session.ones(3)).numpy(), [6.0] * 3)
    assert session.stats()["graph_registrations"] == 1
    assert not inner.graphs


# -- end to end: refused at trace time -------------------------------------------------------

@pytest.mark.parametrize("body, says", [
    (lambda x: x if x.sum() > 0 else -x, "bool(t)"),
    (lambda x: x * float(x[0]), "float(t)"),
    (lambda x: x + x.max().item(), "t.item()"),
    (lambda x: x + x.numpy(), "t.numpy()"),
    (lambda x: x + x.numpy(out=np.zeros(4)), "t.numpy()"),
    (lambda x: x[:int(x.sum())], "int(t)"),
    (lambda x: np.asarray(x) + 1, "np.asarray(t)"),
], ids=["if", "float", "item", "numpy", "numpy_out", "int", "asarray"])
def test_control_flow_on_tensor_values_is_refused_at_trace_time(session, body, says):
    traced = fabric.function(body)
    x = session.ones(4)
    sent = session.stats()["ops_sent"]
    with pytest.raises(TraceError, match="traced function") as caught:
        traced(x)
    assert isinstance(caught.value, TypeError)  # what numpy users catch for such misuse
    message = str(caught.value)
    assert says in message and "np.where" in message and "test_graphs.py" in message
    assert session.stats()["ops_sent"] == sent  # nothing was sent
    np.testing.assert_array_equal((x + 1).numpy(), [2.0] * 4)  # the session goes on


def test_tensors_from_outside_uploads_and_escapes_are_refused_clearly(session):
    outside = session.ones(3)
    with pytest.raises(TraceError, match="pass it as an argument"):
        fabric.function(lambda x: x + outside)(session.ones(3))
    with pytest.raises(TraceError, match="pass it as an argument"):
        fabric.function(lambda x: outside * x)(session.ones(3))
    with pytest.raises(TraceError, match="upload it once"):
        fabric.function(lambda x: x + np.arange(3.0))(session.ones(3))
    with pytest.raises(TraceError, match="seed the session"):
        fabric.function(lambda x: (x.session.random.seed(1), x)[1])(session.ones(3))
    with pytest.raises(TraceError, match="outside the traced function"):
        fabric.function(lambda x: (x.session.sync(), x)[1])(session.ones(3))
    with pytest.raises(TraceError, match="returned no tensor"):
        fabric.function(lambda x: None)(session.ones(3))
    kept = []
    fabric.function(lambda x: kept.append(x + 1) or x)(session.ones(3))
    with pytest.raises(TraceError, match="after the trace ended"):
        kept[0] * 2
    with pytest.raises(TypeError, match="without a tensor"):
        fabric.function(lambda k: k)(3)
    with pytest.raises(TypeError, match="session.compile"):
        fabric.function(lambda x: x)(np.ones(3))


# -- end to end: bad input reaches the worker --------------------------------------------------

def test_an_op_failing_inside_a_graph_names_the_graph_and_the_line(session):
    @fabric.function
    def powers(x, e):
        doubled = x * 2
        return doubled ** e, doubled

    ints = session.asarray(np.arange(1, 4))
    bad, doubled = powers(ints, session.asarray(np.array([-1, -1, -1])))
    with pytest.raises(RemoteError, match="Integers to negative integer powers") as caught:
        bad.numpy()
    error = caught.value
    assert error.details["graph_name"].endswith("powers") and error.details["graph_op"] == 1
    assert "inside" in str(error) and "test_graphs.py" in str(error)
    with pytest.raises(RemoteError):
        doubled.numpy()  # every output of the failed call is poisoned
    good, _ = powers(ints, session.asarray(np.array([2, 2, 2])))
    np.testing.assert_array_equal(good.numpy(), [4, 16, 36])  # the graph and session go on
    session.sync()


def test_an_unknown_graph_and_wrong_bindings_give_typed_errors(session):
    a, b, c = (session.asarray(v) for v in arrays())
    traced = fabric.function(step)
    traced(a, b, c)
    graph = next(iter(traced.graphs.values()))
    forged = dataclasses.replace(graph, id=10**9, name="forged")
    session.stream.graphs[forged.id] = forged  # the client believes the worker holds it
    unknown = call(session, forged, [a, b, c])
    with pytest.raises(GraphError, match="#1000000000") as caught:
        unknown[0].numpy()
    assert "not held" in str(caught.value)
    with pytest.raises(GraphError):
        unknown[1].numpy()
    for inputs, says in [([a, b], "bound 2"), ([a, b, session.ones(7)], r"\(7,\)"),
                         ([a, b, c.astype("float32")], "float32")]:
        outputs = call(session, graph, inputs)
        with pytest.raises(GraphError, match=says) as caught:
            outputs[0].numpy()
        assert caught.value.details["graph_name"].endswith("step")
    out, _ = traced(a, b, c)  # the session goes on
    np.testing.assert_allclose(out.numpy(), step(*arrays())[0])
    session.sync()


# -- the worker's side, without I/O -----------------------------------------------------------

AXPY = {"graph": 7, "name": "axpy", "inputs": [[[3], "<f8"], [[3], "<f8"]],
        "ops": [["multiply", 3, [1, [2.0]], {}], ["add", 4, [3, 2], {}],
                ["sum", 5, [4], {"axis": None, "keepdims": False}]],
        "outputs": [4, 5]}


def register(executor: Executor, params: dict = AXPY) -> None:
    submit(executor, ["graph_register", 0, [], params])


def call_graph(executor: Executor, first: int, inputs: list, graph: int = 7,
               outputs: int = 2) -> None:
    submit(executor, ["graph_call", first, inputs, {"graph": graph, "outputs": outputs}])


def with_inputs(device: NumpyDevice | None = None) -> Executor:
    executor = opened(device=device)
    submit(executor, ["arange", 1, [], {"start": 0, "stop": 3, "step": 1, "dtype": "<f8"}],
           ["ones", 2, [], {"shape": [3], "dtype": "<f8"}])
    return executor


def error_of(executor: Executor, tensor_id: int) -> Exception:
    return error_from_wire(request(executor, op="read", id=tensor_id).body["error"])


def test_worker_registers_once_replays_and_keeps_no_intermediates():
    executor = with_inputs()
    register(executor)
    for first in (10, 20, 30):
        call_graph(executor, first, [1, 2])
    np.testing.assert_array_equal(read(executor, 30), [1.0, 3.0, 5.0])
    assert read(executor, 31) == 9.0
    stats = request(executor, op="stats").body
    assert (stats["graph_registrations"], stats["graph_replays"], stats["graphs"]) == (1, 2, 1)
    assert stats["bytes_saved_by_replay"] > 0
    assert stats["tensors"] == 2 + 3 * 2  # inputs and outputs only
    assert stats["ops"] == 2 + 1 + 3  # ops received: one per call
    assert request(executor, op="sync").body == {"ok": True}


def test_worker_unknown_graph_poisons_every_output_and_the_session_goes_on():
    executor = with_inputs()
    call_graph(executor, 10, [1, 2], graph=99)
    for tensor_id in (10, 11):
        error = error_of(executor, tensor_id)
        assert isinstance(error, GraphError) and "#99" in error.message
    register(executor)
    call_graph(executor, 20, [1, 2])
    np.testing.assert_array_equal(read(executor, 20), [1.0, 3.0, 5.0])


@pytest.mark.parametrize("inputs, outputs, says", [
    ([1], 2, "bound 1"),
    ([1, 2], 3, "asked for 3"),
    ([1, 3], 2, r"takes a \(3,\) float64.*\(2,\) float64"),
    ([1, 4], 2, "int64"),
    ([1, [2.0]], 2, "does not exist"),
], ids=["count", "outputs", "shape", "dtype", "scalar"])
def test_worker_wrong_bindings_are_graph_errors_naming_the_graph(inputs, outputs, says):
    executor = with_inputs()
    submit(executor, ["ones", 3, [], {"shape": [2], "dtype": "<f8"}],
           ["ones", 4, [], {"shape": [3], "dtype": "<i8"}])
    register(executor)
    call_graph(executor, 10, inputs, outputs=outputs)
    error = error_from_wire(request(executor, op="sync").body["error"])
    assert isinstance(error, GraphError) and error.details["graph"] == 7
    assert "'axpy'" in error.message and re.search(says, error.message), error.message
    assert isinstance(error_of(executor, 10), GraphError)
    call_graph(executor, 20, [1, 2])
    assert read(executor, 21) == 9.0


def test_worker_a_freed_input_is_a_graph_error_and_a_poisoned_one_flows_through():
    executor = with_inputs()
    register(executor)
    submit(executor, 2)  # freed
    call_graph(executor, 10, [1, 2])
    error = error_of(executor, 10)
    assert isinstance(error, GraphError) and "tensor 2" in error.message
    request(executor, op="sync")
    submit(executor, ["reshape", 3, [1], {"shape": [4]}])  # fails: poisons tensor 3
    submit(executor, ["ones", 4, [], {"shape": [3], "dtype": "<f8"}])
    call_graph(executor, 20, [3, 4])
    error = error_of(executor, 21)
    assert error.details["op"] == "reshape"  # the input's own error, not a new one
    assert request(executor, op="sync").body == {"ok": True}  # and the read reported it


def test_worker_an_op_failing_inside_names_its_index_and_poisons_all_outputs():
    executor = opened()
    submit(executor, ["arange", 1, [], {"start": 1, "stop": 4, "step": 1, "dtype": "<i8"}])
    register(executor, {"graph": 3, "name": "neg_power", "inputs": [[[3], "<i8"]],
                        "ops": [["add", 2, [1, [1]], {}], ["power", 3, [2, [-1]], {}]],
                        "outputs": [2, 3]})
    call_graph(executor, 10, [1], graph=3)
    error = error_of(executor, 11)
    assert type(error) is RemoteError
    assert (error.details["graph_op"], error.details["op"]) == (1, "power")
    assert "op 1 of graph 'neg_power' (#3)" in error.message
    assert error_of(executor, 10).details["graph"] == 3


@pytest.mark.parametrize("ops, outputs, says", [
    ([["teleport", 2, [1], {}]], [2], "unknown op"),
    ([["add", 2, [5, 1], {}]], [2], "neither a defined local id"),
    ([["add", 1, [1, 1], {}]], [1], "new local id"),
    ([["add", 2, [1, 1], {}]], [9], "every output"),
    ([["add", 2, [1]]], [2], "malformed op"),
], ids=["op", "undefined", "redefined", "output", "malformed"])
def test_worker_malformed_registrations_are_reported_and_their_calls_say_why(ops, outputs,
                                                                            says):
    executor = with_inputs()
    register(executor, {"graph": 5, "name": "broken", "inputs": [[[3], "<f8"]], "ops": ops,
                        "outputs": outputs})
    error = error_from_wire(request(executor, op="sync").body["error"])
    assert isinstance(error, ProtocolError) and says in error.message
    assert error.details["graph_name"] == "broken"
    call_graph(executor, 10, [1], graph=5, outputs=1)
    assert says in error_of(executor, 10).message
    assert request(executor, op="sync").body == {"ok": True}  # reported once, at registration


def test_worker_malformed_calls_are_protocol_errors_not_crashes():
    executor = with_inputs()
    register(executor)
    submit(executor, ["graph_call", [10], [1, 2], {"graph": 7, "outputs": 2}],
           ["add", [11], [1, 2], {}])
    assert request(executor, op="sync").body["error"]["code"] == "protocol_error"
    call_graph(executor, 10, [1, 2], outputs=0)
    assert error_of(executor, 10).code == "protocol_error"
    call_graph(executor, 20, [1, 2])
    assert read(executor, 21) == 9.0


def test_worker_runs_a_graph_without_inputs():
    executor = opened()
    register(executor, {"graph": 4, "name": "make", "inputs": [], "outputs": [2],
                        "ops": [["ones", 1, [], {"shape": [2], "dtype": "<f8"}],
                                ["multiply", 2, [1, [4]], {}]]})
    call_graph(executor, 10, [], graph=4, outputs=1)
    np.testing.assert_array_equal(read(executor, 10), [4.0, 4.0])


def test_worker_evicts_the_least_recently_used_past_its_bound_and_frees_on_request():
    executor = with_inputs()
    for graph_id in range(1, GRAPH_CACHE_SIZE + 2):
        register(executor, {**AXPY, "graph": graph_id})
        if graph_id == 2:
            call_graph(executor, 100, [1, 2], graph=1)  # 1 is now more recent than 2
    held = executor.sessions[SESSION].graphs.held
    assert len(held) == GRAPH_CACHE_SIZE and 1 in held and 2 not in held
    submit(executor, ["graph_free", 0, [], {"graph": 1}])
    call_graph(executor, 10, [1, 2], graph=1)
    assert "not held" in error_of(executor, 10).message


class CompilingDevice(NumpyDevice):
    """A device with the optional hooks: it lowers a graph's elementwise ops to one step of
    its own and counts what it fuses."""

    counts_work = True

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.compiled: list[tuple[list, list[int]]] = []
        self.broken = False
        self.ops_fused = 0
        self.expressions_evaluated = 0

    def graph_steps(self, ops: list, specs: dict, outputs: list[int]) -> list:
        if self.broken:
            raise ValueError("this device cannot compile that")
        self.compiled.append(([(specs[i].shape, specs[i].dtype) for i in (1, 2)], outputs))
        elementwise = [op for op in ops if OPS[op.name].elementwise]

        def axpy(x, y):  # AXPY's elementwise ops, as one "expression"
            self.ops_fused += len(elementwise)
            self.expressions_evaluated += 1
            return x * 2 + y
        return [GraphStep(axpy, [1, 2], elementwise[-1].out,
                          tuple(op.index for op in elementwise)),
                *[graph_step(self.bind(OPS[op.name], op.params), op) for op in ops
                  if op not in elementwise]]


def test_worker_uses_a_devices_compiled_plan_and_credits_its_counters():
    device = CompilingDevice(0)
    executor = with_inputs(device)
    executor.handle(Message(Kind.OPEN, SESSION + 1, 1, {"device": 0}))
    register(executor)
    f8 = np.dtype("f8")
    assert device.compiled == [([((3,), f8), ((3,), f8)], [4, 5])]  # once, at registration
    call_graph(executor, 10, [1, 2])
    call_graph(executor, 20, [1, 2])
    np.testing.assert_array_equal(read(executor, 20), [1.0, 3.0, 5.0])
    assert read(executor, 21) == 9.0
    stats = request(executor, op="stats").body
    assert (stats["ops_fused"], stats["expressions_evaluated"]) == (4, 2)
    [other] = executor.handle(Message(Kind.REQUEST, SESSION + 1, 2, {"op": "stats"}))
    assert other.body["ops_fused"] == 0  # credited to the session that ran them


def test_worker_a_device_that_fails_to_compile_makes_a_broken_graph():
    executor = with_inputs(CompilingDevice(0))
    register(executor)
    executor.device.broken = True
    register(executor, {**AXPY, "graph": 9})
    error = error_from_wire(request(executor, op="sync").body["error"])
    assert "cannot compile" in error.message and "'axpy' (#9)" in error.message
    call_graph(executor, 10, [1, 2], graph=9)
    assert "cannot compile" in error_of(executor, 10).message
    call_graph(executor, 20, [1, 2])  # the graph compiled before is fine
    assert read(executor, 21) == 9.0


def test_worker_runs_graphs_traced_by_the_client():
    executor = with_inputs()
    inputs = Tracer("inputs")
    leaves = [inputs.placeholder(Spec((3,), np.dtype("f8"))) for _ in range(3)]
    graph = trace_function(step, "step", _flatten((tuple(leaves), {}), []), leaves)
    submit(executor, graph.register_op, ["ones", 3, [], {"shape": [3], "dtype": "<f8"}])
    call_graph(executor, 10, [1, 2, 3], graph=graph.id)
    expected = step(np.arange(3.0), np.ones(3), np.ones(3))
    np.testing.assert_allclose(read(executor, 10), expected[0])
    assert read(executor, 11) == expected[1]


# -- end to end on the jax device, where a graph is one XLA executable -------------------------

@pytest.mark.parametrize("case", [
    test_one_registration_then_replays_of_one_small_op_each,
    test_results_keep_the_functions_structure_and_constants,
    test_a_new_signature_traces_again_and_a_known_one_does_not,
    test_graphs_past_the_cache_size_are_evicted_and_registered_again,
    test_random_ops_and_creation_inside_a_graph_use_the_session,
    test_a_traced_function_called_from_another_is_inlined,
    test_an_op_failing_inside_a_graph_names_the_graph_and_the_line,
    test_an_unknown_graph_and_wrong_bindings_give_typed_errors,
], ids=lambda case: case.__name__.removeprefix("test_"))
def test_on_the_jax_device(jax_session, case):
    case(jax_session)


def test_a_compiled_replay_equals_eager_execution_within_rounding_on_the_jax_device(jax_session):
    values = arrays()
    a, b, c = (jax_session.asarray(v) for v in values)
    traced = fabric.function(step)
    expected = step(*values)
    eager_out, eager_total = step(a, b, c)
    for _ in range(3):
        out, total = traced(a, b, c)
        # (XLA fuses the graph's ops, contracting a multiply and an add: the last bit may
        # differ from the ops run one by one, each rounded)
        for got in (out.numpy(), eager_out.numpy()):
            np.testing.assert_allclose(got, expected[0], rtol=1e-12)
        np.testing.assert_allclose(total.numpy(), expected[1], rtol=1e-12)
        np.testing.assert_allclose(eager_total.numpy(), expected[1], rtol=1e-12)
    assert (out.shape, out.dtype, total.shape) == (eager_out.shape, eager_out.dtype, ())
