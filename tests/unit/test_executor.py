"""Sans-I/O tests of a device's executor: the worker's rules without sockets or processes."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest
from fuzzstorm import _junk as storm_junk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric.core import wire
from fabric.core.errors import FabricError, error_from_wire
from fabric.core.flow import CREDIT_EVERY
from fabric.core.protocol import Kind, Message, decode, encode
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers import executor as executor_module
from fabric.workers.executor import RUN_LOCALS, Executor

SESSION = 0x5E55


def opened(memory_limit: int | None = None, device: Any = None) -> Executor:
    executor = Executor(device or NumpyDevice(0), memory_limit)
    assert executor.handle(Message(Kind.OPEN, SESSION, 1, {"device": 0}))[0].kind == Kind.OPENED
    return executor


def submit(executor: Executor, *ops: list | int, buffers: tuple = ()) -> None:
    body = {"ops": list(ops)}  # (an int among the ops: a tensor freed there)
    # Through the wire's codec, as a worker gets it (the client's tuples arrive as lists).
    message = decode(encode(Message(Kind.SUBMIT, SESSION, 0, body, buffers)))
    assert [r for r in executor.handle(message) if r.kind != Kind.CREDIT] == []


def request(executor: Executor, **body) -> Message:
    [reply] = executor.handle(Message(Kind.REQUEST, SESSION, 9, body))
    assert (reply.kind, reply.session, reply.request) == (Kind.REPLY, SESSION, 9)
    return reply


def read(executor: Executor, tensor_id: int) -> np.ndarray:
    reply = request(executor, op="read", id=tensor_id)
    assert "error" not in reply.body, reply.body
    return np.frombuffer(reply.buffers[0], reply.body["dtype"]).reshape(reply.body["shape"])


def test_ops_run_in_submission_order_and_reads_return_the_result():
    executor = opened()
    data = np.arange(6.0)
    submit(executor,
           ["put", 1, [], {"dtype": "<f8", "shape": [2, 3], "buffer": 0}],
           ["multiply", 2, [1, [2.0]], {}],
           ["sum", 3, [2], {"axis": 1, "keepdims": False}],
           buffers=(data.tobytes(),))
    np.testing.assert_array_equal(read(executor, 3), [6.0, 24.0])


def test_scalars_travel_bare_when_msgpack_tells_them_from_a_tensor_id():
    executor = opened()
    submit(executor,
           ["put", 1, [], {"dtype": "<i8", "shape": [3], "buffer": 0}],
           ["multiply", 2, [1, 0.5], {}],  # a float: float64, as numpy's weak scalar makes it
           ["add", 3, [1, True], {}],  # a bool: stays int64
           ["add", 4, [1, [2]], {}],  # an int is wrapped: a bare one is a tensor id
           buffers=(np.arange(3).tobytes(),))
    np.testing.assert_array_equal(read(executor, 2), [0.0, 0.5, 1.0])
    assert read(executor, 3).dtype == np.int64
    np.testing.assert_array_equal(read(executor, 3), [1, 2, 3])
    np.testing.assert_array_equal(read(executor, 4), [2, 3, 4])


def test_a_read_that_states_what_it_expects_gets_the_bytes_alone_or_a_clear_error():
    executor = opened()
    submit(executor, ["put", 1, [], {"dtype": "<f8", "shape": [2, 3], "buffer": 0}],
           buffers=(np.arange(6.0).tobytes(),))
    reply = request(executor, op="read", id=1, dtype="<f8", shape=[2, 3])
    assert reply.body == {}  # the client inferred it right: nothing to tell it
    np.testing.assert_array_equal(np.frombuffer(reply.buffers[0], "<f8"), np.arange(6.0))
    for dtype, shape in (("<f4", [2, 3]), ("<f8", [6]), ("<f8", "junk")):
        reply = request(executor, op="read", id=1, dtype=dtype, shape=shape)
        error = error_from_wire(reply.body["error"])
        assert error.code == "remote_error" and not reply.buffers
        assert "<f8 with shape [2, 3] on the device" in str(error), error
        assert "Report it as a fabric bug" in str(error)
    np.testing.assert_array_equal(read(executor, 1), np.arange(6.0).reshape(2, 3))  # still there


def test_a_failed_op_poisons_everything_downstream_and_sync_reports_it_once():
    executor = opened()
    submit(executor,
           ["arange", 1, [], {"start": 1, "stop": 4, "step": 1, "dtype": "<i8"}],
           ["power", 2, [1, [-1]], {}],
           ["add", 3, [2, [1]], {}],
           ["multiply", 4, [1, [2]], {}])
    poisoned = error_from_wire(request(executor, op="read", id=3).body["error"])
    assert poisoned.details["op"] == "power" and poisoned.details["tensor"] == 2
    np.testing.assert_array_equal(read(executor, 4), [2, 4, 6])
    # The read reported the error, so the next sync does not raise it again.
    assert request(executor, op="sync").body == {"ok": True}


def test_ops_that_would_make_a_tensor_no_device_holds_fail_and_the_session_goes_on():
    # A client sends numeric and bool dtypes only; a raw one may send any dtype's name.
    executor = opened()
    submit(executor, ["zeros", 1, [], {"shape": [2], "dtype": "<U1"}],
           ["put", 2, [], {"dtype": "<U2", "shape": [1], "buffer": 0}],
           ["put", 3, [], {"dtype": "|O", "shape": [1], "buffer": 0}],
           ["ones", 4, [], {"shape": [2], "dtype": "<f8"}],
           ["astype", 5, [4], {"dtype": "<M8[s]"}], buffers=(b"\0" * 8,))
    for tensor_id in (1, 2, 3, 5):
        error = error_from_wire(request(executor, op="read", id=tensor_id).body["error"])
        assert "cannot live on a device: use a numeric or bool dtype" in error.message
    np.testing.assert_array_equal(read(executor, 4), [1, 1])


def test_sync_reports_the_first_unreported_error():
    executor = opened()
    submit(executor, ["ones", 1, [], {"shape": [2], "dtype": "<f8"}],
           ["reshape", 2, [1], {"shape": [3]}])
    error = error_from_wire(request(executor, op="sync").body["error"])
    assert error.code == "remote_error" and "reshape" in error.message
    assert request(executor, op="sync").body == {"ok": True}


def test_frees_release_memory_and_the_limit_gives_quota_exceeded():
    executor = opened(memory_limit=1000)
    submit(executor, ["zeros", 1, [], {"shape": [100], "dtype": "<f8"}],  # 800 bytes
           ["zeros", 2, [], {"shape": [100], "dtype": "<f8"}])  # past the limit
    error = error_from_wire(request(executor, op="read", id=2).body["error"])
    assert error.code == "quota_exceeded"
    submit(executor, 1)
    assert request(executor, op="stats").body["resident_bytes"] == 0
    submit(executor, ["zeros", 3, [], {"shape": [100], "dtype": "<f8"}])
    assert read(executor, 3).shape == (100,)


@pytest.mark.parametrize("memory_limit", [None, 2500])
def test_ops_without_params_store_their_results_by_the_same_rules(memory_limit):
    # (Such ops store their results inline, not through Executor._store, when they can.)
    executor = opened(memory_limit=memory_limit)
    submit(executor, ["ones", 1, [], {"shape": [100], "dtype": "<f8"}],
           ["add", 2, [1, 1.0], {}],
           ["add", 2, [1, 2.0], {}],  # an id used again: the new value replaces the old
           ["reshape", 3, [1], {"shape": [7]}],  # fails: 3 is poisoned ...
           ["multiply", 3, [1, 4.0], {}])  # ... and then made anew
    assert request(executor, op="sync").body["error"]["details"]["op"] == "reshape"
    assert read(executor, 2)[0] == 3.0 and read(executor, 3)[0] == 4.0
    assert request(executor, op="stats").body["resident_bytes"] == 3 * 800
    submit(executor, ["add", 4, [3, 1.0], {}])  # 3,200 bytes: past a 2,500-byte limit
    reply = request(executor, op="read", id=4).body
    assert reply["error"]["code"] == "quota_exceeded" if memory_limit else "error" not in reply


def test_malformed_ops_and_unknown_requests_are_errors_not_crashes():
    executor = opened()
    submit(executor, ["add"], ["no_such_op", 1, [], {}], ["add", 2, [99, 98], {}])
    assert request(executor, op="sync").body["error"]["code"] == "protocol_error"
    assert request(executor, op="teleport").body["error"]["code"] == "protocol_error"
    assert request(executor, op="read", id=12345).body["error"]["code"] == "protocol_error"


def test_an_op_without_params_runs_alike_in_either_wire_form():
    executor = opened()
    data = np.arange(6.0)
    submit(executor, ["put", 1, [], {"dtype": "<f8", "shape": [6], "buffer": 0}],
           (2, "add", 1, [2]), ["add", 3, [1, [2]], {}],  # compact, then classic
           (4, "negative", 2), ["negative", 5, [3], {}], (6, "maximum", 4, 5),
           buffers=(data.tobytes(),))
    for compact, classic in [(2, 3), (4, 5)]:
        np.testing.assert_array_equal(read(executor, compact), read(executor, classic))
    np.testing.assert_array_equal(read(executor, 6), -(data + 2))
    submit(executor, (7, "absolute", 6), 6)  # (a free after a compact op, as after any)
    assert set(executor.sessions[SESSION].tensors) == {1, 2, 3, 4, 5, 7}


def test_malformed_compact_entries_are_reported_and_the_session_goes_on():
    executor = opened()
    submit(executor, ["ones", 1, [], {"shape": [2], "dtype": "<f8"}])
    submit(executor, [4], [2, 7, 1], [3, "no_such_op", 1], (5, "add", 1, 1.5))
    error = request(executor, op="sync").body["error"]
    assert (error["code"], error["message"]) == ("protocol_error", "Malformed op [4].")
    submit(executor, {0: 8, 1: "add"})  # (indexes as a compact entry would: still malformed)
    assert request(executor, op="sync").body["error"]["code"] == "protocol_error"
    for failed in (2, 3):  # (an op of no name, or of an unknown one: its output's error)
        assert "error" in request(executor, op="read", id=failed).body
    np.testing.assert_array_equal(read(executor, 5), [2.5, 2.5])


def test_messages_for_unknown_sessions_are_answered_and_close_is_idempotent():
    executor = Executor(NumpyDevice(0))
    [reply] = executor.handle(Message(Kind.REQUEST, 77, 3, {"op": "sync"}))
    assert reply.body["error"]["code"] == "session_lost"
    assert executor.handle(Message(Kind.SUBMIT, 77, 0, {"ops": []})) == []
    assert executor.handle(Message(Kind.CLOSE, 77, 4))[0].kind == Kind.CLOSED


def test_closing_frees_the_session_and_reopening_twice_is_refused():
    executor = opened()
    submit(executor, ["ones", 1, [], {"shape": [10], "dtype": "<f8"}])
    [again] = executor.handle(Message(Kind.OPEN, SESSION, 2, {"device": 0}))
    assert again.kind == Kind.REJECT
    assert executor.handle(Message(Kind.CLOSE, SESSION, 5))[0].kind == Kind.CLOSED
    assert executor.sessions == {}


def test_every_so_many_submits_the_device_tells_the_client_how_many_it_has_run():
    executor = opened()
    credits = []
    for index in range(2 * CREDIT_EVERY + 1):
        ops = [["zeros", index + 1, [], {"shape": [2], "dtype": "<f8"}]] if index % 2 else []
        body = {"ops": ops} if index != 5 else {"ops": "not a list"}
        replies = executor.handle(decode(encode(Message(Kind.SUBMIT, SESSION, 0, body))))
        credits += [r for r in replies if r.kind == Kind.CREDIT]
    # (a malformed SUBMIT counts too: the client counted it when it sent it)
    assert [(c.session, c.request, c.body) for c in credits] == [
        (SESSION, 0, {"done": CREDIT_EVERY}), (SESSION, 0, {"done": 2 * CREDIT_EVERY})]


def test_entries_that_are_neither_ops_nor_ids_are_reported_and_the_ids_among_them_freed():
    executor = opened()
    submit(executor, ["ones", 1, [], {"shape": [3], "dtype": "<f8"}],
           ["ones", 2, [], {"shape": [3], "dtype": "<f8"}])
    submit(executor, [1], 2, {"a": 1}, 2.0, True)  # (a map: unhashable, not even a key)
    assert request(executor, op="sync").body["error"]["code"] == "protocol_error"
    assert set(executor.sessions[SESSION].tensors) == {1}
    assert executor.sessions[SESSION].resident == 24
    assert request(executor, op="stats").body["ops"] == 2 + 4  # (2 was freed, not run)


def test_a_tensor_is_freed_where_it_stands_in_the_stream_and_its_id_may_be_used_again():
    executor = opened()
    ones = {"shape": [3], "dtype": "<f8"}
    submit(executor, ["ones", 1, [], ones], ["add", 2, [1, 1.0], {}], 1,
           ["add", 3, [1, 1.0], {}],  # after the free: 1 is unknown here
           ["ones", 1, [], ones], ["add", 4, [1, 3.0], {}])  # 1 made anew
    error = error_from_wire(request(executor, op="sync").body["error"])
    assert error.code == "protocol_error" and "add read tensor 1, which" in error.message
    assert read(executor, 2)[0] == 2.0 and read(executor, 4)[0] == 4.0
    assert request(executor, op="read", id=3).body["error"]["code"] == "protocol_error"
    assert request(executor, op="stats").body["resident_bytes"] == 3 * 24


# The storm's scalars, nested in lists and maps (the storm's own never nest a map: unhashable
# ids are how a device's thread once ended).
_junk = st.recursive(storm_junk, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text(max_size=4), inner, max_size=2), max_leaves=6)
_ops = st.lists(_junk | st.tuples(
    st.sampled_from(["add", "ones", "send", "seed", "put", "getitem", "sum", "graph_call"]),
    st.integers(0, 3), st.lists(_junk | st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from(["shape", "dtype", "axis", "index", "buffer", "session",
                                     "id", "seed", "graph"]), _junk, max_size=3)).map(list),
    max_size=3)
_bodies = st.fixed_dictionaries({}, optional={
    "ops": _ops | _junk,
    "op": st.sampled_from(["read", "sync", "stats", "await", "x"]) | _junk,
    "id": _junk | st.integers(0, 3), "dtype": _junk, "shape": _junk})


@settings(max_examples=400, derandomize=True, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.sampled_from([Kind.SUBMIT, Kind.REQUEST, Kind.TRANSFER]),
                          _bodies), min_size=1, max_size=4))
def test_no_body_makes_the_executor_raise_anything_but_a_typed_error(messages):
    # Anything else would end the device's thread (the worker reports it, but as a bug).
    executor = opened()
    submit(executor, ["ones", 1, [], {"shape": [3], "dtype": "<f8"}])
    for kind, body in messages:
        try:
            executor.handle(decode(encode(Message(kind, SESSION, 3, body))))
        except FabricError:
            pass
    submit(executor, ["ones", 99, [], {"shape": [3], "dtype": "<f8"}])  # still served
    assert request(executor, op="read", id=99, dtype="<f8", shape=[3]).buffers


def _setitem(out: int, target: int, value: Any, in_place: bool = True) -> list:
    # target[1:3] = value, marked in place (the client frees target next) or not
    params = {"index": [[1, 3, None]], **({"in_place": True} if in_place else {})}
    return ["setitem", out, [target, value], params]


def test_an_update_marked_in_place_writes_into_a_target_nothing_else_sees():
    # Under a limit that holds one copy of the array and not two, only a write into the
    # target itself fits; the values are numpy's either way.
    executor = opened(memory_limit=1200)
    submit(executor, ["zeros", 1, [], {"shape": [100], "dtype": "<f8"}],
           _setitem(2, 1, 5.0), 1, ["ufunc_at", 3, [2, [7]], {
               "ufunc": "add", "index": [[None, None, None]], "in_place": True}], 2)
    assert "error" not in request(executor, op="sync").body
    expected = np.zeros(100)
    expected[1:3] = 5.0
    np.testing.assert_array_equal(read(executor, 3), expected + 7)  # (add.at of [:])
    assert request(executor, op="stats").body["resident_bytes"] == 800


@pytest.mark.parametrize("holder", [
    ["getitem", 9, [1], {"index": [[None, None, 2]]}],  # a view of the target's memory
    ["reshape", 9, [1], {"shape": [10, 10]}],  # another view
    ["broadcast_to", 9, [1], {"shape": [2, 100]}],  # a read-only view
])
def test_an_update_marked_in_place_copies_where_another_tensor_sees_the_target(holder):
    executor = opened()
    submit(executor, ["arange", 1, [], {"start": 0, "stop": 100, "step": 1, "dtype": "<f8"}],
           holder, _setitem(2, 1, -1.0), 1)
    assert "error" not in request(executor, op="sync").body
    before = read(executor, 9).copy()
    seen = np.arange(100.0)
    np.testing.assert_array_equal(before, np.asarray(OPS_OF_HOLDER[holder[0]](seen)))
    assert read(executor, 2)[1] == -1.0  # the update's result has the new values


OPS_OF_HOLDER = {"getitem": lambda a: a[::2], "reshape": lambda a: a.reshape(10, 10),
                 "broadcast_to": lambda a: np.broadcast_to(a, (2, 100))}


BASIC_INDEXES = [
    ([[1, -1, None], [None, None, 2]], lambda a: a[1:-1, ::2], True),
    ([1, "...", None], lambda a: a[1, ..., None], True),
    ([2, 3], lambda a: a[2, 3], False),  # a scalar in numpy: a 0-d array of its own
]


@pytest.mark.parametrize("packed", [False, True], ids=["items", "packed"])
@pytest.mark.parametrize("index, expected, view", BASIC_INDEXES)
def test_a_basic_index_is_a_view_of_the_base_with_numpys_values(index, expected, view, packed):
    executor = opened()
    index = msgpack.packb(index) if packed else index  # (as fabric.core.wire.pack_index sends it)
    submit(executor, ["arange", 1, [], {"start": 0, "stop": 20, "step": 1, "dtype": "<f8"}],
           ["reshape", 2, [1], {"shape": [4, 5]}], ["getitem", 3, [2], {"index": index}])
    base, result = (executor.sessions[SESSION].tensors[t] for t in (2, 3))
    assert np.shares_memory(base, result) is view and type(result) is np.ndarray
    np.testing.assert_array_equal(read(executor, 3), expected(np.arange(20.0).reshape(4, 5)))


@pytest.mark.parametrize("index", [
    None, "1:2", [[1, 2]], [{"array": 0}],
    b"\xc1", msgpack.packb([[1, 2]]), msgpack.packb("1:2"), msgpack.packb([1])[:-1],
    msgpack.packb(msgpack.packb([1])),  # (packed twice: an index is packed once)
])
def test_a_malformed_basic_index_poisons_its_result_and_the_session_goes_on(index):
    executor = opened()
    submit(executor, ["ones", 1, [], {"shape": [4], "dtype": "<f8"}],
           ["getitem", 2, [1], {"index": index}], ["negative", 3, [1], {}])
    error = error_from_wire(request(executor, op="read", id=2).body["error"])
    assert isinstance(error, FabricError) and error.details["op"] == "getitem"
    np.testing.assert_array_equal(read(executor, 3), -np.ones(4))


def test_a_tensor_awaited_that_came_without_its_ticket_lets_the_ticket_go():
    # A direct link that broke: the client sent the upload again as a put of the tensor the
    # device expected; the ticket, never used, must not hold one of MAX_EXPECTED places.
    executor = opened()
    assert request(executor, op="expect", id=5, ticket=77).body == {"ok": True}
    submit(executor, ["ones", 5, [], {"shape": [3], "dtype": "<f8"}])
    assert request(executor, op="await", id=5).body == {"ok": True}
    assert executor.sessions[SESSION].expected == {}
    np.testing.assert_array_equal(read(executor, 5), np.ones(3))


def test_an_update_not_marked_in_place_leaves_its_target_as_it_was():
    executor = opened()
    submit(executor, ["ones", 1, [], {"shape": [4], "dtype": "<f8"}],
           _setitem(2, 1, 0.0, in_place=False))
    np.testing.assert_array_equal(read(executor, 1), np.ones(4))
    np.testing.assert_array_equal(read(executor, 2), [1.0, 0.0, 0.0, 1.0])


def test_an_upload_is_copied_once_then_updated_in_place():
    # An upload is a view of the frame that brought it: its first update copies it (room for
    # two copies, just), the next one writes in place (no room left for a second copy).
    executor = opened(memory_limit=1600)
    submit(executor, ["put", 1, [], {"dtype": "<f8", "shape": [100], "buffer": 0}],
           _setitem(2, 1, 3.0), 1, ["zeros", 5, [], {"shape": [1], "dtype": "<f8"}],
           _setitem(3, 2, 4.0), 2, buffers=(np.zeros(100).tobytes(),))
    assert read(executor, 3)[1] == 4.0 and read(executor, 3)[0] == 0.0


def test_a_broadcast_of_differently_shaped_inputs_is_admitted_by_its_result():
    # Inputs of one shape bound an elementwise result by their size; of two shapes, by the
    # product of theirs (a column and a row make a square).
    executor = opened(memory_limit=5000)
    submit(executor, ["ones", 1, [], {"shape": [50, 1], "dtype": "<f8"}],
           ["ones", 2, [], {"shape": [1, 50], "dtype": "<f8"}],
           ["add", 3, [1, 1], {}], ["add", 4, [1, 2], {}])
    assert read(executor, 3).shape == (50, 1)
    error = error_from_wire(request(executor, op="read", id=4).body["error"])
    assert error.code == "quota_exceeded"


def test_a_request_that_carries_a_batch_runs_it_first_and_counts_it_as_a_submit():
    executor = opened()
    for i in range(CREDIT_EVERY):
        body = {"op": "read", "id": i + 1, "ops": [["full", i + 1, [], {
            "shape": [2], "dtype": "<f8", "fill_value": float(i)}]]}
        replies = executor.handle(decode(encode(Message(Kind.REQUEST, SESSION, 7, body))))
        reply = replies[-1]
        assert reply.kind == Kind.REPLY and "error" not in reply.body
        np.testing.assert_array_equal(np.frombuffer(reply.buffers[0]), [float(i)] * 2)
    assert replies[0].kind == Kind.CREDIT and replies[0].body == {"done": CREDIT_EVERY}
    bad = executor.handle(Message(Kind.REQUEST, SESSION, 8, {"op": "sync", "ops": 5}))
    assert error_from_wire(bad[0].body["error"]).code == "protocol_error"


def test_a_worker_keeps_a_bounded_number_of_packed_indexes_decoded():
    # Any peer may send indexes: those the worker keeps decoded are bounded in count and size.
    for start in range(wire.PACKED_INDEXES_KEPT + 10):
        assert wire.decode_index(msgpack.packb([[start, None, None]])) == (slice(start, None),)
    assert len(wire._packed_indexes) <= wire.PACKED_INDEXES_KEPT
    long_index = msgpack.packb([0] * wire.PACKED_INDEX_BYTES)
    assert wire.decode_index(long_index) == (0,) * wire.PACKED_INDEX_BYTES
    assert long_index not in wire._packed_indexes


# -- the warning lookup's contract with _run -------------------------------------------------

def test_the_warning_lookup_reads_only_locals_that_executor_run_has():
    # _running_op reads these from _run's frame by name, so that _run pays nothing per op to
    # say which op runs: renaming one of them in _run must rename it in RUN_LOCALS too.
    assert set(RUN_LOCALS) <= set(Executor._run.__code__.co_varnames)
    assert executor_module._RUN_CODE is Executor._run.__code__


def test_a_numpy_warning_inside_an_op_names_that_op_and_only_its_session():
    # Through each path of _run: the compact form (a plain call), the full form with params
    # (the device's run), a graph's op (a generated plan, named by the graph's op), an op
    # after a free; each after other ops of its batch.
    executor = opened()
    other = 0x07E4
    executor.handle(Message(Kind.OPEN, other, 1, {"device": 0}))
    values = np.array([1.0, 0.0, -1.0])
    graph = {"graph": 7, "name": "g", "inputs": [[[3], "<f8"]], "outputs": [3],
             "ops": [["add", 2, [1, 1.0], {}], ["log", 3, [1], {}]]}
    with executor.floating_point_errors():
        submit(executor,
               ["put", 1, [], {"dtype": "<f8", "shape": [3], "buffer": 0}],
               [2, "add", 1, 1.0],  # warns nothing
               [3, "log", 1],  # the compact form: divide by zero, invalid value
               [4, "add", 3, 1.0],
               ["sum", 5, [1], {"axis": 0, "keepdims": False}],  # 0.0
               ["divide", 6, [5, 0.0], {"dtype": "<f8"}],  # params: the device's run; 0 / 0
               ["graph_register", 0, [], graph],
               ["graph_call", 8, [1], {"graph": 7, "outputs": 1}],
               4,  # a free, then an op
               [9, "sqrt", 1],
               buffers=(values.tobytes(),))
        executor.handle(decode(encode(Message(Kind.SUBMIT, other, 0, {"ops": [
            ["put", 1, [], {"dtype": "<f8", "shape": [3], "buffer": 0}], [2, "add", 1, 1.0]]},
            (values.tobytes(),)))))
        assert executor.handle(Message(Kind.REQUEST, other, 9, {"op": "sync"}))[0].body == {
            "ok": True}  # no warning of the other session's
        body = request(executor, op="sync").body
    assert wire.decode_warnings(body) == ([
        ("divide by zero encountered in log", 3, None, None),
        ("invalid value encountered in log", 3, None, None),
        ("invalid value encountered in divide", 6, None, None),
        ("divide by zero encountered in log", 8, 7, 1),  # the graph's op 1, its call's tensor
        ("invalid value encountered in log", 8, 7, 1),
        ("invalid value encountered in sqrt", 9, None, None)], 0)
    assert np.isnan(read(executor, 6)) and np.isnan(read(executor, 8)[2])  # (ran, unpoisoned)
