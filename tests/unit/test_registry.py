"""The broker's session registry and worker table, driven by hand with a fake clock.

Every input is frames built with ``protocol.encode``; every output is a ``Send`` that is
decoded and checked. Times are plain floats.
"""

from __future__ import annotations

import pytest
import zmq
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from fabric.broker.model import Limits, Send, SessionPhase, Side
from fabric.broker.registry import Registry
from fabric.core import protocol
from fabric.core.errors import (
    AuthenticationError,
    ConnectError,
    DeviceOffline,
    DuplicateSession,
    HandshakeError,
    NoSuchDevice,
    ProtocolError,
    SessionLost,
    TooManySessions,
    VersionMismatch,
    WorkerNameTaken,
    WrongPort,
    error_from_wire,
)
from fabric.core.protocol import DATA_KINDS, PROTOCOL_VERSION, Kind, Message

CLIENT_TOKEN = "client-secret-token"
WORKER_TOKEN = "worker-secret-token"
LIMITS = Limits(heartbeat=1.0, liveness=3, open_timeout=5.0, lease=10.0)
SERVER = "test-broker"

A, B = b"worker-a", b"worker-b"  # worker identities
C1, C2 = b"client-1", b"client-2"  # client identities


# -- helpers -------------------------------------------------------------------------------


def frames(kind: Kind, session: int = 0, request: int = 0, body: dict | None = None,
           buffers=(), version: int = PROTOCOL_VERSION) -> list:
    return protocol.encode(Message(kind, session, request, body or {}, tuple(buffers), version))


def register_frames(name: str, devices: list, token: str = WORKER_TOKEN,
                    version: int = PROTOCOL_VERSION) -> list:
    return frames(Kind.REGISTER, body={"token": token, "name": name, "backend": "numpy",
                                       "devices": devices}, version=version)


def make_registry(*workers: tuple[bytes, str, int], now: float = 0.0) -> Registry:
    """A registry with the given (identity, name, device count) workers registered."""
    registry = Registry(client_token=CLIENT_TOKEN, worker_token=WORKER_TOKEN, server=SERVER,
                        limits=LIMITS, now=now)
    for identity, name, count in workers:
        sends = registry.from_worker(
            identity, register_frames(name, [{"n": i} for i in range(count)]), now)
        assert kinds(sends) == [Kind.REGISTERED]
    return registry


def two_workers() -> Registry:
    """Worker "a" owns device 0, worker "b" owns devices 1 and 2."""
    return make_registry((A, "a", 1), (B, "b", 2))


def decoded(send: Send) -> Message:
    return protocol.decode(send.frames)


def kinds(sends: list[Send]) -> list[Kind]:
    return [decoded(s).kind for s in sends]


def only(sends: list[Send], side: Side, identity: bytes, kind: Kind) -> Message:
    """The single send, checked for its destination and kind, decoded."""
    assert len(sends) == 1, [(s.side, s.identity, decoded(s).kind) for s in sends]
    assert (sends[0].side, sends[0].identity) == (side, identity)
    message = decoded(sends[0])
    assert message.kind == kind, message
    return message


def rejected(sends: list[Send], identity: bytes, error_type: type) -> tuple[Message, Exception]:
    message = only(sends, Side.FRONTEND, identity, Kind.REJECT)
    error = error_from_wire(message.body)
    assert type(error) is error_type, message.body
    return message, error


def hello(registry: Registry, client: bytes, session: int, device: int = 0, *,
          token: str = CLIENT_TOKEN, request: int = 1, now: float = 0.0,
          version: int = PROTOCOL_VERSION) -> list[Send]:
    return registry.from_client(client, frames(
        Kind.HELLO, session, request, {"token": token, "device": device}, version=version), now)


def open_session(registry: Registry, client: bytes, session: int, device: int = 0, *,
                 request: int = 1, now: float = 0.0) -> Message:
    """HELLO, then the owning worker's OPENED; returns the WELCOME."""
    open_message = decoded(hello(registry, client, session, device, request=request, now=now)[0])
    worker = registry.sessions[session].worker
    return only(registry.from_worker(worker, frames(Kind.OPENED, session, open_message.request),
                                     now), Side.FRONTEND, client, Kind.WELCOME)


def assert_no_session_state(registry: Registry) -> None:
    assert registry.sessions == {}
    assert all(worker.sessions == set() for worker in registry.workers.values())


def without_heartbeats(sends: list[Send]) -> list[Send]:
    return [s for s in sends if decoded(s).kind != Kind.HEARTBEAT]


def check_invariants(registry: Registry) -> None:
    """What must hold after any event: sessions and workers agree, devices match owners."""
    for session_id, session in registry.sessions.items():
        assert session.id == session_id
        assert session.worker in registry.workers
        assert session_id in registry.workers[session.worker].sessions
        assert registry.device_of(session)["worker"] == registry.workers[session.worker].name
        assert registry.device_of(session)["index"] == session.device
    for identity, worker in registry.workers.items():
        assert all(registry.sessions[s].worker == identity for s in worker.sessions)
    indexes = [d["index"] for d in registry.devices]
    assert indexes == sorted(set(indexes)) and all(i < registry.device_count for i in indexes)


# -- worker registration -------------------------------------------------------------------


def test_register_with_a_valid_token():
    registry = make_registry()
    sends = registry.from_worker(A, register_frames("a", [{"threads": 2}]), 0.0)
    registered = only(sends, Side.WORKERS, A, Kind.REGISTERED)
    assert registered.body == {"server": SERVER, "heartbeat": LIMITS.heartbeat,
                               "max_message_bytes": LIMITS.max_message_bytes}
    assert set(registry.workers) == {A}
    assert registry.devices == [{"index": 0, "worker": "a", "local": 0, "backend": "numpy",
                                 "settings": {"threads": 2}, "draining": False}]


def test_register_with_a_bad_token_is_rejected_without_revealing_it():
    registry = make_registry()
    sends = registry.from_worker(A, register_frames("a", [{}], token="guess"), 0.0)
    message = only(sends, Side.WORKERS, A, Kind.REJECT)
    assert error_from_wire(message.body).code == AuthenticationError.code
    assert WORKER_TOKEN.encode() not in b"".join(sends[0].frames)
    assert registry.workers == {} and registry.devices == []
    assert registry.rejects["worker_unauthorized"] == 1


def test_register_with_another_version_is_rejected():
    registry = make_registry()
    sends = registry.from_worker(A, register_frames("a", [{}], version=PROTOCOL_VERSION + 1),
                                 0.0)
    error = error_from_wire(only(sends, Side.WORKERS, A, Kind.REJECT).body)
    assert isinstance(error, VersionMismatch)
    assert (error.client_version, error.server_version) == (PROTOCOL_VERSION + 1,
                                                            PROTOCOL_VERSION)
    assert registry.workers == {}


def test_register_with_devices_that_are_not_maps_is_a_protocol_error():
    registry = make_registry()
    sends = registry.from_worker(A, register_frames("a", [{}, "gpu"]), 0.0)
    assert only(sends, Side.WORKERS, A, Kind.ERROR).body["code"] == ProtocolError.code
    assert registry.workers == {}


