"""ZeroMQ's authentication protocol (ZAP, RFC 27), sans I/O: the request libzmq sends while a
peer's ZeroMQ handshake is under way, and the reply that lets the connection in or refuses it.

Rule: ``ZapGate`` answers each request sans I/O: who gets in is decided by
``broker.handshake.handshake_role``; a refusal is counted with the registry's rejections,
logged through its rate limit by the peer's address, and held back like a refused HELLO. The
broker's I/O loop binds a ROUTER at ``ZAP_ENDPOINT`` on its own context, so the frames here
start with the empty delimiter that follows the ROUTER's routing frame (which the loop splits
off).

Why the broker answers ZAP itself rather than through ``zmq.auth``: a refusal must wait
``Limits.auth_delay`` without stalling the other handshakes (``zmq.auth``'s handler answers in
order, one at a time), and the refusals are counted and logged with the registry's own.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable, Mapping, Sequence

from fabric.core.errors import AuthenticationError
from fabric.core.security import WORKERS_DOMAIN
from fabric.core.zap_messages import ALLOWED, FAILED, REFUSED, parse_request, reply

from .handshake import handshake_role
from .model import Send, Side

class ZapGate:
    """The broker's answers to libzmq's ZAP requests, for both its sockets."""

    def __init__(self, tokens: Mapping[str, Sequence[bytes]],
                 curve_keys: Mapping[str, frozenset[bytes]] | None, rejects: Counter[str],
                 log_peer: Callable[..., None],
                 held: Callable[[list[Send], float], list[Send]]) -> None:
        self.tokens = tokens  # per role, the tokens that admit a PLAIN peer
        self.curve_keys = curve_keys  # with CURVE, per ZAP domain, the keys that admit a peer
        self.rejects = rejects
        self.log_peer = log_peer  # the registry's rate-limited log of what peers cause
        self.held = held  # the registry's hold on a refused token's answer

    def answer(self, identity: bytes, frames: Sequence[Any], now: float) -> list[Send]:
        """Whether a peer may finish connecting: allowed with its role as the connection's
        User-Id, or refused ``auth_delay`` later, counted and logged."""
        try:
            request = parse_request(frames)
        except ValueError:  # only libzmq writes here; answered so no handshake waits on it
            self.rejects["zap_malformed"] += 1
            return [Send(Side.ZAP, identity, reply(b"", FAILED, "malformed request"))]
        role = handshake_role(request.domain, request.mechanism, request.credentials,
                              self.tokens, self.curve_keys)
        if role is not None:
            return [Send(Side.ZAP, identity, reply(request.request_id, ALLOWED, "OK", role))]
        peers = "worker" if request.domain == WORKERS_DOMAIN else "client"
        if self.curve_keys is None:
            reason, what = AuthenticationError.code, "no token of this broker"
        else:
            reason, what = f"{peers}_key_refused", "a CURVE key not in its allow list"
        self.rejects[reason] += 1
        self.log_peer(logging.WARNING, f"refused a connection to the {peers}s' socket ({what})",
                      request.address, now)
        return self.held([Send(Side.ZAP, identity, reply(request.request_id, REFUSED,
                                                         "refused"))], now)
