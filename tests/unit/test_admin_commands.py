"""The broker's admin commands, sans I/O: ADMIN frames in, ADMIN_REPLY / ERROR / REJECT out.

The registry is driven by hand with a fake clock, as in test_registry.py (whose helpers this
reuses); every answer is decoded and checked, and every refusal is shown to change nothing.
"""

from __future__ import annotations

import copy

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_registry import (
    apply_events,
    CLIENT_TOKEN,
    LIMITS,
    SERVER,
    WORKER_TOKEN,
    A,
    B,
    C1,
    C2,
    check_invariants,
    decoded,
    events,
    frames,
    hello,
    kinds,
    only,
    open_session,
    register_frames,
    rejected,
)

from fabric.broker.model import SessionPhase, Side
from fabric.broker.registry import Registry
from fabric.core import protocol
from fabric.core.errors import (
    AuthenticationError,
    DeviceDraining,
    HandshakeError,
    NotFound,
    ProtocolError,
    SessionLost,
    error_from_wire,
)
from fabric.core.log_limit import peer_label
from fabric.core.protocol import Kind

ADMIN_TOKEN = "admin-secret-token"
ADMIN = b"admin-1"  # the admin tool's identity on the frontend


def make_registry(admin_token: str | None = ADMIN_TOKEN) -> Registry:
    """Worker "a" owns device 0, worker "b" owns devices 1 and 2; started at time 0."""
    registry = Registry(client_token=CLIENT_TOKEN, worker_token=WORKER_TOKEN,
                        admin_token=admin_token, server=SERVER, limits=LIMITS, now=0.0)
    for identity, name, count in ((A, "a", 1), (B, "b", 2)):
        registry.from_worker(identity, register_frames(name, [{}] * count), 0.0)
    return registry


def admin(registry: Registry, command: str, now: float = 1.0, *, token: str = ADMIN_TOKEN,
          request: int = 9, **args):
    """Send one ADMIN request; returns every Send."""
    return registry.from_client(ADMIN, frames(Kind.ADMIN, 0, request, {
        "token": token, "command": command, "args": args}), now)


def result(registry: Registry, command: str, now: float = 1.0, **args) -> dict:
    """Run a command that must succeed alone; returns its result."""
    reply = only(admin(registry, command, now, **args), Side.FRONTEND, ADMIN, Kind.ADMIN_REPLY)
    assert reply.request == 9 and reply.body["command"] == command
    return reply.body["result"]


def listing(registry: Registry, command: str, now: float = 1.0) -> list[dict]:
    """The rows of a list command (workers, devices, sessions)."""
    return result(registry, command, now)[command]


def refused(sends, error_type: type, kind: Kind = Kind.ERROR) -> Exception:
    """The single answer to the admin, a typed error of exactly ``error_type``."""
    message = only(sends, Side.FRONTEND, ADMIN, kind)
    assert message.request == 9
    error = error_from_wire(message.body)
    assert type(error) is error_type, message.body
    return error


def state(registry: Registry) -> tuple:
    """Everything an admin command could change, for nothing-changed checks."""
    return (copy.deepcopy(registry.sessions), {i: (w.name, set(w.sessions), w.draining)
                                               for i, w in registry.workers.items()},
            dict(registry.rejects), registry.stopping)


def busy_registry() -> Registry:
    """Sessions 7 (device 0, client 1) and 8 (device 2, client 2) open with some traffic."""
    registry = make_registry()
    open_session(registry, C1, session=7, device=0)
    open_session(registry, C2, session=8, device=2, now=0.5)
    registry.from_client(C1, frames(Kind.SUBMIT, 7, 0, {"ops": []}, [b"x" * 100]), 1.0)
    registry.from_client(C1, frames(Kind.SUBMIT, 7, 0, {"ops": []}), 1.1)
    registry.from_client(C1, frames(Kind.REQUEST, 7, 3, {"op": "sync"}), 1.2)
    registry.from_worker(A, frames(Kind.REPLY, 7, 3, {"ok": True}), 1.3)
    registry.from_client(C2, frames(Kind.REQUEST, 8, 1, {"op": "sync"}), 1.4)
    return registry


# -- the token --------------------------------------------------------------------------------


