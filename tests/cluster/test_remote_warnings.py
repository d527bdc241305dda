"""numpy's warnings on a device come back as ``fabric.RemoteWarning`` at the user's line.

End to end over real processes (a broker and numpy workers; a numexpr worker too), plus
sans-I/O tests of the worker's side (the executor keeps them per session, bounded) and of
the wire's form. Each test sets the ``warnings`` filters it relies on inside
``warnings.catch_warnings``, so the module registries start afresh.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
from conftest import HEARTBEAT

import fabric
from fabric.core.errors import ProtocolError
from fabric.core.protocol import Kind, Message, decode, encode
from fabric.core.wire import MAX_WARNINGS, decode_warnings
from fabric.launch.local import LocalCluster
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor

VALUES = np.array([1.0, 0.0, -1.0])


def next_line() -> int:
    """The number of the caller's next line (where the op under test is issued)."""
    return sys._getframe(1).f_lineno + 1


def remote(caught: list[warnings.WarningMessage]) -> list[tuple[str, str, int]]:
    """The RemoteWarnings caught, as (message, file name, line)."""
    return [(str(w.message), w.filename, w.lineno) for w in caught
            if w.category is fabric.RemoteWarning]


def test_remote_warning_is_a_runtime_warning_exported_by_fabric():
    assert issubclass(fabric.RemoteWarning, RuntimeWarning)
    assert not issubclass(fabric.RemoteWarning, fabric.FabricError)
    assert "RemoteWarning" in fabric.__all__


# -- end to end, on the numpy device ------------------------------------------------------

