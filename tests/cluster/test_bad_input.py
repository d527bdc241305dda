"""End-to-end: malformed and misdirected messages from raw zmq peers against the real broker.

Each bad message gets a typed ERROR or REJECT answer where the broker can answer (decoded
here, code checked), the broker keeps running, and afterwards a well-behaved client still
opens a session and syncs on both devices.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import assert_broker_serves
from rawpeers import RawDealer, frames_of

import fabric
from fabric.core import protocol
from fabric.core.errors import error_from_wire
from fabric.core.protocol import HEADER_SIZE, MAGIC, PROTOCOL_VERSION, Header, Kind, Message

GOOD_HEADER = Header(Kind.DEVICES, session=7, request=9).pack()
GOOD_BODY = protocol.pack_body({"token": "x"})


def _welcome_body() -> dict:
    return {"device": {}, "device_count": 1, "server": "me", "heartbeat": 1.0}


# (name, frames) sent on the frontend; every one is answered with ERROR protocol_error.
FRONTEND_GARBAGE = [
    ("single frame", [GOOD_HEADER]),
    ("empty frame", [b""]),
    ("garbage header", [b"GET / HTTP/1.1\r\n\r\n", GOOD_BODY]),
    ("wrong magic", [b"XX" + GOOD_HEADER[2:], GOOD_BODY]),
    ("truncated header", [GOOD_HEADER[:-1], GOOD_BODY]),
    ("oversized header", [GOOD_HEADER + b"\0", GOOD_BODY]),
    ("unknown kind", [GOOD_HEADER[:4] + bytes([99]) + GOOD_HEADER[5:], GOOD_BODY]),
    ("garbage body", [GOOD_HEADER, b"\xc1\xff\x00 not msgpack"]),
    ("body not a map", [GOOD_HEADER, protocol.pack_body([1, 2, 3])]),  # type: ignore[arg-type]
    ("hello missing token", frames_of(Kind.HELLO, {"device": 0}, session=5, request=9)),
    ("hello device not int", frames_of(Kind.HELLO, {"token": "t", "device": "0"},
                                       session=5, request=9)),
    ("welcome from a client", frames_of(Kind.WELCOME, _welcome_body(), session=5,
                                        request=9)),
    ("registered from a client", frames_of(Kind.REGISTERED, {"server": "s", "heartbeat": 1},
                                           request=9)),
    ("devices of another version", frames_of(Kind.DEVICES, {"token": "x"}, request=9,
                                             version=PROTOCOL_VERSION + 1)),
]


def test_the_garbage_is_what_it_says():
    header = FRONTEND_GARBAGE[6][1][0]
    assert len(header) == HEADER_SIZE and header[:2] == MAGIC and header[4] == 99


def _protocol_error_for(peer: RawDealer, name: str, frames: list) -> Message:
    """Send one malformed message; its answer, checked to be a ProtocolError that says
    something."""
    peer.send(frames)
    answer = peer.recv_message(timeout=2)
    assert answer.kind == Kind.ERROR, name
    error = error_from_wire(answer.body)
    assert type(error) is fabric.ProtocolError, (name, answer.body)
    assert error.message, name
    return answer


def test_malformed_frontend_messages_get_protocol_errors(cluster):
    with RawDealer(cluster.address, cluster.token) as dealer:
        for name, frames in FRONTEND_GARBAGE:
            answer = _protocol_error_for(dealer, name, frames)
            # Where the header could be read, the answer names the request it answers.
            if len(frames) == 2 and len(frames[0]) == HEADER_SIZE and frames[0][:2] == MAGIC \
                    and frames[0][4] != 99:
                assert answer.request == protocol.decode_header(frames[0]).request, name
        # The same socket is still served after all of it.
        dealer.send(frames_of(Kind.DEVICES, {"token": cluster.token}, request=77))
        listing = dealer.recv_message(timeout=2)
        assert listing.kind == Kind.DEVICE_LIST and listing.request == 77
        assert len(listing.body["devices"]) == 2
    assert_broker_serves(cluster)


def test_a_client_given_a_bad_device_fails_fast_at_the_call(cluster):
    # Refused before any traffic (issue 23: before, the broker refused the HELLO as malformed).
    # The broker's own answer to such a HELLO, on its request id, is FRONTEND_GARBAGE's
    # "hello device not int", sent by a raw peer.
    started = time.monotonic()
    with pytest.raises(TypeError) as info:
        fabric.connect(cluster.address, token=cluster.token, device="0", timeout=10)
    assert time.monotonic() - started < 1.0
    assert "device=" in str(info.value)
    assert_broker_serves(cluster)


def test_messages_for_sessions_that_do_not_exist_get_session_lost(cluster):
    with RawDealer(cluster.address, cluster.token) as dealer:
        for kind in (Kind.SUBMIT, Kind.REQUEST):
            dealer.send([Header(kind, session=0xBAD, request=3).pack(), b"never decoded"])
            answer = dealer.recv_message(timeout=2)
            assert answer.kind == Kind.ERROR
            assert (answer.session, answer.request) == (0xBAD, 3)
            assert error_from_wire(answer.body).code == "session_lost"
        for kind in (Kind.REPLY, Kind.TRANSFER):  # worker kinds are refused from a client
            dealer.send(frames_of(kind, session=0xBAD, request=5))
            answer = dealer.recv_message(timeout=2)
            assert (answer.kind, answer.request) == (Kind.ERROR, 5)
            assert error_from_wire(answer.body).code == "protocol_error"
        dealer.send(frames_of(Kind.CLOSE, session=0xBAD, request=4))
        answer = dealer.recv_message(timeout=2)
        assert answer.kind == Kind.ERROR and answer.request == 4
        assert error_from_wire(answer.body).code == "session_lost"
    assert_broker_serves(cluster)


def test_a_client_cannot_reach_into_another_clients_session(cluster):
    with cluster.connect(device=0, timeout=5) as session, \
            RawDealer(cluster.address, cluster.token) as thief:
        thief.send([Header(Kind.REQUEST, session=session.id, request=1).pack(),
                    protocol.pack_body({"op": "sync"})])
        answer = thief.recv_message(timeout=2)
        assert answer.kind == Kind.ERROR
        assert error_from_wire(answer.body).code == "session_lost"
        thief.send(frames_of(Kind.CLOSE, session=session.id, request=2))
        answer = thief.recv_message(timeout=2)
        assert error_from_wire(answer.body).code == "session_lost"
        session.sync()  # still open for its owner
    assert_broker_serves(cluster)


_register_body = {"token": "", "name": "impostor", "backend": "numpy", "devices": [{}]}

# (name, frames) sent on the workers' socket by a peer that never registered.
WORKERS_GARBAGE = [
    ("single frame", [Header(Kind.OPENED, session=7, request=9).pack()]),
    ("garbage header", [b"\x00" * 3, GOOD_BODY]),
    ("wrong magic", [b"XX" + GOOD_HEADER[2:], GOOD_BODY]),
    ("truncated header", [GOOD_HEADER[:-1], GOOD_BODY]),
    ("oversized header", [GOOD_HEADER + b"\0", GOOD_BODY]),
    ("unknown kind", [GOOD_HEADER[:4] + bytes([99]) + GOOD_HEADER[5:], GOOD_BODY]),
    ("register with garbage body", [Header(Kind.REGISTER, request=9).pack(), b"\xc1"]),
    ("register missing fields", frames_of(Kind.REGISTER, {"token": "x"}, request=9)),
]


@pytest.mark.parametrize("kind", [Kind.HEARTBEAT, Kind.OPENED, Kind.CLOSED, Kind.REPLY,
                                  Kind.ERROR])
def test_worker_messages_from_an_unregistered_worker_are_refused(cluster, kind):
    with RawDealer(cluster.worker_address, cluster.worker_token) as stranger:
        stranger.send(frames_of(kind, {}, session=0x51, request=6))
        answer = stranger.recv_message(timeout=2)
        assert answer.kind == Kind.ERROR
        assert (answer.session, answer.request) == (0x51, 6)
        error = error_from_wire(answer.body)
        assert type(error) is fabric.ProtocolError
        assert error.details.get("reason") == "not_registered"
        assert "send REGISTER first" in error.message
    assert_broker_serves(cluster)


def test_malformed_messages_on_the_workers_socket_get_protocol_errors(cluster):
    with RawDealer(cluster.worker_address, cluster.worker_token) as stranger:
        for name, frames in WORKERS_GARBAGE:
            _protocol_error_for(stranger, name, frames)
    assert_broker_serves(cluster)


@pytest.mark.parametrize("case", ["wrong token", "empty token", "other version",
                                  "devices not maps"])
def test_bad_registrations_are_refused(cluster, case):
    body = dict(_register_body, token="wrong-worker-token")
    version, expected_kind, expected_code = PROTOCOL_VERSION, Kind.REJECT, "unauthorized"
    if case == "empty token":
        body["token"] = ""
    elif case == "other version":
        body["token"] = cluster.worker_token
        version, expected_code = PROTOCOL_VERSION + 1, "version_mismatch"
    elif case == "devices not maps":
        body.update(token=cluster.worker_token, devices=[1, 2])
        expected_kind, expected_code = Kind.ERROR, "protocol_error"
    with RawDealer(cluster.worker_address, cluster.worker_token) as impostor:
        impostor.send(frames_of(Kind.REGISTER, body, request=3, version=version))
        answer = impostor.recv_message(timeout=2)
        assert answer.kind == expected_kind
        assert error_from_wire(answer.body).code == expected_code
        # Still a stranger: nothing it sends is taken as a registered worker's.
        impostor.send(frames_of(Kind.HEARTBEAT, {}, request=4))
        answer = impostor.recv_message(timeout=2)
        assert error_from_wire(answer.body).details.get("reason") == "not_registered"
    listed = fabric.devices(cluster.address, token=cluster.token)
    assert "impostor" not in {d.worker for d in listed}
    assert_broker_serves(cluster)


def test_a_client_cannot_speak_on_the_workers_socket_nor_a_worker_on_the_frontend(cluster):
    # A HELLO sent to the workers' socket, or a REGISTER sent to the frontend, is refused as
    # coming to the wrong port (a client or worker given the wrong address), naming the right
    # one.
    with RawDealer(cluster.worker_address, cluster.token) as lost_client:
        lost_client.send(frames_of(Kind.HELLO, {"token": cluster.token, "device": 0},
                                   session=0x77, request=1))
        answer = lost_client.recv_message(timeout=2)
        assert answer.kind == Kind.ERROR and (answer.session, answer.request) == (0x77, 1)
        assert error_from_wire(answer.body).code == "wrong_port"
        assert cluster.address in answer.body["message"]
    with RawDealer(cluster.address, cluster.worker_token) as lost_worker:
        lost_worker.send(frames_of(Kind.REGISTER, dict(_register_body,
                                                       token=cluster.worker_token), request=1))
        answer = lost_worker.recv_message(timeout=2)
        assert answer.kind == Kind.ERROR and answer.request == 1
        assert error_from_wire(answer.body).code == "wrong_port"
        assert cluster.worker_address in answer.body["message"]
    assert_broker_serves(cluster)


def test_well_behaved_clients_are_served_after_a_flood_of_garbage(cluster):
    with RawDealer(cluster.address, cluster.token) as front, \
            RawDealer(cluster.worker_address, cluster.worker_token) as back:
        for _ in range(20):
            for _, frames in FRONTEND_GARBAGE:
                front.send(frames)
            for _, frames in WORKERS_GARBAGE:
                back.send(frames)
        answers = 0
        try:
            while True:
                front.recv(timeout=0.5)
                answers += 1
        except AssertionError:
            pass
        assert answers == 20 * len(FRONTEND_GARBAGE)
    assert_broker_serves(cluster)


def test_ids_that_are_not_ints_are_refused_and_the_device_serves_on(cluster):
    session = 0x5B17
    with RawDealer(cluster.address, cluster.token) as raw:
        raw.send(frames_of(Kind.HELLO, {"token": cluster.token, "device": 0}, session=session,
                           request=1))
        assert raw.recv_message(timeout=5).kind == Kind.WELCOME
        ones = {"shape": [3], "dtype": "<f8"}
        raw.send_message(Message(Kind.SUBMIT, session, body={
            "ops": [["ones", 1, [], ones], ["ones", 2, [], ones]]}))
        raw.send_message(Message(Kind.SUBMIT, session, body={"ops": [[1], 2, {"a": 1}]}))
        raw.send_message(Message(Kind.REQUEST, session, 2, {"op": "sync"}))
        synced = raw.recv_until(lambda m: m.request == 2, timeout=10)
        assert error_from_wire(synced.body["error"]).code == "protocol_error"
        for request, tensor in ((3, 1), (4, 2)):  # 1 kept, 2 freed: the device still serves
            raw.send_message(Message(Kind.REQUEST, session, request,
                                     {"op": "read", "id": tensor, **ones}))
        kept = raw.recv_until(lambda m: m.request == 3, timeout=10)
        assert np.frombuffer(kept.buffers[0], "<f8").tolist() == [1.0, 1.0, 1.0]
        freed = raw.recv_until(lambda m: m.request == 4, timeout=10)
        assert error_from_wire(freed.body["error"]).code == "protocol_error"
        # Requests naming no op, or a tensor by what is not an id: refused, and it serves on.
        for request, body in enumerate([{"op": []}, {"op": "await", "id": []},
                                        {"op": "read", "id": {"a": 1}, **ones}], 5):
            raw.send_message(Message(Kind.REQUEST, session, request, body))
            refused = raw.recv_until(lambda m, r=request: m.request == r, timeout=10)
            wire = refused.body.get("error", refused.body)  # (an op not a str: an ERROR)
            assert error_from_wire(wire).code == "protocol_error", body
        raw.send_message(Message(Kind.REQUEST, session, 9, {"op": "read", "id": 1, **ones}))
        assert raw.recv_until(lambda m: m.request == 9, timeout=10).buffers
    assert_broker_serves(cluster)