def test_the_admin_token_is_accepted():
    registry = make_registry()
    pong = result(registry, "ping", now=4.0)
    assert pong == {"server": SERVER, "protocol_version": protocol.PROTOCOL_VERSION,
                    "uptime": 4.0, "pair": None}
    assert registry.counters["admin_commands"] == 1


@pytest.mark.parametrize("token", [CLIENT_TOKEN, WORKER_TOKEN, "", ADMIN_TOKEN + "x"])
def test_any_other_token_is_refused_and_counted(token):
    registry = make_registry()
    before = state(registry)
    sends = admin(registry, "close-session", token=token, session=7)
    error = refused(sends, AuthenticationError, kind=Kind.REJECT)
    assert "admin commands need the admin token" in error.message
    assert error.details == {}
    assert registry.rejects["admin_unauthorized"] == 1
    assert ADMIN_TOKEN.encode() not in b"".join(sends[0].frames)
    before[2]["admin_unauthorized"] = 1
    assert state(registry) == before


def test_a_broker_without_an_admin_token_refuses_every_admin_command():
    registry = make_registry(admin_token=None)
    refused(admin(registry, "status", token=""), AuthenticationError, kind=Kind.REJECT)
    refused(admin(registry, "status", token="None"), AuthenticationError, kind=Kind.REJECT)


def test_admin_body_without_its_fields_is_a_protocol_error():
    registry = make_registry()
    sends = registry.from_client(ADMIN, frames(Kind.ADMIN, 0, 9, {"token": ADMIN_TOKEN}), 1.0)
    refused(sends, ProtocolError)
    assert registry.counters["frontend_protocol_errors"] == 1


def test_admin_reply_is_not_accepted_from_a_client():
    registry = make_registry()
    sends = registry.from_client(ADMIN, frames(Kind.ADMIN_REPLY, 0, 9, {
        "command": "status", "result": {}}), 1.0)
    refused(sends, ProtocolError)


def test_unknown_command_and_bad_arguments_are_protocol_errors():
    registry = make_registry()
    error = refused(admin(registry, "reboot"), ProtocolError)
    assert "reboot" in error.message and "status" in error.message
    for args in ({}, {"session": "7"}, {"session": True}, {"session": 0},
                 {"session": -1}):
        refused(admin(registry, "close-session", **args), ProtocolError)
    for args in ({}, {"worker": 1}):
        refused(admin(registry, "drain", **args), ProtocolError)
    assert registry.counters["admin_errors"] == 8


# -- read-only commands -----------------------------------------------------------------------


def test_status_counts_peers_traffic_rejects_and_protocol_errors():
    registry = busy_registry()
    hello(registry, C1, session=9, device=1, token="wrong")  # a rejected handshake
    registry.from_client(C1, [b"garbage"], 1.5)  # a protocol error
    status = result(registry, "status", now=10.0)
    assert status["server"] == SERVER and status["uptime"] == 10.0
    assert (status["workers"], status["devices_online"], status["devices_total"]) == (2, 3, 3)
    assert status["sessions"] == 2 and status["sessions_by_state"] == {"open": 2}
    assert status["traffic"]["messages"] == 5
    assert status["traffic"]["submits"] == 2
    assert status["rates"]["messages_per_s"] == pytest.approx(0.5)
    assert status["rates"]["bytes_per_s"] == pytest.approx(status["traffic"]["bytes"] / 10)
    assert status["rejects"] == {"unauthorized": 1}
    assert status["protocol_errors"] == {"frontend": 1, "workers": 0}
    assert status["workers_draining"] == []


def test_sessions_lists_ids_clients_states_ages_and_traffic():
    registry = busy_registry()
    hello(registry, C2, session=0xABC, device=1, now=2.0)  # still opening
    rows = listing(registry, "sessions", now=3.0)
    assert [(r["id"], r["client"], r["device"], r["worker"], r["state"]) for r in rows] == [
        ("0x0000000000000007", peer_label(C1), 0, "a", "open"),
        ("0x0000000000000008", peer_label(C2), 2, "b", "open"),
        ("0x0000000000000abc", peer_label(C2), 1, "b", "opening")]
    assert not any(C1.hex() in str(row) for row in rows)  # the id itself is never shown
    first = rows[0]
    assert (first["created_ago"], first["last_seen_ago"]) == (3.0, pytest.approx(1.8))
    assert (first["messages"], first["submits"], first["errors"]) == (4, 2, 0)
    assert first["bytes"] > 100


