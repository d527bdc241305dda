"""``fabric.connect`` and ``fabric.devices``: where the broker's address and token come from.

Rule: the arguments win, then a connection file (named, or by $FABRIC_CONNECTION_FILE), then
$FABRIC_TOKEN; with nothing named at all, ``connect`` starts the embedded local cluster. A
connect error names the connection file the address came from, which may be stale.
"""

from __future__ import annotations

import os

from fabric.transport.failover import broker_list, first_active
from fabric.client.session import Session, check_argument, dial
from fabric.core.config import CONNECTION_FILE_ENV, first_secret, load_connection_file
from fabric.core.device import Device
from fabric.core.errors import ConnectError
from fabric.core.flow import DEFAULT_MAX_MESSAGE_BYTES
from fabric.core.security import CurveClient, CurveOption, client_keys
from fabric.core.shm import SharedMemory
from fabric.transport.connection import list_devices


def resolve_token(token: str | None) -> str:
    """The token given, else ``FABRIC_TOKEN``, without the whitespace around it; a clear
    error when there is neither."""
    token = first_secret(token, os.environ.get("FABRIC_TOKEN"))
    if token is None:
        raise ConnectError("No token given: pass token=..., or set FABRIC_TOKEN.")
    return token


def _target(address: str | None, token: str | None, connection_file: str | None,
            curve: CurveOption = None, timeout: float = 10.0,
            ) -> tuple[str, str, str | None, CurveClient | None] | None:
    """The address, token, connection file (if one was used) and CURVE keys from the
    arguments or the environment; None when nothing names a cluster (the embedded one).
    The arguments' types are checked first, so a wrong one is a ``TypeError`` naming it."""
    check_argument("address", address, (str, type(None)), "a broker address (a str)")
    check_argument("token", token, (str, type(None)), "a token (a str)")
    check_argument("connection_file", connection_file, (str, os.PathLike, type(None)),
                   "a path (a str or os.PathLike)")
    check_argument("timeout", timeout, (int, float), "seconds (an int or a float)")
    if address is None and (connection_file or os.environ.get(CONNECTION_FILE_ENV)):
        info = load_connection_file(connection_file)
        return (",".join(info.get("brokers") or [info["address"]]),
                first_secret(token, info["token"]) or "", info["path"],
                client_keys(curve if curve is not None else info.get("curve")))
    if address is None:
        return None
    return address, resolve_token(token), None, client_keys(curve)


def connect(address: str | None = None, *, token: str | None = None, device: int = 0,
            timeout: float = 10.0, connection_file: str | None = None,
            curve: CurveOption = None,
            max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
            shared_memory: bool | SharedMemory = True) -> Session:
    """Open a session on ``device`` of the broker at ``address``.

    With no address, the address and token come from ``connection_file`` (or the file named
    by $FABRIC_CONNECTION_FILE): the connection file ``fabric cluster up`` wrote for users,
    not the operators' admin file (refused, with a ``ConfigError`` saying so); with neither, an
    embedded local cluster is started for this process and stopped when its last session
    closes or the interpreter exits.

    Fails fast with a typed error: ``ConnectError`` when nothing listens there or the peer
    is not a fabric broker, ``ServerDisconnected`` when it closes before answering,
    ``VersionMismatch``, ``AuthenticationError``, ``NoSuchDevice`` or another
    ``HandshakeError`` when the broker refuses, ``HandshakeTimeout`` at ``timeout``.

    A broker pair (``fabric cluster up --standby``): the address lists both brokers,
    separated by a comma, or the connection file lists them (``brokers``); each is tried
    until the active one welcomes the session, and ``NoActiveBroker`` names both when
    neither does (at once when neither answers, else at ``timeout``).

    ``curve`` encrypts the connection (CURVE): a ``fabric.CurveClient``, a directory written
    by ``fabric keys generate`` (its client pair and broker.key), or a mapping with
    ``secret_key_file`` and ``server_public_key_file``; a connection file may name them too.
    A key the broker refuses, or encryption on at one end only, is an ``EncryptionError``.

    ``max_message_bytes`` is the largest frame (one array) the connection carries either way:
    the broker keeps reads within it, and uploads are kept within it and within what the
    broker and the device's worker take, so an array too big is a ``MessageTooLarge`` at the
    call instead of a lost connection.

    ``shared_memory``: with a worker on this host, arrays of 1 MiB and more go up and come
    back through shared memory instead of inside messages (the worker agrees first; anything
    else takes the sockets, as does every array with ``False``). A ``fabric.SharedMemory``
    sets its threshold and the most shared memory the connection holds.
    """
    check_argument("device", device, (int,), "a device index (an int)")
    check_argument("max_message_bytes", max_message_bytes, (int,), "a size in bytes (an int)")
    check_argument("shared_memory", shared_memory, (bool, SharedMemory),
                   "True, False or a fabric.SharedMemory")
    options = SharedMemory() if shared_memory is True else shared_memory or None
    target = _target(address, token, connection_file, curve, timeout)
    if target is None:
        # (loaded only when needed: it starts processes)
        from fabric.launch.local import embedded_session

        if curve is not None:
            raise ConnectError("curve= needs an address or a connection file: the embedded "
                               "local cluster is not encrypted.")
        session = embedded_session(device, timeout)
        session.connection.shared_memory = options
        return session
    address, token, source, keys = target
    brokers = broker_list(address)
    return first_active(brokers, timeout, lambda broker, left: dial(
        broker, token, device, timeout, keys, max_message_bytes, source, options,
        hello_timeout=left, brokers=brokers))


def devices(address: str | None = None, *, token: str | None = None, timeout: float = 10.0,
            connection_file: str | None = None, curve: CurveOption = None) -> list[Device]:
    """Every device of every worker registered with the broker at ``address`` (or the one a
    connection file names); ``curve`` as for ``connect``."""
    target = _target(address, token, connection_file, curve, timeout)
    if target is None:
        raise ConnectError("No address given: pass one, or a connection_file, or set "
                           f"{CONNECTION_FILE_ENV}.")
    address, token, source, keys = target
    return first_active(broker_list(address), timeout, lambda broker, left: list_devices(
        broker, token, left, keys, source))