def test_devices_are_numbered_in_registration_order_whatever_the_names_sort_as():
    # "b" registers first: "a", which sorts first, comes after it (issue 24, section 1).
    registry = make_registry((B, "b", 2), (A, "a", 1))
    assert [(d["index"], d["worker"], d["local"], d["settings"]) for d in registry.devices] == [
        (0, "b", 0, {"n": 0}), (1, "b", 1, {"n": 1}), (2, "a", 0, {"n": 0})]
    # A HELLO for a global index is sent to its owner, with the owner's local index.
    for device, owner, local in [(0, B, 0), (1, B, 1), (2, A, 0)]:
        sends = hello(registry, C1, session=100 + device, device=device)
        assert only(sends, Side.WORKERS, owner, Kind.OPEN).body["device"] == local


def test_reregistering_under_the_name_of_a_worker_whose_connection_went_replaces_it():
    registry = two_workers()
    open_session(registry, C1, session=7, device=1)  # on "b"
    restarted = b"worker-b-restarted"
    # "b" was last heard at 0.0, past heartbeat x liveness (3 s), but its connection lives:
    # quiet is not gone, and its name stays its own.
    assert kinds(registry.from_worker(restarted, register_frames("b", [{"new": True}]),
                                      3.5)) == [Kind.REJECT]
    # Its connection gone (its process ended, or libzmq found its link silent), the next
    # heartbeat to it is unroutable: its client learns the session is lost.
    lost = registry.unroutable(Side.WORKERS, B, 3.6)
    assert [(s.side, s.identity, decoded(s).kind) for s in lost] == [
        (Side.FRONTEND, C1, Kind.ERROR)]
    assert error_from_wire(decoded(lost[0]).body).code == SessionLost.code
    # The restarted worker, trying again, is welcome.
    sends = registry.from_worker(restarted, register_frames("b", [{"new": True}]), 4.0)
    assert [(s.side, s.identity, decoded(s).kind) for s in sends] == [
        (Side.WORKERS, restarted, Kind.REGISTERED)]
    assert set(registry.workers) == {A, restarted}
    assert [(d["worker"], d["settings"]) for d in registry.devices] == [
        ("a", {"n": 0}), ("b", {"new": True})]
    assert_no_session_state(registry)


def test_reregistering_from_the_same_identity_replaces_the_old_worker():
    registry = two_workers()
    sends = registry.from_worker(A, register_frames("a", [{}, {}, {}]), 1.0)
    assert kinds(sends) == [Kind.REGISTERED]
    assert set(registry.workers) == {A, B}
    assert len(registry.devices) == 5


# -- HELLO: checks in order, no state before they pass ------------------------------------


def test_hello_with_another_version_is_rejected_before_the_token_is_checked():
    registry = two_workers()
    sends = hello(registry, C1, session=7, token="wrong", request=3,
                  version=PROTOCOL_VERSION + 1)
    message, error = rejected(sends, C1, VersionMismatch)
    assert (message.session, message.request) == (7, 3)
    assert (error.client_version, error.server_version) == (PROTOCOL_VERSION + 1,
                                                            PROTOCOL_VERSION)
    assert_no_session_state(registry)
    assert registry.rejects == {"version_mismatch": 1}


def test_hello_with_another_version_is_rejected_whatever_its_body():
    # Another version may lay out its body differently: the body is not even decoded.
    registry = two_workers()
    header = protocol.Header(Kind.HELLO, 7, 3, version=PROTOCOL_VERSION + 1).pack()
    sends = registry.from_client(C1, [header, b"\x93\x01\x02\x03"], 0.0)
    rejected(sends, C1, VersionMismatch)
    assert_no_session_state(registry)


def test_hello_with_a_bad_token_reveals_nothing_else():
    registry = two_workers()
    # The device does not exist either: that must not be revealed before the token passes.
    sends = hello(registry, C1, session=7, device=99, token="wrong", request=4)
    message, error = rejected(sends, C1, AuthenticationError)
    assert (message.session, message.request) == (7, 4)
    assert error.details == {}
    assert "99" not in error.message and "3" not in error.message
    assert CLIENT_TOKEN.encode() not in b"".join(sends[0].frames)
    assert_no_session_state(registry)
    assert registry.rejects == {"unauthorized": 1}


@pytest.mark.parametrize("device", [3, -1, 2**40])
def test_hello_for_a_missing_device_says_how_many_there_are(device):
    registry = two_workers()
    message, error = rejected(hello(registry, C1, session=7, device=device), C1, NoSuchDevice)
    assert error.device_count == 3
    assert error.details["device"] == device
    assert "3 device(s)" in error.message
    assert_no_session_state(registry)


def test_hello_with_no_workers_has_no_devices():
    registry = make_registry()
    _, error = rejected(hello(registry, C1, session=7, device=0), C1, NoSuchDevice)
    assert error.device_count == 0


def test_hello_reusing_an_open_session_id_is_rejected():
    registry = two_workers()
    open_session(registry, C1, session=7, device=0)
    _, error = rejected(hello(registry, C2, session=7, device=1, request=9), C2,
                        DuplicateSession)
    assert error.details == {"session": 7}
    # The existing session is untouched.
    assert set(registry.sessions) == {7}
    assert registry.sessions[7].client == C1
    assert registry.sessions[7].phase == SessionPhase.OPEN
    assert registry.workers[B].sessions == set()


def test_hello_with_session_id_zero_is_rejected():
    registry = two_workers()
    rejected(hello(registry, C1, session=0), C1, DuplicateSession)
    assert_no_session_state(registry)


def test_hello_checks_device_before_duplicate_session():
    registry = two_workers()
    open_session(registry, C1, session=7)
    rejected(hello(registry, C2, session=7, device=50), C2, NoSuchDevice)


# -- opening a session ---------------------------------------------------------------------


def test_good_hello_opens_the_session_on_the_owning_worker():
    registry = two_workers()
    sends = hello(registry, C1, session=7, device=2, request=5, now=1.5)
    open_message = only(sends, Side.WORKERS, B, Kind.OPEN)
    assert (open_message.session, open_message.request) == (7, 5)
    assert open_message.body["device"] == 1  # "b"'s second device
    session = registry.sessions[7]
    assert (session.client, session.worker, session.device) == (C1, B, 2)
    assert session.phase == SessionPhase.OPENING
    assert session.deadline == 1.5 + LIMITS.open_timeout
    assert registry.workers[B].sessions == {7}


def test_opened_from_the_worker_welcomes_the_client():
    registry = two_workers()
    hello(registry, C1, session=7, device=2, request=5)
    sends = registry.from_worker(B, frames(Kind.OPENED, 7, 5), 0.5)
    welcome = only(sends, Side.FRONTEND, C1, Kind.WELCOME)
    assert (welcome.session, welcome.request) == (7, 5)
    assert welcome.body["device"] == {"index": 2, "worker": "b", "local": 1,
                                      "backend": "numpy", "settings": {"n": 1},
                                      "draining": False}
    assert welcome.body["device_count"] == 3
    assert welcome.body["server"] == SERVER
    assert welcome.body["heartbeat"] == LIMITS.heartbeat
    assert registry.sessions[7].phase == SessionPhase.OPEN