def test_workers_and_devices_show_traffic_ages_and_drain_state():
    registry = busy_registry()
    workers = listing(registry, "workers", now=5.0)
    assert [(w["name"], w["backend"], w["devices"], w["sessions"], w["draining"],
             w["messages"], w["submits"]) for w in workers] == [
        ("a", "numpy", [0], 1, False, 4, 2), ("b", "numpy", [1, 2], 1, False, 1, 0)]
    assert workers[0]["registered_ago"] == 5.0
    assert workers[0]["last_seen_ago"] == pytest.approx(5.0 - 1.3)
    devices = listing(registry, "devices", now=5.0)
    assert [(d["index"], d["worker"], d["local"], d["online"], d["sessions"], d["messages"])
            for d in devices] == [(0, "a", 0, True, 1, 4), (1, "b", 0, True, 0, 0),
                                  (2, "b", 1, True, 1, 1)]


def test_traffic_of_ended_sessions_is_kept_per_device_and_offline_devices_are_listed():
    registry = busy_registry()
    bytes_before = {d["index"]: d["bytes"] for d in listing(registry, "devices")}
    registry.from_client(C1, frames(Kind.CLOSE, 7, 4), 2.0)
    registry.from_worker(A, frames(Kind.CLOSED, 7, 4), 2.1)
    registry.unroutable(Side.WORKERS, B, 2.2)  # worker b vanishes with session 8
    devices = listing(registry, "devices", now=3.0)
    assert [(d["index"], d["worker"], d["online"], d["backend"], d["sessions"], d["messages"])
            for d in devices] == [(0, "a", True, "numpy", 0, 4), (1, "b", False, None, 0, 0),
                                  (2, "b", False, None, 0, 1)]
    assert {d["index"]: d["bytes"] for d in devices} == bytes_before
    status = result(registry, "status", now=3.0)
    assert (status["sessions"], status["sessions_ended"]) == (0, 2)
    assert (status["devices_online"], status["devices_total"]) == (1, 3)
    assert status["traffic"]["messages"] == 5
    # When b comes back its devices are online again, with the traffic they had.
    registry.from_worker(B, register_frames("b", [{}, {}]), 4.0)
    assert [d["messages"] for d in listing(registry, "workers")] == [4, 1]


def test_worker_errors_on_a_session_are_counted():
    registry = busy_registry()
    body = {"code": "remote_error", "message": "m", "details": {}}
    registry.from_worker(A, frames(Kind.ERROR, 7, 0, body), 2.0)
    assert [r["errors"] for r in listing(registry, "sessions")] == [1, 0]
    assert result(registry, "status")["traffic"]["errors"] == 1


def test_no_result_holds_a_token():
    registry = busy_registry()
    hello(registry, C1, session=9, device=1, token="wrong")
    secrets = [t.encode() for t in (ADMIN_TOKEN, CLIENT_TOKEN, WORKER_TOKEN)]
    for command in ("ping", "status", "workers", "devices", "sessions"):
        packed = msgpack.packb(result(registry, command))
        assert not any(secret in packed for secret in secrets), command


# -- close-session ----------------------------------------------------------------------------


def test_close_session_closes_it_on_the_worker_and_tells_its_client():
    registry = busy_registry()
    sends = admin(registry, "close-session", session=7)
    assert [(s.side, s.identity, decoded(s).kind) for s in sends] == [
        (Side.WORKERS, A, Kind.CLOSE), (Side.FRONTEND, C1, Kind.ERROR),
        (Side.FRONTEND, ADMIN, Kind.ADMIN_REPLY)]
    assert decoded(sends[0]).session == 7
    notice = decoded(sends[1])
    assert (notice.session, notice.request) == (7, 0)
    error = error_from_wire(notice.body)
    assert isinstance(error, SessionLost) and "closed by an administrator" in error.message
    assert decoded(sends[2]).body["result"] == {"session": "0x0000000000000007", "closed": True}
    assert 7 not in registry.sessions and 8 in registry.sessions
    assert registry.counters["sessions_closed_by_admin"] == 1
    # The worker's CLOSED finds nothing to answer; the client's next call is refused.
    assert registry.from_worker(A, frames(Kind.CLOSED, 7, 0), 2.0) == []
    late = only(registry.from_client(C1, frames(Kind.REQUEST, 7, 5), 2.0), Side.FRONTEND, C1,
                Kind.ERROR)
    assert error_from_wire(late.body).code == SessionLost.code
    check_invariants(registry)


