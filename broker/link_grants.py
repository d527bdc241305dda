"""Direct links to workers, the broker's part, sans I/O: granting a large TRANSFER a
worker-to-worker link, or a client's large upload a link to its session's worker
(``workers.direct_links`` owns the rest).

Rule: a link is granted only where the message itself would be routed (the asking worker
owns the source session, or the asking client the session; the destination session is
open), to a worker (another, for a worker) that said where its bulk endpoint is and takes a
frame that large. The receiver is told whether a client asks (its link may carry a read of
its own session) or a worker (a TRANSFER only). The grant is a fresh random
ticket told to the receiver (``LINK_EXPECT``, for that destination session) and, with the
receiver's endpoint, to the sender (``LINK_GRANT``); the broker keeps nothing of it. Anything
else is answered with an empty LINK_GRANT: the TRANSFER then takes the broker, as before.
"""

from __future__ import annotations

import secrets
from typing import Any

from fabric.core.protocol import Kind, Message

from .model import Send, SessionPhase, Side, Worker, send_message

TICKET_BYTES = 32


def reported_bulk(body: dict[str, Any]) -> dict[str, Any] | None:
    """The bulk endpoint a REGISTER names (address, and a CURVE public key), or None where it
    names none or nonsense."""
    bulk = body.get("bulk")
    if not isinstance(bulk, dict):
        return None
    address, key = bulk.get("address"), bulk.get("public_key")
    if not (isinstance(address, str) and address.startswith("tcp://") and len(address) < 300
            and (key is None or isinstance(key, bytes) and len(key) == 40)):
        return None
    return {"address": address, **({"public_key": key} if key is not None else {})}


def grant(registry: Any, worker: Worker, message: Message, now: float) -> list[Send]:
    """A worker's LINK request, for a TRANSFER from its session ``source`` to another worker's
    session: the two grants, or an empty LINK_GRANT (take the broker)."""
    source = registry.sessions.get(message.body["source"])
    receiver = _receiver(registry, message.session)
    if source is None or source.worker != worker.identity or receiver is worker:
        receiver = None
    return _grant(registry, Side.WORKERS, worker.identity, receiver, message)


def grant_to_client(registry: Any, identity: bytes, message: Message,
                    now: float) -> list[Send]:
    """A client's LINK request, for an upload to its own session's worker."""
    session = registry.sessions.get(message.session)
    receiver = _receiver(registry, message.session) if (
        session is not None and session.client == identity) else None
    return _grant(registry, Side.FRONTEND, identity, receiver, message)


def _receiver(registry: Any, session_id: int) -> Worker | None:
    """The worker of open session ``session_id``, if any."""
    session = registry.sessions.get(session_id)
    if session is None or session.phase is not SessionPhase.OPEN:
        return None
    return registry.workers.get(session.worker)


def _grant(registry: Any, side: Side, asker: bytes, receiver: Worker | None,
           message: Message) -> list[Send]:
    answer = Message(Kind.LINK_GRANT, message.session, message.request)
    if (receiver is None or receiver.bulk is None
            or message.body["nbytes"] > receiver.max_message_bytes):
        registry.counters["links_refused"] += 1
        return [send_message(side, asker, answer)]
    registry.counters["links_granted"] += 1
    ticket = secrets.token_bytes(TICKET_BYTES)
    return [send_message(Side.WORKERS, receiver.identity, Message(
                Kind.LINK_EXPECT, message.session, 0,
                {"ticket": ticket, "client": side is Side.FRONTEND})),
            send_message(side, asker, answer._replace(
                body={**receiver.bulk, "ticket": ticket}))]
