"""End-to-end: the capture device records a session's ops; traces print, save and replay."""

from __future__ import annotations

import numpy as np
import pytest

import fabric
from fabric.graphs.capture import Trace


def test_a_captured_computation_replays_on_another_session(session, shared_cluster, tmp_path):
    weights = session.asarray(np.arange(12.0).reshape(3, 4))  # made before: a trace input
    with fabric.capture(session) as trace:
        x = session.asarray(np.linspace(0, 1, 4))
        session.random.seed(5)
        noise = session.random.normal(size=4)
        y = (weights @ x + 1.5).clip(0, 10)[::2]
        total = (y * noise.sum()).sum()
    expected = total.numpy()
    assert trace.inputs == [weights.id]
    text = str(trace)
    assert "matmul(" in text and "clip(" in text and f"t{y.id} =" in text
    path = tmp_path / "trace.msgpack"
    trace.save(path)
    loaded = Trace.load(path)
    with shared_cluster.connect(device=1) as other:
        replayed = loaded.replay(other, other.asarray(np.arange(12.0).reshape(3, 4)))
        assert replayed[total.id].session is other
        np.testing.assert_array_equal(replayed[total.id].numpy(), expected)
        np.testing.assert_array_equal(replayed[y.id].numpy(), y.numpy())


def test_a_printed_trace_shows_scalars_as_the_user_gave_them(session):
    t = session.ones(3, dtype="float32")
    with fabric.capture(session) as trace:
        (t + np.float32(2.5)) * 3 - 0.5
    lines = str(trace).splitlines()  # a numpy scalar keeps its type (before: 2.5, as a float)
    assert lines[0].startswith(f"t{t.id + 1} = add(t{t.id}, np.float32(2.5))")
    assert f"multiply(t{t.id + 1}, 3)" in lines[1] and ", 0.5)" in lines[2]


def test_capture_records_only_inside_the_block(session):
    before = session.ones(2)
    with fabric.capture(session) as trace:
        inside = before + 1
    after = inside * 2
    assert [entry["out"] for entry in trace.ops] == [inside.id]
    assert after.numpy().tolist() == [4.0, 4.0]


def test_replay_needs_the_trace_inputs(session):
    base = session.ones(3)
    with fabric.capture(session) as trace:
        base * 2
    with pytest.raises(TypeError, match="did not create"):
        trace.replay(session)


def test_loading_something_else_is_refused(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="not a fabric trace"):
        Trace.load(path)


def test_a_trace_with_graph_calls_says_it_cannot_replay(session):
    @fabric.function
    def double(t):
        return t * 2

    base = session.ones(3)
    with fabric.capture(session) as trace:
        double(base)
    with pytest.raises(TypeError, match="fabric.function"):
        trace.replay(session, base)
