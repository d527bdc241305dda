"""End-to-end: one client token cannot take every session slot of a device (issue 30 item 7).

The attack runs against a real broker and worker (``LocalCluster``) given two client tokens
(the cluster's own, which the attacker holds, and another team's): the attacker opens raw
DEALER connections and sends HELLOs until refused, more sessions than any per-connection
limit allows; the holder of the other token still gets its share.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import HEARTBEAT
from rawpeers import RawDealer

import fabric
from fabric import LocalCluster
from fabric.core.errors import TooManySessions, error_from_wire
from fabric.core.protocol import Kind, Message

pytestmark = pytest.mark.timeout(90)

PER_CONNECTION, PER_DEVICE = 4, 8  # two tokens: 4 sessions each on a device by default
VICTIM = "victim-team-token-9c4d"


@pytest.fixture
def two_token_cluster(tmp_path: Path):
    tokens = tmp_path / "client-tokens"
    args = ("--token-file", str(tokens), "--max-sessions-per-client", str(PER_CONNECTION),
            "--max-sessions-per-device", str(PER_DEVICE))
    cluster = LocalCluster(workers=1, heartbeat=HEARTBEAT, broker_args=args)
    fd = os.open(tokens, os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{cluster.token}\n{VICTIM}\n")  # the cluster's own token is the attacker's
    with cluster as running:
        yield running


def _hello_answers(address: str, token: str, connections: int, per_connection: int,
                   ) -> list[Message]:
    """HELLOs from ``connections`` raw DEALERs, ``per_connection`` each: every answer."""
    peers = [RawDealer(address, token) for _ in range(connections)]
    try:
        answers = []
        for c, peer in enumerate(peers):
            for s in range(per_connection):
                peer.send_message(Message(Kind.HELLO, session=1000 + 100 * c + s, request=1,
                                          body={"token": token, "device": 0}))
            for _ in range(per_connection):
                answers.append(peer.recv_until(
                    lambda m: m.kind in (Kind.WELCOME, Kind.REJECT), 5.0))
        return answers
    finally:
        for peer in peers:
            peer.close()


def test_one_token_over_many_connections_leaves_the_other_tokens_share(two_token_cluster):
    # 3 connections x 4 HELLOs: 12 sessions wanted, past the device's 8 by this token alone.
    answers = _hello_answers(two_token_cluster.address, two_token_cluster.token, 3,
                             PER_CONNECTION)
    welcomed = [a for a in answers if a.kind == Kind.WELCOME]
    refusals = [error_from_wire(a.body) for a in answers if a.kind == Kind.REJECT]
    assert len(welcomed) == PER_DEVICE // 2
    assert {type(e) for e in refusals} == {TooManySessions}
    assert {e.details["reason"] for e in refusals} == {"per_token"}
    assert "token of your own" in refusals[0].message
    # The attacker's connections are closed: the broker forgets their sessions on its own;
    # meanwhile the other token's holder opens sessions up to its own share, with the real
    # client library.
    sessions = [fabric.connect(two_token_cluster.address, token=VICTIM, device=0, timeout=5)
                for _ in range(PER_DEVICE // 2)]
    try:
        for session in sessions:
            assert session.arange(3).sum().numpy() == 3
    finally:
        for session in sessions:
            session.close()