def test_opened_from_another_worker_is_ignored():
    registry = two_workers()
    hello(registry, C1, session=7, device=2)
    assert registry.from_worker(A, frames(Kind.OPENED, 7, 1), 0.5) == []
    assert registry.sessions[7].phase == SessionPhase.OPENING


@pytest.mark.parametrize("kind", [Kind.REJECT, Kind.ERROR])
def test_worker_refusing_to_open_rejects_the_client(kind):
    registry = two_workers()
    hello(registry, C1, session=7, device=1, request=5)
    refusal = {"code": "device_not_hostable", "message": "Cannot host.", "details": {"x": 1}}
    sends = registry.from_worker(B, frames(kind, 7, 5, refusal), 0.5)
    message = only(sends, Side.FRONTEND, C1, Kind.REJECT)
    assert (message.session, message.request) == (7, 5)
    assert message.body == refusal
    assert_no_session_state(registry)
    assert registry.rejects["device_not_hostable"] == 1


def test_worker_error_on_an_open_session_is_forwarded_as_an_error():
    registry = two_workers()
    open_session(registry, C1, session=7)
    body = {"code": "remote_error", "message": "Op failed.", "details": {}}
    message = only(registry.from_worker(A, frames(Kind.ERROR, 7, 4, body), 1.0),
                   Side.FRONTEND, C1, Kind.ERROR)
    assert (message.session, message.request, message.body) == (7, 4, body)
    assert 7 in registry.sessions


# -- data messages -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Kind.SUBMIT, Kind.REQUEST])
def test_client_data_is_forwarded_as_the_same_frame_objects(kind):
    registry = two_workers()
    open_session(registry, C1, session=7, device=1)
    incoming = [zmq.Frame(f) for f in frames(kind, 7, 3, {"op": "x"},
                                             buffers=[b"\x01" * 100, b"\x02" * 5])]
    sends = registry.from_client(C1, incoming, 2.0)
    assert len(sends) == 1
    assert (sends[0].side, sends[0].identity) == (Side.WORKERS, B)
    assert len(sends[0].frames) == len(incoming)
    assert all(out is inc for out, inc in zip(sends[0].frames, incoming))
    session = registry.sessions[7]
    assert session.messages == 1
    assert session.bytes == sum(len(f) for f in incoming)
    assert session.last_seen == 2.0


def test_worker_reply_goes_back_to_the_client_as_the_same_frames():
    registry = two_workers()
    open_session(registry, C1, session=7, device=1)
    request = frames(Kind.REQUEST, 7, 3)
    registry.from_client(C1, request, 1.0)
    incoming = frames(Kind.REPLY, 7, 3, {"value": 1}, buffers=[b"\x00" * 64])
    sends = registry.from_worker(B, incoming, 1.5)
    assert len(sends) == 1
    assert (sends[0].side, sends[0].identity) == (Side.FRONTEND, C1)
    assert all(out is inc for out, inc in zip(sends[0].frames, incoming))
    assert len(sends[0].frames) == len(incoming)
    session = registry.sessions[7]
    assert session.messages == 2
    assert session.bytes == sum(map(len, request)) + sum(map(len, incoming))


def test_data_from_another_client_is_refused_and_not_forwarded():
    registry = two_workers()
    open_session(registry, C1, session=7)
    sends = registry.from_client(C2, frames(Kind.SUBMIT, 7, 8), 1.0)
    message = only(sends, Side.FRONTEND, C2, Kind.ERROR)
    assert (message.session, message.request) == (7, 8)
    assert error_from_wire(message.body).code == SessionLost.code
    assert registry.sessions[7].messages == 0
    assert registry.counters["unknown_session"] == 1


def test_data_for_an_unknown_session_is_refused():
    registry = two_workers()
    message = only(registry.from_client(C1, frames(Kind.REQUEST, 12345, 2), 1.0),
                   Side.FRONTEND, C1, Kind.ERROR)
    assert isinstance(error_from_wire(message.body), SessionLost)
    assert (message.session, message.request) == (12345, 2)


def test_data_before_the_session_is_open_is_refused():
    registry = two_workers()
    hello(registry, C1, session=7)
    only(registry.from_client(C1, frames(Kind.SUBMIT, 7, 2), 0.1), Side.FRONTEND, C1,
         Kind.ERROR)


def test_worker_data_for_an_unknown_session_is_dropped():
    registry = two_workers()
    assert registry.from_worker(A, frames(Kind.REPLY, 99, 1), 1.0) == []
    assert registry.counters["stale_worker_data"] == 1


def test_worker_data_for_another_workers_session_is_dropped():
    registry = two_workers()
    open_session(registry, C1, session=7, device=0)  # on A
    assert registry.from_worker(B, frames(Kind.REPLY, 7, 1), 1.0) == []
    assert registry.sessions[7].messages == 0


# -- closing -------------------------------------------------------------------------------


def test_close_is_forwarded_and_answered_when_the_worker_closed():
    registry = two_workers()
    open_session(registry, C1, session=7, device=1)
    close = only(registry.from_client(C1, frames(Kind.CLOSE, 7, 11), 1.0), Side.WORKERS, B,
                 Kind.CLOSE)
    assert (close.session, close.request) == (7, 11)
    assert registry.sessions[7].phase == SessionPhase.CLOSING
    closed = only(registry.from_worker(B, frames(Kind.CLOSED, 7, 11), 1.5), Side.FRONTEND, C1,
                  Kind.CLOSED)
    assert (closed.session, closed.request) == (7, 11)
    assert_no_session_state(registry)


def test_close_from_another_client_is_refused():
    registry = two_workers()
    open_session(registry, C1, session=7)
    message = only(registry.from_client(C2, frames(Kind.CLOSE, 7, 2), 1.0), Side.FRONTEND,
                   C2, Kind.ERROR)
    assert error_from_wire(message.body).code == SessionLost.code
    assert registry.sessions[7].phase == SessionPhase.OPEN


def test_close_while_opening_answers_at_once_and_closes_on_the_worker():
    registry = two_workers()
    hello(registry, C1, session=7, device=1)
    sends = registry.from_client(C1, frames(Kind.CLOSE, 7, 2), 0.5)
    assert [(s.side, s.identity, decoded(s).kind) for s in sends] == [
        (Side.WORKERS, B, Kind.CLOSE), (Side.FRONTEND, C1, Kind.CLOSED)]
    assert decoded(sends[1]).request == 2
    assert_no_session_state(registry)
    # A late OPENED from the worker is ignored.
    assert registry.from_worker(B, frames(Kind.OPENED, 7, 1), 0.6) == []


def test_a_slow_close_succeeds_at_its_deadline():
    registry = two_workers()
    open_session(registry, C1, session=7)
    registry.from_client(C1, frames(Kind.CLOSE, 7, 2), 1.0)
    registry.from_worker(A, frames(Kind.HEARTBEAT), 6.0)
    registry.from_worker(B, frames(Kind.HEARTBEAT), 6.0)
    assert without_heartbeats(registry.tick(6.0)) == []
    closed = only(without_heartbeats(registry.tick(6.01)), Side.FRONTEND, C1, Kind.CLOSED)
    assert closed.request == 2
    assert_no_session_state(registry)


