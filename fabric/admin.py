"""``fabric.Admin``: the broker's admin commands as Python calls; ``fabric admin`` wraps it.

Rule: an admin speaks to the broker's frontend through the same ``Connection`` as a client
(so it fails as fast, and with the same typed errors, when the broker cannot be reached),
sends one ADMIN request per call with the admin token, and returns plain dicts and lists.
The token is kept for the requests and never printed or put in a result.

Where the address and token come from, first match wins:

- address: ``address=``; else the connection file (``connection_file=``, else
  $FABRIC_CONNECTION_FILE, else the default file ``fabric cluster up`` writes, if it exists);
- token: ``token=``; else $FABRIC_ADMIN_TOKEN; else the connection file's admin token.
"""

from __future__ import annotations

import os
from typing import Any

from .config import CONNECTION_FILE_ENV, default_connection_file, load_connection_file
from .connection import ZMTP_HANDSHAKE_LIMIT, Connection, expect_reply, naming_connection_file
from .security import CurveOption, client_keys
from .errors import ConfigError
from .protocol import Kind, Message

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


def resolve_target(address: str | None, token: str | None,
                   connection_file: str | os.PathLike[str] | None,
                   ) -> tuple[str, str, str | None]:
    """The broker address, the admin token, and the connection file they came from (if any).

    Raises ConfigError, naming what to pass, when either is missing or the connection file
    cannot be used.
    """
    info: dict[str, str] = {}
    if connection_file is None and address is None:
        default = default_connection_file()
        connection_file = os.environ.get(CONNECTION_FILE_ENV) or (
            default if default.exists() else None)
    if connection_file is not None:
        info = load_connection_file(connection_file)
    address = address or info.get("address")
    if not address:
        raise ConfigError(
            f"No broker address: pass one (--address), a connection file (--connection-file), "
            f"or set {CONNECTION_FILE_ENV}; fabric cluster up writes {default_connection_file()}.")
    token = token or os.environ.get(ADMIN_TOKEN_ENV) or info.get("admin_token")
    if not token:
        raise ConfigError(
            f"No admin token: pass one (--token-file or --token), set {ADMIN_TOKEN_ENV}, or use "
            "the connection file fabric cluster up wrote (it holds the admin token).")
    return address, token, info.get("path")


class Admin:
    """An admin connection to a broker; a context manager, used by the thread that made it.

    Opening it checks the broker is there and takes the token, so it fails at once with
    ``ConnectError`` when nothing (or not a fabric broker) listens at the address,
    ``EncryptionError`` when CURVE keys (``curve=``, as for ``fabric.connect``) do not fit,
    ``AuthenticationError`` when the token is not the admin token, and ``HandshakeTimeout``
    when nothing answers within ``timeout`` seconds.
    """

    def __init__(self, address: str | None = None, *, token: str | None = None,
                 connection_file: str | os.PathLike[str] | None = None,
                 timeout: float = 5.0, curve: CurveOption = None) -> None:
        self.address, self._token, self.connection_file = resolve_target(
            address, token, connection_file)
        if curve is None and self.connection_file is not None:  # CURVE keys it names, if any
            curve = load_connection_file(self.connection_file).get("curve")
        self.timeout = timeout
        self._connection = Connection(self.address,
                                      handshake_limit=min(timeout, ZMTP_HANDSHAKE_LIMIT),
                                      curve=client_keys(curve))
        try:
            hello = self._run("ping")
        except BaseException:
            self._connection.close()
            raise
        self.server: str = hello["server"]
        self.protocol_version: int = hello["protocol_version"]

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
        with naming_connection_file(self.connection_file):
            reply = self._connection.request(request, self.timeout)
        return expect_reply(reply, Kind.ADMIN_REPLY).body["result"]

    # -- the commands -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Server identity, uptime, workers, devices online/total, sessions, traffic totals
        and rates since start, rejected handshakes by reason, protocol errors."""
        return self._run("status")

    def workers(self) -> list[dict[str, Any]]:
        """Each connected worker: name, backend, device indexes, registered and last-seen
        ages (s), sessions, draining, and traffic (messages, bytes, submits, errors)."""
        return self._run("workers")["workers"]

    def devices(self) -> list[dict[str, Any]]:
        """Each device index, online or not: worker, local index, backend, online, draining,
        sessions, and traffic."""
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

    def shutdown(self) -> dict[str, Any]:
        """Stop the broker: it answers, tells every client its session ends, and exits."""
        return self._run("shutdown")
