"""Resuming a session on the broker that took over from its own, sans I/O: the secret, the
digests, a worker's report of the sessions it kept, and its record of recent replies.

Rule: a session resumes only with its secret. The worker makes the secret when it opens the
session (``new_secret``) and keeps only its digest; the secret travels once, in OPENED and on
in WELCOME, to the client, and the broker that passes it on keeps nothing of it. A worker of
a pair that lost its broker keeps its sessions for a grace time and reports them when it
registers with the other (``HeldSession``: id, device, the digest of the client token that
opened it, the secret's digest, the batches run); the new broker resumes one only for a
client that shows the same token and a secret of that digest, compared in constant time.

Nothing runs twice: a client resends what had no answer, a batch with its sequence number
(``seq``, the count of the session's batches up to it), which a device skips when it has run
that many already, and a request with its id (marked ``again``), which the device answers
from its ``ReplyRecord`` when it answered that id before (a reply too large to record runs
again only where that gives the same answer, else ``ReplyLost``: never a wrong value).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import OrderedDict
from typing import Any, NamedTuple, Sequence

SECRET_BYTES = 16
DIGEST_BYTES = 32  # sha256
MAX_REPORTED = 4096  # sessions one REGISTER may report (its body is bounded anyway)
RECORD_REPLIES = 64  # replies a session's record keeps, the newest
RECORD_BYTES = 4 << 20  # and the buffers they may hold in all, a budget per session


def new_secret() -> bytes:
    """A session's random resume secret."""
    return os.urandom(SECRET_BYTES)


def digest(secret: bytes) -> bytes:
    """The digest kept of a secret (or of a client token: whose a session is)."""
    return hashlib.sha256(secret).digest()


def secret_matches(offered: Any, kept: bytes) -> bool:
    """Whether ``offered`` is the secret whose digest is ``kept`` (constant time)."""
    return isinstance(offered, bytes) and hmac.compare_digest(digest(offered), kept)


class HeldSession(NamedTuple):
    """A session a worker kept when its broker went, as its REGISTER reports it."""

    session: int
    device: int  # the worker's local index
    owner: bytes  # the digest of the client token that opened it
    secret_digest: bytes
    submits: int  # the batches its device has run

    def to_wire(self) -> list[Any]:
        """The report as REGISTER's ``sessions`` list holds it."""
        return list(self)


def decode_reports(value: Any, devices: int) -> list[HeldSession]:
    """The well-formed reports of a REGISTER's ``sessions`` (at most ``MAX_REPORTED``, each
    on one of its ``devices``); a malformed one is left out: the session is not resumable."""
    if not isinstance(value, list):
        return []
    reports = []
    for item in value[:MAX_REPORTED]:
        if not (isinstance(item, list) and len(item) == 5):
            continue
        session, device, owner, secret_digest, submits = item
        if (type(session) is int and 0 < session < 2**64 and type(device) is int
                and 0 <= device < devices and isinstance(owner, bytes)
                and len(owner) == DIGEST_BYTES and isinstance(secret_digest, bytes)
                and len(secret_digest) == DIGEST_BYTES and type(submits) is int
                and 0 <= submits < 2**63):
            reports.append(HeldSession(session, device, owner, secret_digest, submits))
    return reports


def batch_seq(body: dict[str, Any]) -> int | None:
    """The sequence number a batch carries (None: a client that sends none)."""
    seq = body.get("seq")
    return seq if type(seq) is int else None


class ReplyRecord:
    """A session's recent replies by request id, bounded by count and bytes: a request sent
    again (its client resumed the session) is answered from here, not run again.

    A reply not kept (its buffers past the session's ``RECORD_BYTES``, no room left in the
    worker's memory budget, or pushed out by newer ones) leaves a note of the batches its
    session had run when it was given (``lost``): sent again with none run since, the request
    runs again and gives the same answer (a read changes nothing, and nothing else did); with
    batches run since (an in-place write may have changed what it read), it is answered with
    ``fabric.ReplyLost`` rather than a value that may be wrong.
    """

    __slots__ = ("_replies", "nbytes", "_unkept")

    def __init__(self) -> None:
        # request -> (replies, their buffers' bytes, the session's batches run then)
        self._replies: OrderedDict[int, tuple[list[Any], int, int]] = OrderedDict()
        self.nbytes = 0  # the buffers held (the worker's memory budget counts them)
        self._unkept: OrderedDict[int, int] = OrderedDict()  # request -> batches run then

    def __len__(self) -> int:
        return len(self._replies)

    def get(self, request: int) -> list[Any] | None:
        """The replies given to ``request``, if recorded."""
        kept = self._replies.get(request)
        return None if kept is None else kept[0]

    def lost(self, request: int, submits: int) -> bool:
        """Whether ``request`` was answered without its replies kept and its session has
        run batches since (its session's count of batches run is ``submits`` now)."""
        then = self._unkept.get(request)
        return then is not None and then != submits

    def keep(self, request: int, replies: Sequence[Any], nbytes: int, submits: int,
             room: bool = True) -> int:
        """Record the replies to ``request`` (``nbytes``: their buffers' size; ``submits``:
        the batches its session has run; ``room``: whether the memory budget has room for
        them). Past either bound the oldest go. Returns the change in ``nbytes``.

        No replies yet (an ``await`` answered once its tensor arrives) is not recorded: sent
        again, such a request runs again (it only waits), or its later answer would never
        be given to the client that resumed."""
        if request == 0 or not replies:
            return 0
        before = self.nbytes
        old = self._replies.pop(request, None)
        if old is not None:
            self.nbytes -= old[1]
        if nbytes > RECORD_BYTES or not room:
            self._note_unkept(request, submits)
            return self.nbytes - before
        self._replies[request] = (list(replies), nbytes, submits)
        self.nbytes += nbytes
        while len(self._replies) > RECORD_REPLIES or self.nbytes > RECORD_BYTES:
            gone, (_, size, then) = self._replies.popitem(last=False)
            self.nbytes -= size
            self._note_unkept(gone, then)
        return self.nbytes - before

    def _note_unkept(self, request: int, submits: int) -> None:
        self._unkept[request] = submits
        if len(self._unkept) > RECORD_REPLIES:
            self._unkept.popitem(last=False)