def test_ping_is_answered_with_pong():
    registry = two_workers()
    pong = only(registry.from_client(C1, frames(Kind.PING, 0, 4), 1.0), Side.FRONTEND, C1,
                Kind.PONG)
    assert pong.request == 4


def test_devices_lists_every_device_with_a_good_token():
    registry = two_workers()
    listing = only(registry.from_client(C1, frames(Kind.DEVICES, 0, 3, {"token": CLIENT_TOKEN}),
                                        0.0), Side.FRONTEND, C1, Kind.DEVICE_LIST)
    assert listing.request == 3
    assert listing.body == {"devices": registry.devices, "server": SERVER}
    rejected(registry.from_client(C1, frames(Kind.DEVICES, 0, 3, {"token": "x"}), 0.0), C1,
             AuthenticationError)


# -- the clock: heartbeats, lost workers, deadlines, idle clients --------------------------


def test_tick_sends_heartbeats_to_every_worker_once_per_interval():
    registry = two_workers()
    sends = registry.tick(0.0)
    assert sorted((s.side, s.identity) for s in sends) == [(Side.WORKERS, A), (Side.WORKERS, B)]
    assert set(kinds(sends)) == {Kind.HEARTBEAT}
    assert registry.next_deadline() == LIMITS.heartbeat / 4  # the next scan of deadlines
    assert registry.tick(0.5) == []
    assert set(kinds(registry.tick(1.0))) == {Kind.HEARTBEAT}


def test_a_worker_that_keeps_talking_is_not_lost():
    registry = two_workers()
    open_session(registry, C1, session=7, device=0)
    registry.from_worker(A, frames(Kind.REPLY, 7, 1), 2.5)  # any traffic counts
    registry.from_worker(B, frames(Kind.PONG), 2.5)
    assert without_heartbeats(registry.tick(5.5)) == []
    assert set(registry.workers) == {A, B}


def test_a_silent_worker_is_waited_for_and_lost_with_its_sessions_when_its_link_goes():
    registry = two_workers()
    hello(registry, C1, session=1, device=0, request=21)  # stays OPENING
    open_session(registry, C2, session=2, device=0)  # OPEN
    registry.from_worker(B, frames(Kind.HEARTBEAT), 3.0)  # B keeps talking
    silence = LIMITS.heartbeat * LIMITS.liveness
    # "a" says nothing past the liveness window (and before the HELLO's open deadline):
    # busy, not dead, while its connection lives.
    for now in (1.0, silence, silence + 0.01, LIMITS.open_timeout - 0.1):
        assert without_heartbeats(registry.tick(now)) == []
    assert set(registry.workers) == {A, B}
    # Its connection closed (libzmq closes it when its ZMTP heartbeats stop): the next
    # heartbeat to it is unroutable.
    sends = registry.unroutable(Side.WORKERS, A, LIMITS.open_timeout - 0.05)

    by_client = {s.identity: decoded(s) for s in sends}
    assert [s.side for s in sends] == [Side.FRONTEND, Side.FRONTEND]
    reject = by_client[C1]
    assert (reject.kind, reject.session, reject.request) == (Kind.REJECT, 1, 21)
    error = error_from_wire(reject.body)
    assert type(error) is HandshakeError
    assert error.details["reason"] == "worker_lost"
    lost = by_client[C2]
    assert (lost.kind, lost.session) == (Kind.ERROR, 2)
    error = error_from_wire(lost.body)
    assert isinstance(error, SessionLost)
    assert error.details == {"device": 0, "worker": "a", "session": 2}

    assert set(registry.workers) == {B}
    assert registry.sessions == {}
    assert [d["worker"] for d in registry.devices] == ["b", "b"]
    assert registry.counters["workers_lost"] == 1
    check_invariants(registry)


def test_a_lost_worker_stops_getting_heartbeats():
    registry = make_registry((A, "a", 1))
    assert kinds(registry.tick(3.5)) == [Kind.HEARTBEAT]  # silent, not lost
    registry.unroutable(Side.WORKERS, A, 3.6)  # lost here
    assert registry.workers == {}
    assert registry.tick(5.0) == []


def test_device_indexes_stay_put_when_workers_come_and_go():
    registry = two_workers()  # "a": device 0; "b": devices 1 and 2
    open_session(registry, C1, session=7, device=2)  # "b" local 1
    hello(registry, C2, session=8, device=1)  # "b" local 0, still opening
    registry.unroutable(Side.WORKERS, A, 1.0)  # "a" goes: its index stays reserved for it
    assert [d["index"] for d in registry.devices] == [1, 2]
    assert registry.device_of(registry.sessions[7])["index"] == 2
    offline = error_from_wire(decoded(hello(registry, C1, session=9, device=0)[0]).body)
    assert offline.code == "device_offline"
    registry.from_worker(b"a-again", register_frames("a", [{}]), 1.0)  # back on index 0
    assert [d["index"] for d in registry.devices] == [0, 1, 2]
    # A new worker whose name sorts first arrives: it gets the next index, nothing moves.
    registry.from_worker(b"worker-0", register_frames("0", [{}]), 1.0)
    check_invariants(registry)
    assert [(d["index"], d["worker"]) for d in registry.devices] == [
        (0, "a"), (1, "b"), (2, "b"), (3, "0")]
    assert registry.device_of(registry.sessions[7])["index"] == 2
    welcome = only(registry.from_worker(B, frames(Kind.OPENED, 8, 1), 1.0), Side.FRONTEND, C2,
                   Kind.WELCOME)
    assert (welcome.body["device"]["index"], welcome.body["device"]["worker"],
            welcome.body["device"]["local"]) == (1, "b", 0)
    # Losing "b" tells both clients, naming each session's device.
    sends = registry.unroutable(Side.WORKERS, B, 2.0)
    details = {s.identity: error_from_wire(decoded(s).body).details for s in sends}
    assert details[C1]["device"] == 2 and details[C2]["device"] == 1
    assert registry.sessions == {}


def test_a_worker_back_with_more_devices_keeps_its_indexes_and_gets_new_ones_after_all():
    registry = make_registry((B, "worker-10", 1), (A, "worker-2", 1))
    registry.unroutable(Side.WORKERS, A, 1.0)
    registry.from_worker(b"worker-2-again", register_frames("worker-2", [{}, {}]), 1.0)
    assert [(d["index"], d["worker"], d["local"]) for d in registry.devices] == [
        (0, "worker-10", 0), (1, "worker-2", 0), (2, "worker-2", 1)]
    # Back with fewer: the index of the missing device stays its, offline.
    registry.unroutable(Side.WORKERS, b"worker-2-again", 2.0)
    registry.from_worker(A, register_frames("worker-2", [{}]), 2.0)
    assert [d["index"] for d in registry.devices] == [0, 1]
    assert registry.device_count == 3
    assert registry.device_slots == {0: ("worker-10", 0), 1: ("worker-2", 0),
                                     2: ("worker-2", 1)}


