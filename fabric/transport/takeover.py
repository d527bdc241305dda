"""A client's side of a broker takeover: its connection lost the active broker of a pair, so
it resumes each of its sessions on the broker that takes over and sends again what had no
answer (``fabric.core.resume``, ``fabric.transport.unanswered``).

Rule: the takeover runs in the thread that uses the connection, inside the wait that saw
the connection end, and within ``TAKEOVER_LIMIT`` seconds: the pair's brokers are tried in
turn (``fabric.transport.failover.first_active``: a passive or settling one again until the
limit) over a fresh connection, which, once the broker took up the sessions, becomes the
connection's own. A session that cannot be resumed (its worker died too, its grace expired)
is lost with the ``ResumeRefused`` that names why; a takeover that does not complete in time
loses every session with a ``SessionLost`` saying so. Nothing waits past its deadline.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fabric.core.errors import FabricError, ResumeRefused, SessionLost, error_from_wire
from fabric.core.protocol import Kind, Message
from fabric.core.session_life import OPEN
from fabric.transport.failover import first_active

log = logging.getLogger("fabric.client")

TAKEOVER_LIMIT = 30.0  # seconds a takeover may take before the sessions are lost


def take_over(connection: Any) -> None:
    """Resume ``connection``'s sessions on the other broker of its pair (see the rule)."""
    keys = {session: secret for session, secret in connection.resume_keys.items()
            if connection.life.sessions.get(session) is not None
            and connection.life.sessions[session].phase is OPEN}
    started = time.monotonic()
    lost = connection.address
    others = connection.brokers[connection.brokers.index(lost) + 1:] + \
        connection.brokers[:connection.brokers.index(lost) + 1]

    def attempt(address: str, seconds: float) -> tuple[Any, dict[int, Any]]:
        fresh = connection.sibling(address, handshake_limit=min(seconds, 1.5))
        try:
            answers = {}
            for session, secret in keys.items():
                reply = fresh.request(Message(Kind.RESUME, session, body={
                    "token": connection.token, "secret": secret,
                    "max_message_bytes": connection.max_message_bytes}), seconds)
                if reply.kind == Kind.RESUMED:
                    answers[session] = reply
                    continue
                error = error_from_wire(reply.body)
                if not isinstance(error, ResumeRefused):
                    raise error  # (passive, settling, unreachable: the next broker)
                answers[session] = error
            return fresh, answers
        except BaseException:
            fresh.close()
            raise

    try:
        fresh, answers = first_active(others, TAKEOVER_LIMIT, attempt)
    except FabricError as exc:
        connection.life.lose(SessionLost(
            f"The broker at {lost} was lost and no broker of its pair took its sessions up "
            f"within {TAKEOVER_LIMIT:g} s ({exc.message.rstrip('.')}). Open a new session "
            "once a broker serves.", reason="takeover_failed"))
        return
    connection.adopt(fresh)
    for session in connection.life.sessions:
        answer = answers.get(session)
        if answer is None:
            connection.lose_session(session, SessionLost(
                f"Session {session:#x} cannot be resumed: the broker at {lost} was lost and "
                "the session has no resume secret. Open a new session.",
                session=session, reason="no_secret"))
        elif isinstance(answer, FabricError):
            connection.lose_session(session, answer)
        else:
            connection.resumed(session, answer.body["submits"])
    log.info("the broker at %s was lost; %d session(s) resumed on %s in %.2f s", lost,
             sum(not isinstance(a, FabricError) for a in answers.values()),
             connection.address, time.monotonic() - started)
