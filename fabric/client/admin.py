"""``fabric.Admin``: the broker's admin commands as Python calls; ``fabric admin`` wraps it.

Rule: an admin speaks to the broker's frontend through the same ``Connection`` as a client
(so it fails as fast, and with the same typed errors, when the broker cannot be reached),
sends one ADMIN request per call with the admin token, and returns plain dicts and lists.
The token is kept for the requests and never printed or put in a result.

Where the address and token come from, first match wins:

- address: ``address=``; else the file named (``admin_file=``, the operator's file ``fabric
  cluster up`` writes, or ``connection_file=``: an older file that holds every token, or a
  client's, whose address and keys serve but which holds no admin token); with neither, the
  file $FABRIC_ADMIN_FILE names, else $FABRIC_CONNECTION_FILE's, else the default admin file,
  else the default connection file, if it exists;
- token: ``token=``; else $FABRIC_ADMIN_TOKEN; else the file's admin token; the whitespace
  around it stripped.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

from fabric.core.config import (ADMIN_FILE_ENV, CONNECTION_FILE_ENV, default_admin_file,
                                first_secret, default_connection_file, load_admin_file)
from fabric.core.errors import ConfigError
from fabric.core.protocol import Kind, Message
from fabric.core.security import CurveOption, client_keys
from fabric.transport.connection import (ZMTP_HANDSHAKE_LIMIT, Connection, expect_reply,
                                         naming_connection_file)

ADMIN_TOKEN_ENV = "FABRIC_ADMIN_TOKEN"


def parse_session_id(session: int | str) -> int:
    """A session id as ``fabric admin sessions`` prints it (hex, ``0x`` optional), or an int.

    Raises ValueError for anything else.
    """
    if isinstance(session, int) and not isinstance(session, bool):
        return session
    if isinstance(session, str):
        text = session.strip().lower()
        text = text[2:] if text.startswith("0x") else text
        try:
            return int(text, 16)
        except ValueError:
            pass
    raise ValueError(f"{session!r} is not a session id: give it as fabric admin sessions "
                     "shows it, like 0x1f2e3d4c5b6a7988.")


def admin_source(address: str | None, admin_file: str | os.PathLike[str] | None,
                  connection_file: str | os.PathLike[str] | None,
                  ) -> str | os.PathLike[str] | None:
    """The file an admin reads: the one named; else, with no address either, the one the
    environment names (the admin file's variable first), else a default file that exists."""
    if admin_file is not None and connection_file is not None:
        raise ConfigError("Give an admin file or a connection file, not both.")
    if admin_file is not None or connection_file is not None or address is not None:
        return admin_file if admin_file is not None else connection_file
    named = os.environ.get(ADMIN_FILE_ENV) or os.environ.get(CONNECTION_FILE_ENV)
    # (the default connection file: one written before the two files, holding every token)
    defaults = [path for path in (default_admin_file(), default_connection_file())
                if path.exists()]
    return named or (defaults[0] if defaults else None)


def resolve_target(address: str | None, token: str | None,
                   admin_file: str | os.PathLike[str] | None,
                   connection_file: str | os.PathLike[str] | None = None,
                   ) -> tuple[str, str, str | None, dict[str, str] | None]:
    """The broker address, the admin token, the file they came from (if any) and the CURVE
    key files it names (if any).

    Raises ConfigError, naming what to pass, when either is missing or the file cannot be
    used; a client's connection file holds no admin token, and the error says so.
    """
    source = admin_source(address, admin_file, connection_file)
    info = load_admin_file(source) if source is not None else {}
    address = address or info.get("address")
    if not address:
        raise ConfigError(
            f"No broker address: pass one (--address), the admin file (--admin-file), or set "
            f"{ADMIN_FILE_ENV}; fabric cluster up writes {default_admin_file()}.")
    token = first_secret(token, os.environ.get(ADMIN_TOKEN_ENV), info.get("admin_token"))
    if not token and "token" in info:
        raise ConfigError(
            f"{info['path']} is a client's connection file: it holds no admin token. Use the "
            f"admin file fabric cluster up wrote (--admin-file, or set {ADMIN_FILE_ENV}), or "
            f"pass the admin token (--token-file, or set {ADMIN_TOKEN_ENV}).")
    if not token:
        raise ConfigError(
            f"No admin token: pass one (--token-file or --token), set {ADMIN_TOKEN_ENV}, or use "
            "the admin file fabric cluster up wrote (it holds the admin token).")
    return address, token, info.get("path"), info.get("curve")


class Admin:
    """An admin connection to a broker; a context manager, used by the thread that made it.

    Opening it checks the broker is there and takes the token, so it fails at once with
    ``ConnectError`` when nothing (or not a fabric broker) listens at the address,
    ``EncryptionError`` when CURVE keys (``curve=``, as for ``fabric.connect``) do not fit,
    ``AuthenticationError`` when the token is not the admin token, and ``HandshakeTimeout``
    when nothing answers within ``timeout`` seconds.

    The address, token and CURVE keys come from the arguments, else from the operator's
    ``admin_file`` (or ``connection_file``) that ``fabric cluster up`` wrote, as the module says.
    """

    def __init__(self, address: str | None = None, *, token: str | None = None,
                 admin_file: str | os.PathLike[str] | None = None,
                 connection_file: str | os.PathLike[str] | None = None,
                 timeout: float = 5.0, curve: CurveOption = None) -> None:
        self.address, self._token, self.source_file, file_curve = resolve_target(
            address, token, admin_file, connection_file)
        if curve is None:  # the CURVE keys the file names, if any
            curve = file_curve
        if "," in self.address:  # (each broker of a pair answers for itself)
            raise ConfigError(f"{self.address} lists several brokers: give the address of the "
                              "one to ask (fabric admin pair asks each broker of a pair).")
        self.timeout = timeout
        self._connection = Connection(self.address, self._token, role="admin",
                                      handshake_limit=min(timeout, ZMTP_HANDSHAKE_LIMIT),
                                      curve=client_keys(curve))
        try:
            hello = self._run("ping")
        except BaseException:
            self._connection.close()
            raise
        self.server: str = hello["server"]
        self.protocol_version: int = hello["protocol_version"]
        # Its part in a broker pair when it opened: role, state, term, takeovers (None: no peer).
        self.pair: dict[str, Any] | None = hello.get("pair")

    def __repr__(self) -> str:
        return f"<fabric.Admin {self.address} ({self.server})>"

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._connection.close()

    def _run(self, command: str, **args: Any) -> dict[str, Any]:
        request = Message(Kind.ADMIN, body={"token": self._token, "command": command,
                                            "args": args})
        with naming_connection_file(self.source_file):
            reply = self._connection.request(request, self.timeout)
        return expect_reply(reply, Kind.ADMIN_REPLY).body["result"]

    # -- the commands -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Server identity, uptime, workers, devices online/total, sessions, traffic totals
        and rates since start, rejected handshakes by reason, protocol errors."""
        return self._run("status")

    def workers(self, lost: bool = False) -> list[dict[str, Any]]:
        """Each connected worker: name, host (as it reports it), address (as the broker sees
        it), backend, device indexes, registered and last-seen ages (s), sessions, draining,
        traffic (messages, bytes, submits, errors), ``link_refusals`` (peers its direct-link
        endpoint refused, as it last reported) and ``online`` True.

        With ``lost``, then each lost worker (offline, its device indexes kept for it): name,
        host, address, backend, indexes, ``online`` False, and when it was last heard from:
        ``lost_ago`` (s) and ``lost_at`` (UTC, ISO 8601), both None when not since the broker
        started (its indexes came from the broker's state file).
        """
        result = self._run("workers")
        rows = [{**row, "online": True} for row in result["workers"]]
        if lost:
            now = datetime.now(timezone.utc)
            rows += [{**row, "online": False, "lost_at": None if row["lost_ago"] is None else
                      (now - timedelta(seconds=row["lost_ago"])).isoformat(timespec="seconds")}
                     for row in result["lost"]]
        return rows

    def devices(self) -> list[dict[str, Any]]:
        """Each device index, online or not: worker, local index, backend, online, draining,
        sessions, traffic, and what its worker last reported of it (``resident_bytes``,
        ``ops``, ``op_seconds``, ``graph_replays``, ``graph_registrations``, ``queued``; None
        before any report)."""
        return self._run("devices")["devices"]

    def sessions(self) -> list[dict[str, Any]]:
        """Each session: id (hex), client identity (hex), device, worker, state, created and
        last-seen ages (s), and traffic."""
        return self._run("sessions")["sessions"]

    def close_session(self, session: int | str) -> dict[str, Any]:
        """Close a session on its worker; its client's next call raises SessionLost.

        ``session`` is an int or the hex id ``sessions()`` shows. Raises NotFound when the
        broker has no such session (nothing changes).
        """
        return self._run("close-session", session=parse_session_id(session))

    def drain(self, worker: str) -> dict[str, Any]:
        """Refuse new sessions on ``worker``'s devices (DeviceDraining); open ones go on.

        Raises NotFound when no worker of that name is connected (nothing changes).
        """
        return self._run("drain", worker=worker)

    def undrain(self, worker: str) -> dict[str, Any]:
        """Let ``worker`` take new sessions again after ``drain``."""
        return self._run("undrain", worker=worker)

    def forget(self, worker: str) -> dict[str, Any]:
        """Drop an offline worker's name and device indexes (never given again): a worker
        that registers under that name later gets new ones.

        Raises WorkerNameTaken while it is connected and NotFound for a name the broker never
        numbered (nothing changes either way).
        """
        return self._run("forget", worker=worker)

    def shutdown(self) -> dict[str, Any]:
        """Stop the broker: it answers, tells every client its session ends, and exits."""
        return self._run("shutdown")


def pair_roles(address: str | None = None, *, token: str | None = None,
               admin_file: str | os.PathLike[str] | None = None,
               connection_file: str | os.PathLike[str] | None = None, timeout: float = 5.0,
               curve: CurveOption = None) -> list[dict[str, Any]]:
    """Each broker of a pair (``address`` "A,B", else the file's ``brokers``; a single broker
    alone): its ``address`` and, as its ``ping`` says, its ``pair`` (role, state, term,
    takeovers; None for a broker without a peer), or the ``error`` (code and sentence) that
    asking it raised, so that a dead broker is shown rather than hiding the other.

    Raises ConfigError, as ``Admin`` does, when no address or admin token is found."""
    from fabric.core.errors import FabricError  # (the errors a broker's answer may carry)

    source = admin_source(address, admin_file, connection_file)
    info = load_admin_file(source) if source is not None else {}
    named = address.split(",") if address else info.get("brokers") or [info.get("address")]
    rows: list[dict[str, Any]] = []
    for broker in named:
        file = {"admin_file": source} if admin_file is not None or connection_file is None \
            else {"connection_file": source}
        try:
            with Admin(broker, token=token, timeout=timeout, curve=curve, **file) as admin:
                rows.append({"address": admin.address, "pair": admin.pair})
        except ConfigError:
            raise
        except FabricError as exc:
            rows.append({"address": broker, "error": {"code": exc.code, "message": exc.message}})
    return rows
