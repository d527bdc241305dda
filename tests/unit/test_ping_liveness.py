"""A client's PING keeps its sessions alive at a constant cost, however many it holds.

Sans I/O on a fake clock: liveness is kept per client connection and read where the lease is
checked (the registry's tick) and where the admin shows it. The flood against real processes
is in ``test_floods.py``.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_registry import (
    C1,
    C2,
    LIMITS,
    decoded,
    frames,
    keep_workers_alive,
    open_session,
    two_workers,
    without_heartbeats,
)

from fabric.broker import admin_service
from fabric.broker.model import Side
from fabric.core.protocol import Kind

MANY = 2048


def probed(sends) -> list[tuple[bytes, int]]:
    """(client, session) of each lease probe among ``sends``."""
    return sorted((s.identity, decoded(s).session) for s in without_heartbeats(sends)
                  if s.side is Side.FRONTEND and decoded(s).kind == Kind.PING)


def test_a_ping_keeps_every_session_of_its_client_alive_and_not_the_others():
    registry = two_workers()
    for session in (1, 2, 3):
        open_session(registry, C1, session=session, device=session % 3)
    open_session(registry, C2, session=4)
    pong = registry.from_client(C1, frames(Kind.PING, 0, 9), 6.0)
    assert [decoded(s).kind for s in pong] == [Kind.PONG]
    keep_workers_alive(registry, 10.5)
    assert probed(registry.tick(10.5)) == [(C2, 4)]  # silent past the lease
    keep_workers_alive(registry, 16.5)
    assert probed(registry.tick(16.5)) == [(C1, 1), (C1, 2), (C1, 3)]  # silent since 6.0
    assert set(registry.sessions) == {1, 2, 3, 4}  # a probe alone ends nothing


def test_a_client_that_pinged_then_vanished_still_loses_its_sessions():
    registry = two_workers()
    open_session(registry, C1, session=1)
    open_session(registry, C1, session=2, device=1)
    registry.from_client(C1, frames(Kind.PING, 0, 1), 5.0)
    keep_workers_alive(registry, 15.5)
    assert probed(registry.tick(15.5)) == [(C1, 1), (C1, 2)]
    ends = registry.unroutable(Side.FRONTEND, C1, 15.5)  # the probe found it gone
    assert sorted(decoded(s).session for s in ends) == [1, 2]
    assert registry.sessions == {} and registry.client_sessions == {}


def test_a_ping_costs_the_same_however_many_sessions_its_client_holds(monkeypatch):
    registry = two_workers()
    registry.limits = replace(LIMITS, max_sessions_per_client=MANY,
                              max_sessions_per_device=MANY)
    for session in range(1, MANY + 1):
        open_session(registry, C1, session=session, device=1 + session % 2)
    # A PING reads no session: its client's liveness is one entry, whatever it holds.
    monkeypatch.setattr(registry._sessions, "of_client", pytest.fail)
    for now in range(1, 101):
        registry.from_client(C1, frames(Kind.PING, 0, now), float(now))
    assert {s.last_seen for s in registry.sessions.values()} == {0.0}  # untouched
    assert {registry.last_seen(s) for s in registry.sessions.values()} == {100.0}


def test_the_admin_shows_a_ping_as_the_sessions_last_sight():
    registry = two_workers()
    open_session(registry, C1, session=7, now=1.0)
    registry.from_client(C1, frames(Kind.PING, 0, 1), 4.0)
    [row] = admin_service.sessions(registry, 5.0)["sessions"]
    assert row["last_seen_ago"] == pytest.approx(1.0)


def test_pings_from_clients_without_sessions_leave_nothing_behind():
    registry = two_workers()
    for client in range(1000):
        registry.from_client(b"peer-%d" % client, frames(Kind.PING, 0, 1), 1.0)
    open_session(registry, C1, session=7, now=1.0)
    registry.from_client(C1, frames(Kind.PING, 0, 1), 2.0)
    registry.from_client(C1, frames(Kind.CLOSE, 7, 2), 3.0)
    registry.from_worker(registry.sessions[7].worker, frames(Kind.CLOSED, 7, 2), 3.0)
    assert registry.sessions == {} and registry._sessions._client_pinged == {}