def test_opening_past_the_open_timeout_is_rejected_and_closed_on_the_worker():
    registry = two_workers()
    hello(registry, C1, session=7, device=1, request=6)
    for now in (3.0, LIMITS.open_timeout):
        registry.from_worker(B, frames(Kind.HEARTBEAT), now)
        registry.from_worker(A, frames(Kind.HEARTBEAT), now)
    assert without_heartbeats(registry.tick(LIMITS.open_timeout)) == []
    sends = without_heartbeats(registry.tick(LIMITS.open_timeout + 0.01))
    assert [(s.side, s.identity) for s in sends] == [(Side.WORKERS, B), (Side.FRONTEND, C1)]
    close, reject = map(decoded, sends)
    assert (close.kind, close.session) == (Kind.CLOSE, 7)
    assert (reject.kind, reject.session, reject.request) == (Kind.REJECT, 7, 6)
    error = error_from_wire(reject.body)
    assert type(error) is HandshakeError
    assert error.details["reason"] == "open_timeout"
    assert_no_session_state(registry)
    assert registry.rejects["open_timeout"] == 1


def keep_workers_alive(registry: Registry, now: float) -> None:
    for identity in list(registry.workers):
        registry.from_worker(identity, frames(Kind.HEARTBEAT), now)


def test_an_idle_client_is_probed_once_per_lease():
    registry = two_workers()
    open_session(registry, C1, session=7)
    for now in range(1, 11):
        keep_workers_alive(registry, float(now))
        registry.tick(float(now))
    keep_workers_alive(registry, 10.5)
    probe = only(without_heartbeats(registry.tick(10.5)), Side.FRONTEND, C1, Kind.PING)
    assert probe.session == 7
    keep_workers_alive(registry, 11.0)
    assert without_heartbeats(registry.tick(11.0)) == []  # probed recently
    assert 7 in registry.sessions  # a probe alone drops nothing


def test_a_client_that_talks_is_not_probed():
    registry = two_workers()
    open_session(registry, C1, session=7)
    registry.from_client(C1, frames(Kind.PING, 0, 1), 6.0)
    keep_workers_alive(registry, 10.5)
    assert without_heartbeats(registry.tick(10.5)) == []


def test_a_client_whose_connection_closed_is_asked_a_scan_later_and_it_alone():
    registry = two_workers()
    open_session(registry, C1, session=1, device=0)
    open_session(registry, C1, session=2, device=1)
    open_session(registry, C2, session=3, device=2)
    keep_workers_alive(registry, 1.0)
    registry.tick(1.0)
    registry.client_connection_closed(C1, 1.1)  # the monitor and the intake: C1's closed
    registry.client_connection_closed(b"no sessions", 1.1)  # (nothing to ask it about)
    assert without_heartbeats(registry.tick(1.25)) == []  # (libzmq may still be at it)
    assert registry.next_deadline() == pytest.approx(1.1 + LIMITS.heartbeat / 4)
    asked = only(without_heartbeats(registry.tick(1.35)), Side.FRONTEND, C1, Kind.PING)
    assert asked.session == 1  # one PING, whatever its sessions
    # The PING to a client whose connection is gone is unroutable: its sessions end. (One
    # that connected again under its routing id takes it, and keeps them.)
    registry.unroutable(Side.FRONTEND, C1, 1.4)
    assert set(registry.sessions) == {3}
    keep_workers_alive(registry, 2.0)
    assert without_heartbeats(registry.tick(2.0)) == []  # asked once


def test_an_unroutable_client_loses_its_sessions_and_they_are_closed_on_workers():
    registry = two_workers()
    open_session(registry, C1, session=1, device=0)
    open_session(registry, C1, session=2, device=1)
    open_session(registry, C2, session=3, device=2)
    sends = registry.unroutable(Side.FRONTEND, C1, 1.0)
    assert sorted((s.side, s.identity, decoded(s).kind, decoded(s).session) for s in sends) == [
        (Side.WORKERS, A, Kind.CLOSE, 1), (Side.WORKERS, B, Kind.CLOSE, 2)]
    assert set(registry.sessions) == {3}
    assert registry.workers[A].sessions == set() and registry.workers[B].sessions == {3}
    check_invariants(registry)


def test_an_unroutable_worker_is_lost():
    registry = two_workers()
    open_session(registry, C1, session=1, device=1)
    sends = registry.unroutable(Side.WORKERS, B, 1.0)
    message = only(sends, Side.FRONTEND, C1, Kind.ERROR)
    assert error_from_wire(message.body).code == SessionLost.code
    assert set(registry.workers) == {A}
    assert registry.sessions == {}
    assert len(registry.devices) == 1


def test_unroutable_unknown_peers_change_nothing():
    registry = two_workers()
    open_session(registry, C1, session=1)
    assert registry.unroutable(Side.WORKERS, b"nobody", 1.0) == []
    assert registry.unroutable(Side.FRONTEND, b"nobody", 1.0) == []
    assert set(registry.workers) == {A, B} and set(registry.sessions) == {1}


# -- device lanes ----------------------------------------------------------------------------

L0, L1 = b"Flane-0", b"Flane-1"  # worker "a"'s two device lanes


def laned_worker(now: float = 0.0) -> Registry:
    """Worker "a" (identity A) with two devices, each on its own lane, both attached."""
    registry = make_registry()
    body = protocol.decode(register_frames("a", [{}, {}])).body
    sends = registry.from_worker(A, frames(Kind.REGISTER, body={**body, "lanes": [L0, L1]}),
                                 now)
    assert kinds(sends) == [Kind.REGISTERED]
    for lane in (L0, L1):
        assert registry.from_worker(lane, frames(Kind.HEARTBEAT), now) == []
    return registry


def test_a_worker_with_lanes_is_online_only_once_every_lane_said_heartbeat():
    registry = make_registry()
    body = protocol.decode(register_frames("a", [{}, {}])).body
    registry.from_worker(A, frames(Kind.REGISTER, body={**body, "lanes": [L0, L1]}), 0.0)
    assert registry.devices == []  # a message to an unattached lane would be unroutable
    rejected(hello(registry, C1, session=7), C1, DeviceOffline)
    registry.from_worker(L0, frames(Kind.HEARTBEAT), 0.0)
    assert registry.devices == []
    registry.from_worker(L1, frames(Kind.HEARTBEAT), 0.0)
    assert [(d["index"], d["worker"], d["local"]) for d in registry.devices] == [
        (0, "a", 0), (1, "a", 1)]


def test_a_sessions_traffic_goes_on_its_devices_lane_both_ways():
    registry = laned_worker()
    opening = only(hello(registry, C1, session=7, device=1), Side.WORKERS, L1, Kind.OPEN)
    only(registry.from_worker(L1, frames(Kind.OPENED, 7, opening.request), 0.0),
         Side.FRONTEND, C1, Kind.WELCOME)
    request = frames(Kind.REQUEST, 7, 3, {"op": "read", "id": 1})
    sends = registry.from_client(C1, request, 1.0)
    assert [(s.side, s.identity) for s in sends] == [(Side.WORKERS, L1)]
    assert sends[0].frames == request
    reply = frames(Kind.REPLY, 7, 3, {"dtype": "<f8", "shape": [1]}, [b"\0" * 8])
    sends = registry.from_worker(L1, reply, 1.0)
    assert [(s.side, s.identity, s.frames) for s in sends] == [(Side.FRONTEND, C1, reply)]
    assert registry.workers[A].last_seen == 1.0  # a lane's traffic is its worker's
    closing = only(registry.from_client(C1, frames(Kind.CLOSE, 7, 4), 2.0),
                   Side.WORKERS, L1, Kind.CLOSE)
    only(registry.from_worker(L1, frames(Kind.CLOSED, 7, closing.request), 2.0),
         Side.FRONTEND, C1, Kind.CLOSED)
    assert_no_session_state(registry)


