"""The op entry's two forms, spelled inline where speed asks it, are ``op_entry``'s everywhere.

``fabric.core.wire.op_entry`` defines a SUBMIT's entry; its docstring lists every place that
spells one inline (or reads one by position) instead of calling it. This module drives each of
those places, without sockets, and checks that what it queues is, byte for byte on the wire,
what ``op_entry`` makes of the same op; that ``parse_op`` reads it back to that op; and that a
worker's executor (its own inline reading) runs the batch they make to numpy's values. A change
to either form that misses one of those places fails here.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

import msgpack
import numpy as np

import fabric
from fabric.arrays.creation import ArrayNamespace
from fabric.arrays.stream import MAX_BATCH_ENTRIES, repeat_cut
from fabric.core.device import Device
from fabric.core.protocol import Kind, Message, decode, encode
from fabric.core.wire import GRAPH_CACHE_SIZE, encode_scalar, op_entry, parse_op
from fabric.graphs.capture import Trace
from fabric.transport import bulk, moves
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor

SESSION = 0x0E17


class Recording(ArrayNamespace):
    """A session's stand-in: its ops stay in its stream's batch (``flush`` sends nothing);
    its requests (a move's ``expect`` and ``await``) are kept and answered ok."""

    _ids = itertools.count(SESSION)

    def __init__(self) -> None:
        super().__init__(Device(index=0, worker="w", backend="numpy", settings={}))
        self.id = next(self._ids)
        self.connection = SimpleNamespace(shared_memory=None, segments=None)
        self.requests: list[dict[str, Any]] = []

    def flush(self, timeout: float | None = None) -> None:
        pass

    def _send_request(self, body: dict[str, Any]) -> int:
        self.requests.append(body)
        return len(self.requests)

    def _reply(self, request: int) -> Any:
        return SimpleNamespace(body={"ok": True})

    def read(self, tensor, copy=True):
        raise NotImplementedError

    resolve_shape = receive_from = sync = stats = compile = foreign_tensor = read


def on_the_wire(entry: Any) -> bytes:
    """What a SUBMIT carries of ``entry`` (tuples and lists alike are msgpack arrays)."""
    return msgpack.packb(entry, use_bin_type=True)


def assert_is_op_entrys(made: Any, name: str, out: int, args: tuple, params: dict) -> None:
    """``made`` travels as ``op_entry`` makes the op, and ``parse_op`` reads the op back."""
    assert on_the_wire(made) == on_the_wire(op_entry(name, out, args, params)), (name, made)
    received = msgpack.unpackb(on_the_wire(made))  # (as the worker gets it: lists)
    op = msgpack.unpackb(on_the_wire((name, out, args, params)))
    assert list(parse_op(received)) == op, (name, made)


def scaled(x):
    return x * 2.0 + 1.0


def test_every_inline_op_entry_is_op_entrys_and_reads_back_to_its_op():
    session = Recording()
    batch = session.stream.batch
    values = np.array([1.0, 4.0, 9.0])
    a = session.asarray(values)  # fabric.arrays.creation: put
    assert_is_op_entrys(batch[-1], "put", a.id, (), {"dtype": "<f8", "shape": [3], "buffer": 0})
    b = a + 1.0  # fabric.arrays.operators, the short way: a float,
    assert_is_op_entrys(batch[-1], "add", b.id, (a.id, 1.0), {})
    c = a * b  # a tensor of the same shape,
    assert_is_op_entrys(batch[-1], "multiply", c.id, (a.id, b.id), {})
    d = 2 - a  # an int, reflected,
    assert_is_op_entrys(batch[-1], "subtract", d.id, (encode_scalar(2), a.id), {})
    e = -c  # one operand
    assert_is_op_entrys(batch[-1], "negative", e.id, (c.id,), {})
    f = np.sum(e, axis=0)  # (through session.emit and op_entry itself: the reference)
    assert_is_op_entrys(batch[-1], "sum", f.id, (e.id,), {"axis": 0, "keepdims": False})
    session.random.seed(3)  # fabric.arrays.random
    assert_is_op_entrys(batch[-1], "seed", 0, (), {"seed": 3})
    Trace([{"op": "seed", "out": 0, "args": [], "params": {"seed": 4}}]).replay(session)
    assert_is_op_entrys(batch[-1], "seed", 0, (), {"seed": 4})  # fabric.graphs.capture
    function = fabric.function(scaled)
    g = function(a)  # fabric.graphs.function: register, then call
    register, called = batch[-2:]
    traced = register[3]
    assert_is_op_entrys(register, "graph_register", 0, (), traced)
    assert_is_op_entrys(called, "graph_call", g.id, (a.id,),
                        {"graph": traced["graph"], "outputs": 1})
    # The tracer keeps its ops as the stream showed them, parse_op's full form, which is
    # how the worker's graph registration reads them (by position).
    assert [list(op) for op in traced["ops"]] == [
        ["multiply", 2, [1, 2.0], {}], ["add", 3, [2, 1.0], {}]]

    # A worker's executor runs the batch, reading each entry inline, to numpy's values.
    executor = Executor(NumpyDevice(0))
    executor.handle(Message(Kind.OPEN, session.id, 1, {"device": 0}))
    executor.handle(decode(encode(Message(Kind.SUBMIT, session.id, 0, {"ops": batch},
                                          tuple(session.stream.buffers)))))

    def read(tensor) -> np.ndarray:
        [reply] = executor.handle(Message(Kind.REQUEST, session.id, 9,
                                          {"op": "read", "id": tensor.id}))
        assert "error" not in reply.body, reply.body
        return np.frombuffer(reply.buffers[0], reply.body["dtype"]).reshape(
            reply.body["shape"])
    for tensor, expected in [(a, values), (b, values + 1.0), (c, values * (values + 1.0)),
                             (d, 2 - values), (e, -(values * (values + 1.0))),
                             (f, np.sum(-(values * (values + 1.0)), axis=0)),
                             (g, scaled(values))]:
        np.testing.assert_array_equal(read(tensor), expected)
    [synced] = executor.handle(Message(Kind.REQUEST, session.id, 9, {"op": "sync"}))
    assert synced.body == {"ok": True}  # (the seeds and the graph's registration ran too)

    # The others, whose ops need more than one executor (a move's send) or another
    # device's memory (a put from shared memory), or evict a graph.
    target = Recording()
    [moved] = moves.move_all([(a, target)])  # fabric.transport.moves: send
    expect = target.requests[0]
    assert expect == {"op": "expect", "id": moved.id, "ticket": expect["ticket"]}
    assert_is_op_entrys(batch[-1], "send", 0, (a.id,),
                        {"session": target.id, "ticket": expect["ticket"]})
    ref = ["fabric-segment", 0, 24]
    h = bulk._put(session, (3,), np.dtype("<f8"), {"shm": ref})  # bulk: put (shm)
    assert_is_op_entrys(batch[-1], "put", h.id, (), {"dtype": "<f8", "shape": [3], "shm": ref})
    read = bulk._put(session, (3,), np.dtype("<f8"), {"from": 4096})  # (client's memory)
    assert_is_op_entrys(batch[-1], "put", read.id, (), {"dtype": "<f8", "shape": [3],
                                                        "from": 4096})
    session.stream.graphs = OrderedDict.fromkeys(range(-GRAPH_CACHE_SIZE, 0))  # others held
    again = function(a)  # its graph was let go meanwhile: the oldest goes, it comes again
    assert again.id == batch[-1][1]
    assert_is_op_entrys(batch[-3], "graph_free", 0, (), {"graph": -GRAPH_CACHE_SIZE})


def test_repeat_cut_reads_an_op_in_either_form_alike():
    """``fabric.arrays.stream.repeat_cut`` reads entries by position: a loop's batch, its ops
    compact where they have no params, is cut where the same batch in the full form is."""
    batch: list[Any] = []
    ids = itertools.count(10)
    x = 1
    for _ in range(60):  # a body of three ops and two frees
        total = next(ids)
        batch.append(op_entry("sum", total, (x,), {"axis": 0}))
        y = next(ids)
        batch += [op_entry("add", y, (x, total), {}), total]
        x, previous = next(ids), y
        batch += [op_entry("negative", x, (previous,), {}), previous]
    batch = batch[7:7 + MAX_BATCH_ENTRIES // 2]
    full = [entry if type(entry) is int else list(parse_op(entry)) for entry in batch]
    assert any(type(entry) is tuple and type(entry[0]) is int for entry in batch)
    assert repeat_cut(batch) == repeat_cut(full) < len(batch)
