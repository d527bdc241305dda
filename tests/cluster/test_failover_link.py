"""A client's link to the active broker of a pair breaks while the broker goes on serving (a
relay between them cuts it; no takeover): the client comes back to the same broker over a
new connection and resumes its sessions with their secrets, whether the broker has yet seen
the link go (its sessions wait RESUMABLE for the resume grace) or not (they move to the new
connection); what had no answer is sent again and runs once.
"""

from __future__ import annotations

import numpy as np
import pytest

import fabric
from conftest import broker_pair
from fabric.core.errors import ResumeRefused
from fabric.core.protocol import Kind, Message
from fabric.transport.connection import Connection
from tcprelay import TcpRelay
from test_failover_resume import admin_state

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def relayed(tmp_path):
    """A pair, and a relay in front of its primary's frontend that the client goes through."""
    with broker_pair(tmp_path, "--settle", "3") as cluster, TcpRelay(cluster.address) as relay:
        yield cluster, relay


def connect(cluster: fabric.LocalCluster, relay: TcpRelay) -> fabric.Session:
    return fabric.connect(f"{relay.address},{cluster.standby_address}", token=cluster.token,
                          timeout=30)


@pytest.mark.parametrize("down", [0.0, 1.0], ids=["back at once", "back after the broker saw"])
def test_a_session_whose_link_breaks_resumes_on_the_same_broker_and_runs_each_op_once(
        relayed, down):
    cluster, relay = relayed
    session = connect(cluster, relay)
    x = session.asarray(np.arange(10.0))
    assert float(x.sum()) == 45.0
    reads = [session.start_read(x * 3)]  # (in flight at the cut, or answered into it)
    relay.cut(down=down)
    y = x + 1
    assert y.numpy().tolist() == list(np.arange(10.0) + 1)
    assert reads[0].result().tolist() == list(np.arange(10.0) * 3)
    assert session.connection.address == relay.address  # the same broker, a new connection
    assert session.stats()["ops"] == 4, "the asarray, the sum, the product and the sum ran once"
    assert admin_state(cluster, cluster.address) == "active"
    session.close()


def test_a_live_session_is_not_taken_by_a_resume_without_its_secret(relayed):
    """The broker moves an open session to a new connection only with its secret: a RESUME
    with another is refused, and the session stays its client's."""
    cluster, relay = relayed
    session = connect(cluster, relay)
    x = session.asarray(np.ones(4))
    secret = session.connection.resume_keys[session.id]
    intruder = Connection(cluster.address, cluster.token)
    try:
        for guess in (b"", b"\0" * 16, secret[:-1] + bytes([secret[-1] ^ 1])):
            reply = intruder.request(Message(Kind.RESUME, session.id, body={
                "token": cluster.token, "secret": guess}), 10)
            assert reply.kind == Kind.REJECT and reply.body["code"] == ResumeRefused.code
            assert reply.body["details"]["reason"] == "wrong_secret"
    finally:
        intruder.close()
    assert float(x.sum()) == 4.0
    session.close()