def test_close_session_of_an_opening_session_rejects_its_hello():
    registry = make_registry()
    hello(registry, C1, session=7, device=1, request=4)
    sends = admin(registry, "close-session", session=7)
    assert kinds(sends) == [Kind.CLOSE, Kind.REJECT, Kind.ADMIN_REPLY]
    reject = decoded(sends[1])
    assert (reject.session, reject.request) == (7, 4)
    error = error_from_wire(reject.body)
    assert type(error) is HandshakeError and "closed by an administrator" in error.message
    assert registry.rejects["closed_by_admin"] == 1
    # A late OPENED from the worker is ignored.
    assert registry.from_worker(B, frames(Kind.OPENED, 7, 4), 1.5) == []
    assert registry.sessions == {}


def test_close_session_of_a_closing_session_completes_the_clients_close():
    registry = busy_registry()
    registry.from_client(C1, frames(Kind.CLOSE, 7, 6), 2.0)
    assert registry.sessions[7].phase == SessionPhase.CLOSING
    sends = admin(registry, "close-session", session=7)
    closed = decoded(sends[1])
    assert (sends[1].identity, closed.kind, closed.session, closed.request) == (
        C1, Kind.CLOSED, 7, 6)


def test_close_session_of_a_session_that_does_not_exist_changes_nothing():
    registry = busy_registry()
    before = state(registry)
    error = refused(admin(registry, "close-session", session=0x1F2E), NotFound)
    assert error.message == ("Session 0x1f2e does not exist on this broker: list the open ones "
                             "with fabric admin sessions.")
    assert state(registry) == before


# -- drain ------------------------------------------------------------------------------------


def test_drain_refuses_new_sessions_on_that_worker_only_and_keeps_existing_ones():
    registry = busy_registry()  # session 8 is open on b
    drained = result(registry, "drain", worker="b")
    assert drained == {"worker": "b", "draining": True, "sessions": 1}
    for device in (1, 2):
        _, error = rejected(hello(registry, C1, session=20 + device, device=device),
                            C1, DeviceDraining)
        assert error.details == {"device": device, "worker": "b"}
        assert "draining" in error.message
    assert registry.rejects["device_draining"] == 2
    assert kinds(hello(registry, C1, session=30, device=0)) == [Kind.OPEN]  # a is fine
    # The open session on b still works both ways.
    forwarded = registry.from_client(C2, frames(Kind.REQUEST, 8, 2), 2.0)
    assert [(s.side, s.identity) for s in forwarded] == [(Side.WORKERS, B)]
    assert registry.from_worker(B, frames(Kind.REPLY, 8, 2), 2.1)[0].identity == C2
    assert [w["draining"] for w in listing(registry, "workers")] == [False, True]
    assert result(registry, "status")["workers_draining"] == ["b"]
    assert [d["draining"] for d in listing(registry, "devices")] == [False, True, True]
    # Undrain lets it take sessions again.
    assert result(registry, "undrain", worker="b")["draining"] is False
    assert kinds(hello(registry, C1, session=31, device=1)) == [Kind.OPEN]


def test_drain_ends_when_the_worker_registers_again():
    registry = make_registry()
    result(registry, "drain", worker="a")
    registry.unroutable(Side.WORKERS, A, 1.0)  # the old "a" is gone: replaced, not refused
    registry.from_worker(b"a-restarted", register_frames("a", [{}]), 1.5)
    assert kinds(hello(registry, C1, session=5, device=0)) == [Kind.OPEN]