def test_heartbeats_list_each_lanes_sessions_on_that_lane():
    registry = laned_worker()
    open_session(registry, C1, session=7, device=1)
    open_session(registry, C1, session=8, device=0)
    listed = {s.identity: decoded(s).body["sessions"] for s in registry.tick(0.0)}
    assert listed == {A: [7, 8], L0: [8], L1: [7]}


def test_an_unroutable_lane_loses_its_worker_and_tells_its_clients():
    registry = laned_worker()
    open_session(registry, C1, session=7, device=0)
    message = only(registry.unroutable(Side.WORKERS, L1, 1.0), Side.FRONTEND, C1, Kind.ERROR)
    assert error_from_wire(message.body).code == SessionLost.code
    assert registry.workers == {} and registry.devices == []
    assert registry.unroutable(Side.WORKERS, L0, 1.0) == []  # forgotten with its worker


@pytest.mark.parametrize("lanes", [[L0], [L0, L0], [L0, "text"], [L0, b"\0zero"], [L0, b""],
                                   [L0, A], "lanes"])
def test_lanes_that_cannot_be_routed_are_a_protocol_error(lanes):
    registry = make_registry()
    body = protocol.decode(register_frames("a", [{}, {}])).body
    sends = registry.from_worker(A, frames(Kind.REGISTER, body={**body, "lanes": lanes}), 0.0)
    assert only(sends, Side.WORKERS, A, Kind.ERROR).body["code"] == ProtocolError.code
    assert registry.workers == {}


def test_a_lane_is_not_taken_from_another_worker_nor_registers_itself():
    registry = laned_worker()
    body = protocol.decode(register_frames("b", [{}])).body
    sends = registry.from_worker(B, frames(Kind.REGISTER, body={**body, "lanes": [L0]}), 0.0)
    assert only(sends, Side.WORKERS, B, Kind.ERROR).body["code"] == ProtocolError.code
    sends = registry.from_worker(L0, register_frames("c", [{}]), 0.0)
    assert only(sends, Side.WORKERS, L0, Kind.ERROR).body["code"] == ProtocolError.code
    assert set(registry.workers) == {A} and len(registry.devices) == 2
    # The worker itself, registering again (a broker that forgot it), keeps its lanes.
    body = protocol.decode(register_frames("a", [{}, {}])).body
    sends = registry.from_worker(A, frames(Kind.REGISTER, body={**body, "lanes": [L0, L1]}),
                                 1.0)
    assert kinds(sends) == [Kind.REGISTERED]


def test_shutdown_tells_every_client():
    registry = two_workers()
    open_session(registry, C1, session=1)
    message = only(registry.shutdown(), Side.FRONTEND, C1, Kind.ERROR)
    assert error_from_wire(message.body).code == SessionLost.code


# -- bad input: an ERROR back and a counter, never an exception ----------------------------

_HEADER = protocol.Header(Kind.HELLO, 7, 1).pack()
MALFORMED = {
    "no-frames": [],
    "header-only": [_HEADER],
    "short-header": [b"FB\x00", b"\x80"],
    "wrong-magic": [b"XX" + _HEADER[2:], b"\x80"],
    "unknown-kind": [protocol.HEADER.pack(b"FB", 1, 99, 0, 7, 1), b"\x80"],
    "body-not-msgpack": [_HEADER, b"\xc1"],
    "body-not-a-map": [_HEADER, b"\x93\x01\x02\x03"],
    "hello-missing-token": frames(Kind.HELLO, 7, 1, {"device": 0}),
    "hello-bool-device": frames(Kind.HELLO, 7, 1, {"token": CLIENT_TOKEN, "device": True}),
}