def test_divide_by_zero_and_invalid_value_warn_at_the_users_line_on_the_next_read(session):
    a = session.asarray(VALUES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        line = next_line()
        b = a / 0
        assert remote(caught) == []  # nothing has come back yet
        np.testing.assert_array_equal(b.numpy(), [np.inf, np.nan, -np.inf])
    assert remote(caught) == [("divide by zero encountered in divide", __file__, line),
                              ("invalid value encountered in divide", __file__, line)]


def test_sync_brings_the_warnings_of_ops_never_read(session):
    a = session.asarray(VALUES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        log_line = next_line()
        np.log(a)
        overflow_line = next_line()
        np.exp(a * 1000.0)
        session.sync()
        session.sync()  # (each is carried back once)
    assert remote(caught) == [("divide by zero encountered in log", __file__, log_line),
                              ("invalid value encountered in log", __file__, log_line),
                              ("overflow encountered in exp", __file__, overflow_line)]


def test_a_loop_warns_once_per_site_as_numpy_does(session):
    a = session.asarray(VALUES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(5):
            sqrt_line = next_line()
            root = np.sqrt(a)
            root.numpy()  # a read each time round: each brings the warning again
        for _ in range(5):
            divide_line = next_line()
            a / 0.0
        session.sync()
    assert remote(caught) == [
        ("invalid value encountered in sqrt", __file__, sqrt_line),
        ("divide by zero encountered in divide", __file__, divide_line),
        ("invalid value encountered in divide", __file__, divide_line)]


def test_an_error_filter_raises_at_the_read_and_ignore_silences(session):
    a = session.asarray(VALUES)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fabric.RemoteWarning)
        b = np.log(a)
        with pytest.raises(fabric.RemoteWarning, match="divide by zero encountered in log"):
            b.numpy()
        np.testing.assert_array_equal(np.isnan(b.numpy()), [False, False, True])  # (once)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=fabric.RemoteWarning)
        c = a / 0
        c.numpy()
        warnings.warn("a local one still shows", RuntimeWarning)
    assert [str(w.message) for w in caught] == ["a local one still shows"]


def test_a_traced_function_warns_at_its_own_line(session):
    lines = []

    @fabric.function
    def normalise(x):
        total = x.sum()
        lines.append(next_line())  # (run once, when traced)
        return x / (total - total)  # (a zero the tracer cannot see: it is on the device)
    a = session.asarray(VALUES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        normalise(a).numpy()
        normalise(a).numpy()  # replayed: the same site, so no second warning
    assert remote(caught) == [("divide by zero encountered in divide", __file__, *lines),
                              ("invalid value encountered in divide", __file__, *lines)]


def test_a_captured_trace_replayed_warns_at_the_replays_line(session):
    a = session.asarray(VALUES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        with fabric.capture(session) as trace:
            log_line = next_line()
            np.log(a)  # (run as it is recorded)
        replay_line = next_line()
        trace.replay(session, a)
        session.sync()
    assert [w[2] for w in remote(caught)] == [log_line, log_line, replay_line, replay_line]


def test_past_the_bound_a_reply_counts_what_it_leaves_out(session):
    a = session.asarray(VALUES)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(MAX_WARNINGS + 5):
            np.sqrt(a)  # a new tensor each time: a distinct warning on the device
        sync_line = next_line()
        session.sync()
    found = remote(caught)
    assert len(found) == MAX_WARNINGS + 1
    assert found[-1][0].startswith("5 more floating-point warnings") and \
        found[-1][1:] == (__file__, sync_line)


def test_one_sessions_warnings_never_reach_another_sessions_reads(shared_cluster):
    with shared_cluster.connect(device=0) as noisy, shared_cluster.connect(device=0) as quiet:
        a = noisy.asarray(VALUES)
        q = quiet.asarray(VALUES)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            line = next_line()
            a / 0
            noisy.flush()
            np.testing.assert_array_equal((q + 1).numpy(), VALUES + 1)
            quiet.sync()
            assert remote(caught) == []
            noisy.sync()
        assert [w[2] for w in remote(caught)] == [line, line]


# -- end to end, on the numexpr device ----------------------------------------------------

def test_the_numexpr_device_warns_as_the_numpy_device_does_for_ops_it_runs_with_numpy():
    # Small arrays and ops numexpr computes differently run with numpy there. (A chain it
    # fuses is evaluated by numexpr, which checks no floating-point flags: README.)
    with LocalCluster(workers=1, backend="numexpr", heartbeat=HEARTBEAT) as cluster, \
            cluster.connect() as session:
        a = session.asarray(VALUES)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            small_line = next_line()
            b = np.log(a)
            int_line = next_line()
            session.asarray(np.arange(3)) // 0  # (never fused)
            b.numpy()
        assert remote(caught) == [
            ("divide by zero encountered in log", __file__, small_line),
            ("invalid value encountered in log", __file__, small_line),
            ("divide by zero encountered in floor_divide", __file__, int_line)]


# -- the worker's side, sans I/O ---------------------------------------------------------

def run_ops(executor: Executor, session: int, *ops: list) -> None:
    message = Message(Kind.SUBMIT, session, 0, {"ops": list(ops)}, (VALUES.tobytes(),))
    executor.handle(decode(encode(message)))


def sync(executor: Executor, session: int) -> dict:
    [reply] = executor.handle(Message(Kind.REQUEST, session, 9, {"op": "sync"}))
    return reply.body


def test_the_executor_keeps_warnings_per_session_and_carries_them_once():
    executor = Executor(NumpyDevice(0))
    for session in (1, 2):
        executor.handle(Message(Kind.OPEN, session, 1, {"device": 0}))
    put = ["put", 1, [], {"dtype": "<f8", "shape": [3], "buffer": 0}]
    with executor.floating_point_errors():
        run_ops(executor, 1, put, ["divide", 2, [1, [0]], {}], ["divide", 2, [1, [0]], {}])
        run_ops(executor, 2, put, ["add", 2, [1, 1.0], {}])
        assert sync(executor, 2) == {"ok": True}
        assert decode_warnings(sync(executor, 1)) == ([
            ("divide by zero encountered in divide", 2, None, None),
            ("invalid value encountered in divide", 2, None, None)], 0)
        assert sync(executor, 1) == {"ok": True}
    with np.errstate(all="ignore"):  # outside it: numpy's own state, not the session's
        run_ops(executor, 1, ["divide", 3, [1, [0]], {}])
    assert sync(executor, 1) == {"ok": True}


def test_malformed_warnings_on_the_wire_are_a_protocol_error():
    assert decode_warnings({}) == ([], 0)
    for body in ({"warnings": "x"}, {"warnings": [["m", "t", None, None]]},
                 {"warnings": [["m", 1, None]]}, {"warnings": [], "warnings_dropped": "2"},
                 {"warnings": [["m", 1, None, None]] * (MAX_WARNINGS + 1)}):
        with pytest.raises(ProtocolError):
            decode_warnings(body)