def test_drain_of_an_unknown_worker_changes_nothing():
    registry = busy_registry()
    before = state(registry)
    error = refused(admin(registry, "drain", worker="worker-9"), NotFound)
    assert "worker-9" in error.message and "connected: a, b" in error.message
    assert state(registry) == before


# -- shutdown ---------------------------------------------------------------------------------


def test_shutdown_answers_then_asks_the_loop_to_stop():
    registry = busy_registry()
    assert result(registry, "shutdown") == {"server": SERVER, "stopping": True, "sessions": 2}
    assert registry.stopping
    told = registry.shutdown()
    assert sorted(s.identity for s in told) == [C1, C2]


# -- fuzzing: admin commands mixed into any event sequence ------------------------------------


@st.composite
def admin_events(draw):
    command = draw(st.sampled_from(["status", "workers", "devices", "sessions", "drain",
                                    "undrain", "close-session", "nonsense"]))
    args = {"close-session": {"session": draw(st.sampled_from([1, 2, 3, 4]))},
            "drain": {"worker": draw(st.sampled_from(["a", "b", "z"]))},
            "undrain": {"worker": draw(st.sampled_from(["a", "b"]))}}.get(command, {})
    token = draw(st.sampled_from([ADMIN_TOKEN] * 4 + [CLIENT_TOKEN]))
    return "client", ADMIN, frames(Kind.ADMIN, 0, 9, {"token": token, "command": command,
                                                      "args": args}), draw(st.floats(0, 2))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events() | admin_events(), min_size=1, max_size=30))
def test_fuzz_admin_commands_among_other_events(sequence):
    registry = make_registry()
    open_session(registry, C1, session=1, device=0)
    open_session(registry, C2, session=2, device=1)
    hello(registry, C1, session=3, device=2)

    def listings_hold(registry: Registry, now: float) -> None:
        for command in ("status", "workers", "devices", "sessions"):
            result(registry, command, now)
        # Broker-wide totals also keep the traffic of local indexes a worker no longer has.
        total = result(registry, "status", now)["traffic"]["messages"]
        assert total >= sum(d["messages"] for d in listing(registry, "devices", now))

    apply_events(registry, sequence, listings_hold)



def test_workers_shows_hosts_and_the_lost_ones_with_when_they_were_last_heard():
    registry = make_registry()
    registry.from_worker(B, frames(Kind.REGISTER, body={
        "token": WORKER_TOKEN, "name": "b", "backend": "numpy", "devices": [{}, {}],
        "host": "node7"}), 1.0)  # b again, now saying its host
    registry.from_worker(B, frames(Kind.HEARTBEAT), 2.5)
    answer = result(registry, "workers", now=3.0)
    assert [(w["name"], w["host"], w["address"]) for w in answer["workers"]] == [
        ("a", "", ""), ("b", "node7", "")]  # (bytes frames carry no Peer-Address)
    assert answer["lost"] == []
    registry.unroutable(Side.WORKERS, B, 4.0)  # b vanished; heard from last at 2.5
    answer = result(registry, "workers", now=10.0)
    assert [w["name"] for w in answer["workers"]] == ["a"]
    assert answer["lost"] == [{"name": "b", "host": "node7", "address": "", "backend": "numpy",
                               "devices": [1, 2], "lost_ago": 7.5}]
    # Back, it is no longer lost; forgotten, it is not listed at all.
    registry.from_worker(B, register_frames("b", [{}, {}]), 11.0)
    assert result(registry, "workers", now=12.0)["lost"] == []
    registry.unroutable(Side.WORKERS, B, 13.0)
    result(registry, "forget", now=14.0, worker="b")
    assert result(registry, "workers", now=15.0)["lost"] == []


def test_a_worker_numbered_by_the_state_file_alone_is_lost_since_before_the_start():
    registry = Registry(client_token=CLIENT_TOKEN, worker_token=WORKER_TOKEN,
                        admin_token=ADMIN_TOKEN, server=SERVER, limits=LIMITS, now=0.0)
    registry.worker_table.restore({"device_count": 2, "workers": {"old": [0, 1]}})
    assert result(registry, "workers")["lost"] == [{
        "name": "old", "host": "", "address": "", "backend": None, "devices": [0, 1],
        "lost_ago": None}]