@pytest.mark.parametrize("bad", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_from_a_client(bad):
    registry = two_workers()
    message = only(registry.from_client(C1, bad, 1.0), Side.FRONTEND, C1, Kind.ERROR)
    assert message.body["code"] == ProtocolError.code
    assert message.body["message"]
    assert registry.counters["frontend_protocol_errors"] == 1
    assert_no_session_state(registry)


@pytest.mark.parametrize("bad", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_frames_from_a_registered_worker(bad):
    registry = two_workers()
    message = only(registry.from_worker(A, bad, 1.0), Side.WORKERS, A, Kind.ERROR)
    assert message.body["code"] == ProtocolError.code
    assert registry.counters["workers_protocol_errors"] == 1
    assert set(registry.workers) == {A, B}


@pytest.mark.parametrize("bad", [
    [], [b"junk", b"\x80"],
    register_frames("a", [{}])[:1],
    [register_frames("a", [{}])[0], b"\xc1"],
    frames(Kind.REGISTER, body={"token": WORKER_TOKEN, "name": "a"}),
], ids=["no-frames", "junk-header", "register-header-only", "register-bad-body",
        "register-missing-fields"])
def test_malformed_frames_from_an_unknown_worker(bad):
    registry = make_registry()
    message = only(registry.from_worker(A, bad, 1.0), Side.WORKERS, A, Kind.ERROR)
    assert message.body["code"] == ProtocolError.code
    assert registry.counters["workers_protocol_errors"] == 1
    assert registry.workers == {}


ENDPOINTS = {"frontend": "tcp://127.0.0.1:5555", "workers": "tcp://127.0.0.1:5556"}


@pytest.mark.parametrize("kind", [Kind.REGISTER, Kind.HEARTBEAT])
def test_a_worker_at_the_clients_port_is_refused_naming_the_workers_port(kind):
    registry = two_workers()
    registry.endpoints = ENDPOINTS
    body = {"token": WORKER_TOKEN, "name": "lost", "backend": "numpy", "devices": [{}],
            "max_message_bytes": 1 << 20}
    message = only(registry.from_client(C1, frames(kind, 0, 2, body), 1.0), Side.FRONTEND, C1,
                   Kind.ERROR)
    error = error_from_wire(message.body)
    assert type(error) is WrongPort and error.details["port"] == "clients"
    assert "reached the broker's client port" in error.message
    assert "bound at tcp://127.0.0.1:5556" in error.message  # the workers' port
    assert message.request == 2 and registry.counters["frontend_protocol_errors"] == 1
    assert set(registry.workers) == {A, B}


@pytest.mark.parametrize("kind", [Kind.HELLO, Kind.DEVICES, Kind.ADMIN])
def test_a_client_at_the_workers_port_is_refused_naming_the_client_port(kind):
    registry = two_workers()
    registry.endpoints = ENDPOINTS
    body = {"token": CLIENT_TOKEN, "device": 0, "command": "status", "args": {}}
    message = only(registry.from_worker(b"lost", frames(kind, 7, 2, body), 1.0), Side.WORKERS,
                   b"lost", Kind.ERROR)
    error = error_from_wire(message.body)
    assert type(error) is WrongPort and isinstance(error, ConnectError)
    assert "This is the broker's port for workers" in error.message
    assert "bound at tcp://127.0.0.1:5555" in error.message  # the clients' port
    assert (message.session, message.request) == (7, 2)
    assert registry.counters["unregistered_worker_messages"] == 1
    assert_no_session_state(registry)


def test_a_wrong_port_without_known_endpoints_still_says_which_port_it_is():
    registry = two_workers()  # (a registry made without the bound addresses)
    message = only(registry.from_worker(b"lost", frames(Kind.HELLO, 7, 2, {
        "token": CLIENT_TOKEN, "device": 0}), 1.0), Side.WORKERS, b"lost", Kind.ERROR)
    assert "port for workers" in message.body["message"]
    assert "bound at" not in message.body["message"]


@pytest.mark.parametrize("kind", [Kind.OPENED, Kind.WELCOME])
def test_client_sending_a_kind_it_may_not_send(kind):
    registry = two_workers()
    body = {"token": WORKER_TOKEN, "name": "evil", "backend": "numpy", "devices": [{}],
            "device": {}, "device_count": 1, "server": "s", "heartbeat": 1}
    message = only(registry.from_client(C1, frames(kind, 7, 2, body), 1.0), Side.FRONTEND, C1,
                   Kind.ERROR)
    assert message.body["code"] == ProtocolError.code
    assert kind.name in message.body["message"]
    assert (message.session, message.request) == (7, 2)
    assert set(registry.workers) == {A, B}


@pytest.mark.parametrize("kind", [Kind.HELLO, Kind.DEVICES, Kind.OPEN])
def test_worker_sending_a_kind_it_may_not_send(kind):
    registry = two_workers()
    body = {"token": CLIENT_TOKEN, "device": 0}
    message = only(registry.from_worker(A, frames(kind, 7, 2, body), 1.0), Side.WORKERS, A,
                   Kind.ERROR)
    assert message.body["code"] == ProtocolError.code
    assert_no_session_state(registry)


def test_non_session_client_kind_with_another_version_is_a_protocol_error():
    registry = two_workers()
    sends = registry.from_client(C1, frames(Kind.DEVICES, 0, 1, {}, version=9), 1.0)
    message = only(sends, Side.FRONTEND, C1, Kind.ERROR)
    assert message.body["code"] == ProtocolError.code
    assert message.body["details"]["client_version"] == 9


@pytest.mark.parametrize("kind", [Kind.ERROR, Kind.REJECT, Kind.OPENED, Kind.CLOSED])
def test_registered_worker_speaking_another_version_gets_a_protocol_error(kind):
    registry = two_workers()
    hello(registry, C1, session=7, device=0)
    # Another version's body is not validated, so it must not reach the handlers.
    sends = registry.from_worker(A, frames(kind, 7, 1, {}, version=PROTOCOL_VERSION + 1), 1.0)
    message = only(sends, Side.WORKERS, A, Kind.ERROR)
    assert message.body["code"] == ProtocolError.code
    assert registry.sessions[7].phase == SessionPhase.OPENING


@pytest.mark.parametrize("kind", [Kind.HEARTBEAT, Kind.OPENED, Kind.REPLY, Kind.CLOSED])
def test_unregistered_worker_must_register_first(kind):
    registry = two_workers()
    stranger = b"stranger"
    message = only(registry.from_worker(stranger, frames(kind, 7, 3), 1.0), Side.WORKERS,
                   stranger, Kind.ERROR)
    assert message.body["code"] == ProtocolError.code
    assert message.body["details"] == {"reason": "not_registered"}
    assert (message.session, message.request) == (7, 3)
    assert registry.counters["unregistered_worker_messages"] == 1
    assert stranger not in registry.workers


# -- fuzzing: any sequence of events keeps the registry consistent and never raises --------

_SESSIONS = st.sampled_from([1, 2, 3, 4, 0])  # 1-3 exist at the start, 4 is free
_CODES = st.sampled_from(["session_lost", "remote_error", "device_not_hostable", "nonsense"])
# Mostly what each side really sends, so handshakes complete and workers come and go.
_CLIENT_KINDS = [Kind.HELLO, Kind.HELLO, Kind.SUBMIT, Kind.REQUEST, Kind.CLOSE, Kind.PING,
                 Kind.DEVICES]
_FOREIGN_VERSIONS = [PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1]  # the one before, the next
_WORKER_KINDS = [Kind.OPENED, Kind.OPENED, Kind.CLOSED, Kind.ERROR, Kind.REJECT, Kind.REPLY,
                 Kind.REGISTER, Kind.HEARTBEAT]


def _bodies(kind: Kind):
    if kind == Kind.HELLO:
        return st.fixed_dictionaries({"token": st.sampled_from([CLIENT_TOKEN] * 3 + ["x"]),
                                      "device": st.sampled_from([0, 1, 2, 3, -1])})
    if kind == Kind.REGISTER:
        return st.fixed_dictionaries({
            "token": st.sampled_from([WORKER_TOKEN] * 3 + ["x"]),
            "name": st.sampled_from(["a", "b", "0"]), "backend": st.just("numpy"),
            "devices": st.lists(st.just({}), max_size=3)})
    if kind in (Kind.ERROR, Kind.REJECT):
        return st.fixed_dictionaries({"code": _CODES, "message": st.just("m"),
                                      "details": st.just({})})
    if kind == Kind.DEVICES:
        return st.just({"token": CLIENT_TOKEN})
    return st.just({"device": 0, "device_count": 1, "server": "s", "heartbeat": 1,
                    "devices": [], "token": "x", "name": "n", "backend": "b"})


@st.composite
def events(draw):
    action = draw(st.sampled_from(["client", "client", "worker", "worker", "worker",
                                   "unroutable", "tick"]))
    side_kinds = _CLIENT_KINDS if action == "client" else _WORKER_KINDS
    kind = draw(st.sampled_from(side_kinds) | st.sampled_from(list(Kind)))
    # Mostly valid bodies; {} lacks every required field.
    body = draw(st.sampled_from([True] * 4 + [False]).flatmap(
        lambda valid: _bodies(kind) if valid else st.just({})))
    message = Message(kind, draw(_SESSIONS), draw(st.integers(0, 2)), body,
                      version=draw(st.sampled_from([PROTOCOL_VERSION] * 3 + _FOREIGN_VERSIONS)))
    event_frames = protocol.encode(message)
    if draw(st.integers(0, 9)) == 0:  # sometimes garbage
        event_frames = draw(st.lists(st.binary(max_size=30), max_size=3))
    if action == "client" or action == "unroutable" and draw(st.booleans()):
        identity = draw(st.sampled_from([C1, C2]))
    else:
        identity = draw(st.sampled_from([A, A, B, b"worker-0"]))
    return action, identity, event_frames, draw(st.floats(0, 2))


def _foreign_version(event) -> bool:
    """Whether a drawn event is a well-formed message in a version that is not ours."""
    try:
        return protocol.decode_header(event[2][0]).version != PROTOCOL_VERSION
    except (IndexError, ProtocolError):
        return False


def test_the_fuzz_draws_foreign_versions():
    assert PROTOCOL_VERSION not in _FOREIGN_VERSIONS
    find(events(), _foreign_version, settings=settings(database=None))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events(), min_size=1, max_size=30))
