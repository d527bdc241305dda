"""ZeroMQ's authentication protocol (ZAP, RFC 27), sans I/O: the request libzmq sends while a
peer's ZeroMQ handshake is under way, and the reply that lets the connection in or refuses it.
Whoever answers (the broker's ``ZapGate``, a worker's direct links) binds a ROUTER at
``ZAP_ENDPOINT`` on its own context; the frames here follow that ROUTER's routing frame.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq sends a context's ZAP requests
_VERSION = b"1.0"
_FIXED_FRAMES = 7  # delimiter, version, request id, domain, address, identity, mechanism

# RFC 27's status codes.
ALLOWED = b"200"
REFUSED = b"400"
FAILED = b"500"  # the request itself was malformed


class ZapRequest(NamedTuple):
    """What libzmq asks about one connecting peer."""

    request_id: bytes
    domain: str  # the ZAP domain of the socket the peer connects to
    address: str  # the peer's address (an IP for tcp://)
    mechanism: str  # "PLAIN", "CURVE" or "NULL"
    credentials: tuple[bytes, ...]  # PLAIN: username, password; CURVE: the 32-byte public key


def parse_request(frames: Sequence[Any]) -> ZapRequest:
    """The request in ``frames`` (after the routing frame); ValueError when malformed."""
    parts = [bytes(frame) for frame in frames]
    if len(parts) < _FIXED_FRAMES or parts[0] != b"" or parts[1] != _VERSION:
        raise ValueError("not a ZAP 1.0 request")
    _, _, request_id, domain, address, _identity, mechanism, *credentials = parts
    return ZapRequest(request_id, domain.decode("utf-8", "replace"),
                      address.decode("utf-8", "replace"), mechanism.decode("ascii", "replace"),
                      tuple(credentials))


def reply(request_id: bytes, status: bytes, text: str, user_id: str = "") -> list[bytes]:
    """The reply frames (after the routing frame): ``status`` is ``ALLOWED``, ``REFUSED`` or
    ``FAILED``; ``user_id`` becomes the connection's User-Id property."""
    return [b"", _VERSION, request_id, status, text.encode(), user_id.encode(), b""]
