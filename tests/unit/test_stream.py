"""The client's op stream without sockets: batching, frees, origins, credit and sinks.

``OpStream`` is sans I/O: an owner that records what it is handed stands in for a session,
so every rule is checked with plain calls (and a hypothesis state machine for the orders).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fabric.arrays.stream import (MAX_BATCH_BYTES, MAX_BATCH_ELEMENTS, MAX_BATCH_ENTRIES,
                                  MAX_BATCH_GRAPH_OPS, REMEMBERED_ORIGINS, REPEAT_MOST, OpStream,
                                  batch_elements_bound, repeat_cut)
from fabric.core.errors import FabricError, ProtocolError, SessionClosed
from fabric.core.flow import COMPILES_BATCHES, SUBMIT_WINDOW
from fabric.core.protocol import Kind
from fabric.core.wire import op_entry, parse_op

F8 = np.dtype("float64")


class Owner:
    """A session's stand-in: flushes by handing the batch to ``send``, which keeps it (or
    raises while ``failing``)."""

    def __init__(self) -> None:
        self.stream = OpStream(self, session_id=0x5E55)
        self.sent: list = []
        self.failing = False

    def flush(self, timeout: float | None = None) -> None:
        if self.stream.batch:
            self.stream.send_batch(self.send)

    def send(self, message) -> None:
        if self.failing:
            raise ConnectionError("the socket is full")
        self.sent.append(message)


def add(stream: OpStream, size: int = 4, origin=("here", 0)):
    """An elementwise op's result, queued in its compact entry, as the operators queue it."""
    return stream.push_op("add", (0, 1.0), {}, size, (size,), F8, origin)