def test_fuzz_event_sequences(sequence):
    # Start with sessions in every state the events can meet: open on each worker, opening.
    registry = make_registry((A, "a", 1), (B, "b", 2))
    open_session(registry, C1, session=1, device=0)
    open_session(registry, C2, session=2, device=1)
    hello(registry, C1, session=3, device=2)
    apply_events(registry, sequence)


def apply_events(registry: Registry, sequence: list, after_each=None) -> None:
    """Feed drawn events to the registry; every answer must decode, every state hold.

    ``after_each(registry, now)`` adds checks of its own after every event."""
    now = 0.0
    for action, identity, event_frames, step in sequence:
        now += step
        if action == "client":
            sends = registry.from_client(identity, event_frames, now)
        elif action == "worker":
            sends = registry.from_worker(identity, event_frames, now)
        elif action == "unroutable":
            side = Side.FRONTEND if identity in (C1, C2) else Side.WORKERS
            sends = registry.unroutable(side, identity, now)
        else:
            sends = registry.tick(now)
        for send in sends:
            assert isinstance(send, Send)
            header = protocol.decode_header(send.frames[0])
            if header.kind not in DATA_KINDS:  # data is forwarded as it came
                protocol.decode(send.frames)
        check_invariants(registry)
        if after_each is not None:
            after_each(registry, now)


# -- a live worker's name is not taken over; one token's share of a device (issue 30) ------


def test_a_registration_under_a_live_workers_name_is_refused_and_changes_nothing():
    registry = two_workers()
    open_session(registry, C1, session=7, device=1)  # on "b"
    registry.from_worker(B, frames(Kind.HEARTBEAT), 2.0)  # "b" lives
    devices_before = registry.devices
    sends = registry.from_worker(b"impostor", register_frames("b", [{}, {}]), 4.5)
    message = only(sends, Side.WORKERS, b"impostor", Kind.REJECT)
    error = error_from_wire(message.body)
    assert type(error) is WorkerNameTaken and error.details["alive_for"] == 3.0
    assert "--name" in error.message
    assert set(registry.workers) == {A, B} and registry.devices == devices_before
    assert registry.sessions[7].phase is SessionPhase.OPEN
    assert registry.rejects[WorkerNameTaken.code] == 1
    # Silent past the bound, "b" still holds its name while its connection lives (busy).
    sends = registry.from_worker(b"impostor", register_frames("b", [{}, {}]), 50.0)
    assert kinds(sends) == [Kind.REJECT]
    # Once its connection is gone, the same registration takes its place, as a restart does.
    assert kinds(registry.unroutable(Side.WORKERS, B, 50.1)) == [Kind.ERROR]
    sends = registry.from_worker(b"impostor", register_frames("b", [{}, {}]), 50.2)
    assert kinds(sends) == [Kind.REGISTERED]
    assert [(d["index"], d["worker"]) for d in registry.devices] == [(0, "a"), (1, "b"), (2, "b")]


def test_the_same_worker_process_reconnected_replaces_its_live_registration_at_once():
    # A broker that stalled may have counted the old connection as live; the process's
    # random instance id shows the newcomer is that same worker, reconnected.
    registry = make_registry()
    body = protocol.decode(register_frames("b", [{}])).body
    registry.from_worker(B, frames(Kind.REGISTER, body={**body, "instance": b"i" * 16}), 0.0)
    again = frames(Kind.REGISTER, body={**body, "instance": b"i" * 16})
    assert kinds(registry.from_worker(b"b-reconnected", again, 1.0)) == [Kind.REGISTERED]
    other = frames(Kind.REGISTER, body={**body, "instance": b"j" * 16})
    rejected_register = registry.from_worker(b"other-process", other, 1.5)
    assert type(error_from_wire(decoded(rejected_register[0]).body)) is WorkerNameTaken
    without = frames(Kind.REGISTER, body=body)  # no instance id never matches one
    assert kinds(registry.from_worker(b"no-instance", without, 1.5)) == [Kind.REJECT]
    assert set(registry.workers) == {b"b-reconnected"}
    assert [d["index"] for d in registry.devices] == [0]


def _two_tokens(per_device: int, per_token: int | None = None) -> Registry:
    limits = Limits(heartbeat=1.0, liveness=3, max_sessions_per_device=per_device,
                    max_sessions_per_token=per_token)
    registry = Registry(client_token=[CLIENT_TOKEN, "other-team-token"],
                        worker_token=WORKER_TOKEN, limits=limits)
    registry.from_worker(A, register_frames("a", [{}, {}]), 0.0)
    return registry


def test_one_client_token_holds_at_most_its_share_of_a_device_over_any_connections():
    registry = _two_tokens(per_device=4)  # two tokens: 2 sessions each by default
    assert kinds(hello(registry, C1, session=1)) == [Kind.OPEN]
    assert kinds(hello(registry, C2, session=2)) == [Kind.OPEN]  # another connection
    _, error = rejected(hello(registry, b"client-3", session=3), b"client-3", TooManySessions)
    assert error.details == {"reason": "per_token", "device": 0, "limit": 2}
    assert "--max-sessions-per-token 2" in error.message and "token of your own" in error.message
    # The other token's holders still get in; the same token still gets another device.
    assert kinds(hello(registry, b"client-4", session=4, token="other-team-token")) == [
        Kind.OPEN]
    assert kinds(hello(registry, C1, session=5, device=1)) == [Kind.OPEN]
    # A slot freed by a close is the token's again.
    registry.from_client(C1, frames(Kind.CLOSE, 1, 9), 1.0)
    registry.from_worker(A, frames(Kind.CLOSED, 1, 9), 1.0)
    assert kinds(hello(registry, b"client-3", session=3)) == [Kind.OPEN]
    check_invariants(registry)


def test_the_per_token_cap_is_the_device_limit_shared_among_tokens_unless_set():
    assert Limits(max_sessions_per_device=1024).sessions_per_token(1) == 1024
    assert Limits(max_sessions_per_device=1024).sessions_per_token(3) == 341
    assert Limits(max_sessions_per_device=2).sessions_per_token(5) == 1
    assert Limits(max_sessions_per_token=7).sessions_per_token(3) == 7
    registry = _two_tokens(per_device=4, per_token=3)
    for session in (1, 2, 3):
        assert kinds(hello(registry, C1, session=session)) == [Kind.OPEN]
    rejected(hello(registry, C2, session=4), C2, TooManySessions)


def test_every_client_token_is_accepted_and_a_wrong_one_refused():
    registry = _two_tokens(per_device=4)
    for token in (CLIENT_TOKEN, "other-team-token"):
        sends = registry.from_client(C1, frames(Kind.DEVICES, 0, 1, {"token": token}), 0.0)
        assert kinds(sends) == [Kind.DEVICE_LIST]
    rejected(hello(registry, C1, session=1, token="other-team-toke"), C1, AuthenticationError)
