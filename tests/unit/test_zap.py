"""The broker's first gate, sans I/O: ZAP frames (``broker.zap_gate``), who is admitted
(``broker.handshake.handshake_role``) and the answers (``ZapGate``, the registry's).
The same gate against real processes and raw attackers: ``test_routing_ids.py``."""

from __future__ import annotations

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from test_registry import CLIENT_TOKEN, LIMITS, SERVER, WORKER_TOKEN

from fabric.broker.handshake import handshake_role
from fabric.broker.model import Side
from fabric.broker.registry import Registry
from fabric.core import zap_messages
from fabric.core.security import FRONTEND_DOMAIN, WORKERS_DOMAIN
from fabric.core.zap_messages import ZapRequest

ADMIN_TOKEN = "admin-secret-token"
TOKENS = {"client": [CLIENT_TOKEN.encode()], "worker": [WORKER_TOKEN.encode()],
          "admin": [ADMIN_TOKEN.encode()]}


def request_frames(mechanism: bytes, *credentials: bytes, domain: str = FRONTEND_DOMAIN,
                   request_id: bytes = b"7") -> list[bytes]:
    """What libzmq sends a ZAP handler bound as a ROUTER, after the routing frame."""
    return [b"", b"1.0", request_id, domain.encode(), b"127.0.0.1", b"", mechanism,
            *credentials]


def role_of(request: ZapRequest, curve_keys: dict | None) -> str | None:
    return handshake_role(request.domain, request.mechanism, request.credentials, TOKENS,
                          curve_keys)


def plain(password: str, domain: str = FRONTEND_DOMAIN) -> ZapRequest:
    return zap_messages.parse_request(request_frames(b"PLAIN", b"client", password.encode(),
                                            domain=domain))


def test_requests_are_read_and_replies_built_as_rfc_27_lays_them_out():
    request = zap_messages.parse_request(request_frames(b"PLAIN", b"user", b"pass", request_id=b"42"))
    assert request == ZapRequest(b"42", FRONTEND_DOMAIN, "127.0.0.1", "PLAIN",
                                     (b"user", b"pass"))
    assert zap_messages.reply(b"42", zap_messages.ALLOWED, "OK", "client") == [
        b"", b"1.0", b"42", b"200", b"OK", b"client", b""]


@pytest.mark.parametrize("frames", [
    [], [b""], [b"x", b"1.0", b"1", b"d", b"a", b"", b"PLAIN"],  # no delimiter
    [b"", b"2.0", b"1", b"d", b"a", b"", b"PLAIN"],  # another version
    [b"", b"1.0", b"1", b"d", b"a", b""],  # no mechanism
])
def test_malformed_requests_are_refused_as_such(frames):
    with pytest.raises(ValueError):
        zap_messages.parse_request(frames)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40), max_size=10))
def test_any_frames_parse_or_raise_value_error(frames):
    try:
        zap_messages.parse_request(frames)
    except ValueError:
        pass


def test_every_token_of_the_broker_is_admitted_on_either_socket_with_its_role():
    for domain in (FRONTEND_DOMAIN, WORKERS_DOMAIN):
        assert role_of(plain(CLIENT_TOKEN, domain), None) == "client"
        assert role_of(plain(WORKER_TOKEN, domain), None) == "worker"
        assert role_of(plain(ADMIN_TOKEN, domain), None) == "admin"


@pytest.mark.parametrize("request_", [
    plain("not a token"), plain(""), plain(CLIENT_TOKEN + " "), plain(CLIENT_TOKEN[:-1]),
    zap_messages.parse_request(request_frames(b"NULL")),
    zap_messages.parse_request(request_frames(b"PLAIN", CLIENT_TOKEN.encode())),  # one credential
    zap_messages.parse_request(request_frames(b"CURVE", bytes(32))),  # CURVE where there is none
], ids=["wrong", "empty", "padded", "prefix", "null", "no-password", "curve"])
def test_a_peer_without_a_token_is_refused(request_):
    assert role_of(request_, None) is None


def test_with_curve_only_the_keys_of_the_sockets_allow_list_get_in():
    client_public, _ = zmq.curve_keypair()
    worker_public, _ = zmq.curve_keypair()
    lists = {FRONTEND_DOMAIN: frozenset({client_public}),
             WORKERS_DOMAIN: frozenset({worker_public})}

    def curve(key: bytes, domain: str) -> ZapRequest:
        return zap_messages.parse_request(request_frames(b"CURVE", zmq.utils.z85.decode(key),
                                                domain=domain))

    assert role_of(curve(client_public, FRONTEND_DOMAIN), lists) == "client"
    assert role_of(curve(worker_public, WORKERS_DOMAIN), lists) == "worker"
    assert role_of(curve(worker_public, FRONTEND_DOMAIN), lists) is None
    assert role_of(curve(client_public, WORKERS_DOMAIN), lists) is None
    assert role_of(plain(CLIENT_TOKEN), lists) is None  # a token is no key


def test_the_registry_admits_at_once_and_refuses_late_counted_and_logged(caplog):
    registry = Registry(client_token=CLIENT_TOKEN, worker_token=WORKER_TOKEN,
                        admin_token=ADMIN_TOKEN, server=SERVER, limits=LIMITS)
    [admitted] = registry.zap.answer(b"pipe-1", request_frames(
        b"PLAIN", b"client", CLIENT_TOKEN.encode()), now=1.0)
    allowed = zap_messages.reply(b"7", zap_messages.ALLOWED, "OK", "client")
    assert admitted == (Side.ZAP, b"pipe-1", allowed, 0.0)
    with caplog.at_level("WARNING", logger="fabric.broker"):
        [refused] = registry.zap.answer(b"pipe-2", request_frames(
            b"PLAIN", b"client", b"guess"), now=2.0)
    assert refused.frames[3] == zap_messages.REFUSED
    assert refused.not_before == 2.0 + LIMITS.auth_delay  # held back, like a refused HELLO
    assert registry.rejects["unauthorized"] == 1
    assert registry.counters["tokens_refused"] == 1
    assert "127.0.0.1" in caplog.text and "guess" not in caplog.text
    [failed] = registry.zap.answer(b"pipe-3", [b"junk"], now=3.0)
    assert failed.frames[3] == zap_messages.FAILED and failed.not_before == 0.0
    assert registry.rejects["zap_malformed"] == 1
