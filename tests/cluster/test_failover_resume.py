"""Sessions that survive a broker takeover, with real processes (``fabric cluster up
--standby``'s pair, ``fabric.core.resume``): the primary SIGKILLed mid-stream, the workers keep
the sessions and report them to the backup, the client resumes each with its secret and
sends again what had no answer; nothing runs twice, and what cannot be resumed is
``SessionLost`` naming why.
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

import fabric
from conftest import broker_pair
from faultproxy import stopped
from polling import wait_for
from fabric.core.errors import ResumeRefused
from fabric.core.protocol import Kind, Message
from fabric.transport.connection import Connection

pytestmark = pytest.mark.timeout(120)

STEPS = 400


@pytest.fixture
def pair(tmp_path):
    with broker_pair(tmp_path, "--settle", "3") as cluster:
        yield cluster


def kill_primary(cluster: fabric.LocalCluster) -> None:
    cluster.broker.send_signal(signal.SIGKILL)
    cluster.broker.wait(5)


def expected(start: np.ndarray, steps: int) -> float:
    x = start.copy()
    for _ in range(steps):
        x = np.tanh(x) + 1
    return float(x.sum())


def test_a_stream_of_ops_gives_the_same_answer_across_a_sigkill_of_the_primary(pair):
    start = np.linspace(-1.0, 1.0, 1000)
    session = pair.connect(timeout=30)
    x = session.asarray(start)
    for step in range(STEPS):
        if step == STEPS // 2:
            float(x.sum())  # (the first half has reached the device)
            kill_primary(pair)
        x = np.tanh(x) + 1
    assert float(x.sum()) == pytest.approx(expected(start, STEPS), rel=1e-12)
    assert session.connection.address == pair.standby_address
    stats = session.stats()
    # Nothing ran twice: the asarray, 2 ops a step, the 2 sums
    assert stats["ops"] == 2 * STEPS + 3, stats
    session.close()


def test_reads_sent_before_the_loss_is_seen_are_answered_after_the_takeover(pair):
    session = pair.connect(timeout=30)
    x = session.asarray(np.arange(10.0))
    y = (x * 3).sum()
    assert float(y) == 135.0
    kill_primary(pair)
    z = x + 1  # batched, then sent with the read into the dead broker's socket
    assert z.numpy().tolist() == list(np.arange(10.0) + 1)
    assert float(y) == 135.0
    session.close()


def test_another_sessions_id_without_its_secret_is_refused_after_a_takeover(pair):
    session = pair.connect(timeout=30)
    x = session.asarray(np.ones(4))
    other = session.open(0)
    secret = session.connection.resume_keys[other.id]
    kill_primary(pair)
    assert float(x.sum()) == 4.0  # resumed both (the other is idle)
    intruder = Connection(pair.standby_address, pair.token)
    try:
        for guess in (b"", b"\0" * 16, secret[:-1] + bytes([secret[-1] ^ 1])):
            reply = intruder.request(Message(Kind.RESUME, other.id, body={
                "token": pair.token, "secret": guess}), 10)
            assert reply.kind == Kind.REJECT and reply.body["code"] == ResumeRefused.code
    finally:
        intruder.close()
    assert float(other.asarray(np.ones(2)).sum()) == 2.0  # the other goes on, its own
    session.close()


def test_a_session_whose_worker_died_too_is_lost_naming_why(pair):
    session = pair.connect(timeout=30)
    x = session.asarray(np.ones(4))
    assert float(x.sum()) == 4.0
    pair.workers[0].send_signal(signal.SIGKILL)
    kill_primary(pair)
    started = time.monotonic()
    with pytest.raises(fabric.SessionLost) as raised:
        float((x + 1).sum())
    assert isinstance(raised.value, ResumeRefused), raised.value
    assert raised.value.details["reason"] == "not_reported"
    assert "worker died too" in raised.value.message
    assert time.monotonic() - started < 30
    session.close()


def test_a_graph_call_in_flight_at_the_kill_runs_once(pair):
    @fabric.function
    def step(x):
        return np.tanh(x) + 1

    start = np.linspace(-1.0, 1.0, 100)
    session = pair.connect(timeout=30)
    x = step(session.asarray(start))  # registered and run
    assert float(x.sum()) == pytest.approx(expected(start, 1), rel=1e-12)
    kill_primary(pair)
    for _ in range(20):  # replays sent into the dead broker's socket, then resent
        x = step(x)
    assert float(x.sum()) == pytest.approx(expected(start, 21), rel=1e-12)
    assert session.stats()["graph_replays"] == 20
    session.close()


def test_a_stream_with_the_primary_killed_at_any_moment_of_it_runs_each_op_once(pair):
    """The kill comes from another thread while the client streams (and reads now and then):
    wherever it falls, the answer is numpy's and the device ran every op once."""
    start = np.linspace(-1.0, 1.0, 1000)
    session = pair.connect(timeout=30)
    x = session.asarray(start)
    killer = threading.Timer(0.3, kill_primary, (pair,))
    killer.start()
    try:
        for step in range(1, 3 * STEPS + 1):
            x = np.tanh(x) + 1
            if step % 50 == 0:
                session.flush()
            if step % 200 == 0:
                float(x[:1].sum())
    finally:
        killer.join()
    assert float(x.sum()) == pytest.approx(expected(start, 3 * STEPS), rel=1e-12)
    assert session.connection.address == pair.standby_address
    session.close()