def upload(stream: OpStream, nbytes: int):
    tensor = stream.new_tensor((nbytes // 8,), F8, None)
    stream.enqueue(["put", tensor.id, [], {"buffer": len(stream.buffers)}],
                   np.zeros(nbytes, np.uint8), tensor)
    return tensor


def test_tensors_get_consecutive_ids_their_shape_and_the_owner_as_session():
    owner = Owner()
    a, b = add(owner.stream, 3), add(owner.stream, 5, origin=("there", 2))
    assert (a.id, b.id) == (1, 2)
    assert (b.shape, b.dtype, b.size, b.session) == ((5,), F8, 5, owner)
    assert owner.stream.origins == {1: ("here", 0), 2: ("there", 2)}
    assert owner.stream.batch == [(1, "add", 0, 1.0), (2, "add", 0, 1.0)]  # (compact)
    assert owner.stream.batch_elements == 2 * 3 + 2 * 5  # each op's inputs and output


def test_an_entry_travels_compact_without_params_and_parses_back_from_either_form():
    assert op_entry("add", 3, (1, 2.0), {}) == (3, "add", 1, 2.0)
    assert op_entry("sum", 4, (1,), {"axis": 0}) == ("sum", 4, (1,), {"axis": 0})
    assert parse_op([3, "add", 1, 2.0]) == ("add", 3, [1, 2.0], {})
    assert parse_op([5, "negative", 3]) == ("negative", 5, [3], {})
    assert parse_op(["sum", 4, [1], {"axis": 0}]) == ("sum", 4, [1], {"axis": 0})
    for malformed in ([3], ["add", 3, [1]], ["add", "3", [1], {}], ["add"], 2.0, None, "ab",
                      {0: 1, 1: "add"}):
        with pytest.raises(ProtocolError, match="Malformed op"):
            parse_op(malformed)


def test_a_batch_goes_at_its_entry_bound_as_one_submit_of_the_session():
    owner = Owner()
    kept = [add(owner.stream) for _ in range(MAX_BATCH_ENTRIES - 1)]
    assert not owner.sent
    kept.append(add(owner.stream))
    (message,) = owner.sent
    assert (message.kind, message.session) == (Kind.SUBMIT, 0x5E55)
    assert parse_op(message.body["ops"][-1]) == ("add", kept[-1].id, [0, 1.0], {})
    assert not owner.stream.batch and owner.stream.counts["batches_sent"] == 1


def test_a_device_that_compiles_batches_lifts_the_element_bound():
    assert batch_elements_bound({"compiles": COMPILES_BATCHES}) == math.inf
    assert batch_elements_bound({"compiles": "graphs"}) == MAX_BATCH_ELEMENTS
    assert batch_elements_bound({}) == MAX_BATCH_ELEMENTS
    owner = Owner()
    owner.stream.max_batch_elements = math.inf
    for _ in range(4):
        add(owner.stream, MAX_BATCH_ELEMENTS)
    assert owner.sent == []  # only the entries (and bytes) cut its batches now


def cheap_step(stream: OpStream, x, b):
    """Bench W5's cheap step as the operators queue it: 25 rounds of x = x*b + 0.5, 100
    entries a call with the frees of what each round lets go."""
    for _ in range(25):
        x = stream.push_op("add", (stream.push_op("multiply", (x.id, b.id), {}, 8, (4,), F8,
                                                  None).id, 0.5), {}, 4, (4,), F8, None)
    return x


def spelled(entries: list) -> list:
    """A batch's entries as the worker's batch signature sees them: each op's name and its
    inputs numbered by their first appearance (its own output and frees kept by order)."""
    numbers: dict = {}
    return [("free",) if type(entry) is int else (parse_op(entry).name, *[
        numbers.setdefault(arg, len(numbers)) - len(numbers) if type(arg) is int else arg
        for arg in parse_op(entry).args]) for entry in entries]


def test_a_full_batch_for_a_compiling_device_is_cut_where_its_loop_repeats():
    """A loop whose body (100 entries) does not divide a batch's entries sends, on a device
    that compiles the batches it sees again, the same batch again and again: each cut where
    the loop's body begins at the same step. Ops past a cut go first in the next batch; a
    read's or a sync's flush sends every op; counts and what was sent stay exact."""
    owner = Owner()
    owner.stream.for_device({"compiles": COMPILES_BATCHES})
    x, b = add(owner.stream), add(owner.stream)
    for _ in range(40):
        x = cheap_step(owner.stream, x, b)
    batches = [message.body["ops"] for message in owner.sent]
    assert len(batches) == 7 and {len(ops) for ops in batches[2:]} == {500}  # five bodies
    assert len({repr(spelled(ops)) for ops in batches[2:]}) == 1
    pending = owner.stream.batch
    assert 0 < len(pending) < MAX_BATCH_ENTRIES and x.id > owner.stream.sent_through
    first_kept = next(parse_op(entry).out for entry in pending if type(entry) is not int)
    assert owner.stream.sent_through == first_kept - 1
    owner.flush()  # (a read's flush: everything goes)
    assert not owner.stream.batch
    sent = [entry for message in owner.sent for entry in message.body["ops"]]
    made = [parse_op(entry).out for entry in sent if type(entry) is not int]
    assert made == sorted(set(made)) and made[-1] == x.id  # (each op once, in order)
    assert owner.stream.counts["ops_sent"] == len(made) == 2 + 40 * 50
    assert owner.stream.sent_through > x.id

    plain = Owner()  # (a device that does not compile batches: cut at the count)
    x, b = add(plain.stream), add(plain.stream)
    for _ in range(40):
        x = cheap_step(plain.stream, x, b)
    assert {len(message.body["ops"]) for message in plain.sent} == {MAX_BATCH_ENTRIES}


def test_repeat_cut_keeps_a_batch_whole_where_nothing_repeats():
    ids = list(range(1, MAX_BATCH_ENTRIES + 1))
    assert repeat_cut([(i, f"op{i}", i - 1) for i in ids]) == MAX_BATCH_ENTRIES
    # (a body longer than REPEAT_MOST entries is not looked for)
    body = REPEAT_MOST + 1
    assert repeat_cut([(i, f"op{i % body}", 1.0) for i in ids]) == MAX_BATCH_ENTRIES
    sevens = [(i, f"op{i % 7}", 1.0) for i in ids]  # (cut where a body begins as the first)
    cut = repeat_cut(sevens)
    assert MAX_BATCH_ENTRIES - 7 < cut < MAX_BATCH_ENTRIES and sevens[cut][1] == "op1"


def test_a_batch_goes_at_its_element_byte_and_graph_op_bounds():
    owner = Owner()
    add(owner.stream, MAX_BATCH_ELEMENTS // 2)  # reads and writes half each: the bound
    assert len(owner.sent) == 1
    upload(owner.stream, MAX_BATCH_BYTES - 8)
    assert len(owner.sent) == 1
    upload(owner.stream, 8)
    assert len(owner.sent) == 2 and len(owner.sent[1].buffers) == 2
    owner.stream.enqueue(["graph_call", 0, [], {}], graph_ops=MAX_BATCH_GRAPH_OPS - 1)
    assert len(owner.sent) == 2
    owner.stream.enqueue(["graph_call", 0, [], {}], graph_ops=1)
    assert len(owner.sent) == 3 and owner.stream.batch_graph_ops == 0


def test_a_tensor_let_go_is_freed_where_it_stands_and_is_not_counted_as_an_op():
    owner = Owner()
    a = add(owner.stream)
    first = a.id
    a = add(owner.stream)  # the first is let go after the op that made the second
    assert owner.stream.batch[-1] == first and owner.stream.freed == [first]
    owner.flush()
    assert owner.stream.counts["ops_sent"] == 2
    assert first in owner.stream.origins  # kept for a late error of its op


def test_a_batch_that_cannot_be_sent_is_kept_whole_and_goes_with_the_next():
    owner = Owner()
    kept = [add(owner.stream), upload(owner.stream, 80)]
    owner.failing = True
    with pytest.raises(ConnectionError):
        owner.flush()
    assert owner.stream.counts == {"ops_sent": 0, "batches_sent": 0, "bytes_uploaded": 0,
                                   "bytes_uploaded_by_socket": 0}
    kept.append(add(owner.stream))
    owner.failing = False
    owner.flush()
    (message,) = owner.sent
    assert [parse_op(op).out for op in message.body["ops"]] == [t.id for t in kept]
    assert len(message.buffers) == 1
    assert owner.stream.counts == {"ops_sent": 3, "batches_sent": 1, "bytes_uploaded": 80,
                                   "bytes_uploaded_by_socket": 80}


def test_credit_holds_back_a_batch_past_the_submit_window():
    owner = Owner()
    kept = []
    for _ in range(SUBMIT_WINDOW):
        assert owner.stream.credit_needed(done=0) is None
        kept.append(add(owner.stream))
        owner.flush()
    assert owner.stream.credit_needed(done=0) == 1  # the device must run one first
    assert owner.stream.credit_needed(done=1) is None


def test_the_origins_of_freed_tensors_are_kept_within_a_bound():
    owner = Owner()
    ids = []
    for _ in range(3 * REMEMBERED_ORIGINS):
        ids.append(add(owner.stream).id)  # each let go at once
        if len(owner.stream.batch) > 100:
            owner.flush()
    owner.flush()
    kept = [i for i in ids if i in owner.stream.origins]
    assert REMEMBERED_ORIGINS <= len(kept) < 2 * REMEMBERED_ORIGINS
    assert kept == ids[-len(kept):]


def test_a_closed_stream_refuses_ops_and_forgets_the_tensor_it_made():
    owner = Owner()
    add(owner.stream)
    owner.stream.close()
    assert not owner.stream.batch  # closing the session frees it all on the device
    with pytest.raises(SessionClosed, match="0x5e55 is closed"):
        add(owner.stream)
    assert list(owner.stream.origins) == [1]
    assert not owner.stream.batch  # the refused tensor is not freed: it was never made


def test_another_thread_is_refused_and_queues_nothing():
    owner = Owner()
    errors = []

    def from_another_thread() -> None:
        try:
            add(owner.stream)
        except FabricError as exc:
            errors.append(exc)
    thread = threading.Thread(target=from_another_thread)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(errors) == 1 and "call fabric.connect() in each thread" in str(errors[0])
    assert not owner.stream.batch and not owner.stream.origins


def test_sinks_see_each_op_first_and_a_refusal_queues_nothing():
    owner = Owner()
    seen = []

    class Refusing:
        def record(self, op, buffer, result) -> None:
            if op[0] == "seed":
                raise ValueError("no seeds here")
            seen.append((op[0], buffer is not None, result))
    owner.stream.sinks.append(Refusing())
    t = add(owner.stream)
    u = upload(owner.stream, 16)
    with pytest.raises(ValueError, match="no seeds"):
        owner.stream.enqueue(["seed", 0, [], {"seed": 1}])
    assert seen == [("add", False, t), ("put", True, u)]
    assert [op[0] for op in owner.stream.batch] == ["add", "put"]


class StreamMachine(RuleBasedStateMachine):
    """Any order of ops, uploads, frees, graph calls and sends (some failing): every entry
    reaches the device once, in order, within the batch bounds, and the counts agree."""

    def __init__(self) -> None:
        super().__init__()
        self.owner = Owner()
        self.live: list = []
        self.expected: list = []  # every entry, in the order it was queued

    @rule(size=st.integers(1, MAX_BATCH_ELEMENTS))
    def op(self, size: int) -> None:
        sent = len(self.owner.sent)
        tensor = self.owner.stream.push_op("negative", (0,), {}, size, (size,), F8, None)
        self.expected.append(tensor.id)
        self.live.append(tensor)
        if 2 * size >= self.owner.stream.max_batch_elements:  # a heavy op goes at once
            assert len(self.owner.sent) == sent + 1

    @rule(nbytes=st.sampled_from([8, 4096, MAX_BATCH_BYTES // 3, MAX_BATCH_BYTES]))
    def put(self, nbytes: int) -> None:
        tensor = upload(self.owner.stream, nbytes)
        self.expected.append(tensor.id)
        self.live.append(tensor)

    @rule(data=st.data())
    def let_go(self, data: st.DataObject) -> None:
        if self.live:
            index = data.draw(st.integers(0, len(self.live) - 1))
            tensor_id = self.live[index].id
            del self.live[index]  # (its last reference: freed now)
            self.expected.append(tensor_id)

    @rule(ops=st.integers(1, MAX_BATCH_GRAPH_OPS))
    def graph_call(self, ops: int) -> None:
        self.owner.stream.enqueue(["graph_call", -ops, [], {}], graph_ops=ops)
        self.expected.append(-ops)

    @rule(failing=st.booleans())
    def flush(self, failing: bool) -> None:
        self.owner.failing = failing
        try:
            self.owner.flush()
        except ConnectionError:
            assert failing
        self.owner.failing = False

    @invariant()
    def every_entry_once_in_order_within_bounds(self) -> None:
        stream = self.owner.stream
        entries = [e for m in self.owner.sent for e in m.body["ops"]] + stream.batch
        assert [e if type(e) is int else parse_op(e).out for e in entries] == self.expected
        assert sum(type(e) is not int for e in stream.batch) < MAX_BATCH_ENTRIES  # (frees
        # go with the next op or read)
        assert stream.batch_elements < stream.max_batch_elements
        assert stream.batch_bytes < MAX_BATCH_BYTES
        assert stream.batch_graph_ops < MAX_BATCH_GRAPH_OPS
        for message in self.owner.sent:
            numbers = [e[3]["buffer"] for e in message.body["ops"] if type(e) is not int
                       and e[0] == "put"]
            assert numbers == list(range(len(message.buffers)))
        counts = stream.counts
        assert counts["batches_sent"] == len(self.owner.sent)
        assert counts["ops_sent"] == sum(type(e) is not int for m in self.owner.sent
                                         for e in m.body["ops"])
        assert counts["bytes_uploaded"] == sum(b.nbytes for m in self.owner.sent
                                               for b in m.buffers)
        made = {parse_op(e).out for m in self.owner.sent for e in m.body["ops"]
                if type(e) is not int}  # (a read of a tensor up to sent_through goes alone)
        assert all(t in made for t in self.expected if 0 < t <= stream.sent_through)


class CompilingStreamMachine(StreamMachine):
    """The same on a device that compiles the batches it sees again, whose full batches are
    cut where their ops repeat, with loops among the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.owner.stream.for_device({"compiles": COMPILES_BATCHES})

    @rule(body=st.integers(1, 5), rounds=st.integers(1, 200))
    def loop(self, body: int, rounds: int) -> None:
        x = self.owner.stream.push_op("negative", (0,), {}, 1, (1,), F8, None)
        self.expected.append(x.id)
        for step in range(body * rounds):
            previous = x
            x = self.owner.stream.push_op("add" if step % body else "negative", (x.id,), {},
                                          1, (1,), F8, None)
            self.expected += [x.id, previous.id]
            del previous  # (let go, after the op that read it)
        self.live.append(x)


TestStreamMachine = StreamMachine.TestCase
TestStreamMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestCompilingStreamMachine = CompilingStreamMachine.TestCase
TestCompilingStreamMachine.settings = TestStreamMachine.settings