def test_both_brokers_killed_end_the_session_typed_and_fast(pair):
    session = pair.connect(timeout=30)
    x = session.asarray(np.ones(4))
    assert float(x.sum()) == 4.0
    pair.standby_broker.send_signal(signal.SIGKILL)
    pair.standby_broker.wait(5)
    kill_primary(pair)
    started = time.monotonic()
    with pytest.raises(fabric.SessionLost) as raised:
        float((x + 1).sum())
    assert raised.value.details["reason"] == "takeover_failed", raised.value
    assert time.monotonic() - started < 10
    session.close()


def test_reads_in_flight_at_the_kill_are_answered_once_and_run_once(pair):
    """Reads sent before the kill and computing while it comes: the device's replies went to
    the dead broker; sent again, they are answered from the device's record of replies."""
    start = np.eye(200) * 0.5 + np.full((200, 200), 1e-3)
    session = pair.connect(timeout=30)
    x = session.asarray(start)
    y = x
    for _ in range(60):
        y = y @ x
    reads = [session.start_read(y), session.start_read(y[:5])]
    kill_primary(pair)
    want = start.copy()
    for _ in range(60):
        want = want @ start
    got = [read.result() for read in reads]
    np.testing.assert_allclose(got[0], want, rtol=1e-12)
    np.testing.assert_allclose(got[1], want[:5], rtol=1e-12)
    assert session.stats()["ops"] == 1 + 60 + 1, "every op ran once (the slice is one)"
    session.close()


def admin_state(cluster: fabric.LocalCluster, address: str) -> str:
    with fabric.Admin(address, token=cluster.admin_token, timeout=3) as admin:
        return admin.status()["pair"]["state"]


def test_a_session_resumed_past_a_paused_primary_goes_on_when_it_steps_down(pair):
    """SIGSTOP: the client's link and the worker's go silent, both move to the backup; the
    primary, resumed, hears the newer active and steps down: the session is not served
    twice, and goes on through the backup."""
    session = pair.connect(timeout=30)
    x = session.asarray(np.arange(4.0))
    assert float(x.sum()) == 6.0
    with stopped(pair.broker):
        x = x + 1
        assert float(x.sum()) == 10.0  # (the takeover runs inside this read)
        assert session.connection.address == pair.standby_address
    wait_for(lambda: admin_state(pair, pair.address) == "passive", 10,
             "the primary to step down", detail=lambda: pair.log_tail("broker"))
    x = x * 2
    assert float(x.sum()) == 20.0
    assert admin_state(pair, pair.standby_address) == "active"
    session.close()


def test_a_sharded_computation_across_a_takeover_gives_numpys_answer(tmp_path):
    """A mesh's sessions (two workers, one connection) are each resumed; the sharded
    stream goes on."""
    with broker_pair(tmp_path, "--settle", "3", workers=2) as cluster:
        start = np.linspace(-1.0, 1.0, 1000)
        with cluster.connect(timeout=30) as parent:
            mesh = parent.mesh()
            x = mesh.asarray(start, axis=0)
            for step in range(200):
                if step == 100:
                    float(x.sum())
                    kill_primary(cluster)
                x = np.tanh(x) + 1
            want = start.copy()
            for _ in range(200):
                want = np.tanh(want) + 1
            np.testing.assert_allclose(x.numpy(), want, rtol=1e-12)
            assert parent.connection.address == cluster.standby_address
