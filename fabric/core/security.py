"""Authentication in the ZeroMQ handshake: tokens as PLAIN passwords, CURVE key pairs on
disk, the broker's allow-lists, and the sockets that use them.

Every peer of the broker authenticates before its connection is attached: without CURVE, by
a token as the PLAIN mechanism's password; with CURVE, by a key in the broker's allow-list
(its token is then checked in the protocol). The broker decides through ZAP
(``broker.zap_gate``, ``broker.handshake.handshake_role``); this module sets the sockets up and
turns ZeroMQ's silent handshake failures (socket monitor events, and when the peer just
hangs up, the mechanism its greeting announces) into typed errors whose sentences name the
likely cause.

Rule: a secret key is read only from a file no one else can read (``config.check_private``,
the rule token files follow) and is never logged, printed or put in a repr. Keys are the z85
text libzmq takes.

``generate_keys(DIR)`` (``fabric keys generate DIR``) writes::

    DIR/broker.key   DIR/broker.key_secret    the broker's pair (.key is the public half)
    DIR/client.key   DIR/client.key_secret    a client's pair (clients and fabric admin)
    DIR/worker.key   DIR/worker.key_secret    a worker's pair
    DIR/clients/client.key                    public keys the broker accepts from clients
    DIR/workers/worker.key                    public keys the broker accepts from workers

Secret files are mode 0600, and no one else can open them even while they are written (in
a 0700 scratch directory, then moved in). To admit another client or worker, copy its public
``.key`` file into ``clients/`` or ``workers/`` and restart the broker.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import zmq
import zmq.auth

from fabric.core.config import check_private
from fabric.core.errors import AuthenticationError, ConfigError, ConnectError, EncryptionError

ROLES = ("broker", "client", "worker")
# ZAP domains of the broker's two sockets: each has its own allow-list.
FRONTEND_DOMAIN = "fabric-frontend"
WORKERS_DOMAIN = "fabric-workers"
PAIR_DOMAIN = "fabric-pair"  # a broker's state heartbeats to the other of its pair
_Z85_KEY_LENGTH = 40

PathLike = Union[str, "os.PathLike[str]"]


def _require_curve() -> None:
    if not zmq.has("curve"):
        raise ConfigError("This libzmq was built without CURVE support: install pyzmq from its "
                          "wheels, which include it.")


def generate_keys(directory: PathLike) -> dict[str, Path]:
    """Write broker, client and worker key pairs and the broker's allow-lists to ``directory``.

    Returns the written files by name (``broker.key``, ``client.key_secret``, ...). Refuses,
    writing nothing, when the directory already holds any of these key files.
    """
    _require_curve()
    directory = Path(directory)
    names = [f"{role}{ext}" for role in ROLES for ext in (".key", ".key_secret")]
    existing = [name for name in names if (directory / name).exists()]
    if existing:
        raise ConfigError(f"{directory} already holds keys ({', '.join(existing)}): choose "
                          "another directory, or remove them first.")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    written: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(dir=directory, prefix=".keys-") as scratch:  # mode 0700
        for role in ROLES:
            public, secret = zmq.auth.create_certificates(scratch, role)
            os.chmod(secret, 0o600)
            os.chmod(public, 0o644)
            for made in (public, secret):
                target = directory / os.path.basename(made)
                os.replace(made, target)
                written[target.name] = target
    for folder, role in (("clients", "client"), ("workers", "worker")):
        (directory / folder).mkdir(exist_ok=True, mode=0o755)  # public keys only
        allowed = directory / folder / f"{role}.key"
        shutil.copyfile(written[f"{role}.key"], allowed)
        written[f"{folder}/{role}.key"] = allowed
    return written


def _checked(key: bytes | None, path: Path, what: str) -> bytes:
    if key is None or len(key) != _Z85_KEY_LENGTH:
        raise ConfigError(f"{path} holds no valid CURVE {what}: give a file written by "
                          "fabric keys generate.")
    return key


def _load(path: Path) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not a CURVE key file ({exc}): give a file written by "
                          "fabric keys generate.") from None


def load_secret_key(path: PathLike) -> tuple[bytes, bytes]:
    """``(public, secret)`` from a ``.key_secret`` file; refused when others can read it."""
    path = check_private(path)
    public, secret = _load(path)
    if secret is None:
        raise ConfigError(f"{path} holds only a public key: give the matching .key_secret "
                          "file.")
    return _checked(public, path, "public key"), _checked(secret, path, "secret key")


def load_public_key(path: PathLike) -> bytes:
    """The public key in a ``.key`` (or ``.key_secret``) file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Cannot read {path}: no such file. Give the broker's public key "
                          "file (broker.key, written by fabric keys generate).")
    return _checked(_load(path)[0], path, "public key")


def load_allow_list(directory: PathLike) -> frozenset[bytes]:
    """The public keys of the ``*.key`` files in ``directory``; refused when there are none."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ConfigError(f"{directory} is not a directory of public keys (*.key files).")
    try:
        keys = zmq.auth.load_certificates(directory)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"Cannot read the public keys in {directory}: {exc}.") from None
    if not keys:
        raise ConfigError(f"{directory} holds no public keys (*.key files): nobody could "
                          "connect. Copy the .key files of the allowed peers into it.")
    return frozenset(keys)


@dataclass(frozen=True)
class CurveClient:
    """A client's or worker's CURVE setup: its own key pair and the broker's public key."""

    public_key: bytes
    secret_key: bytes = field(repr=False)
    server_key: bytes

    @classmethod
    def from_files(cls, secret_key_file: PathLike,
                   server_public_key_file: PathLike) -> "CurveClient":
        """Load the pair from ``secret_key_file`` (mode 0600) and the broker's public key."""
        _require_curve()
        public, secret = load_secret_key(secret_key_file)
        return cls(public, secret, load_public_key(server_public_key_file))

    @classmethod
    def from_dir(cls, directory: PathLike, role: str = "client") -> "CurveClient":
        """The ``role`` pair (``client`` or ``worker``) of a ``fabric keys generate`` directory."""
        directory = Path(directory)
        return cls.from_files(directory / f"{role}.key_secret", directory / "broker.key")

    def apply(self, socket: zmq.Socket) -> None:
        """Make ``socket`` a CURVE client of the broker (before it connects)."""
        socket.curve_secretkey = self.secret_key
        socket.curve_publickey = self.public_key
        socket.curve_serverkey = self.server_key


CurveOption = Union[CurveClient, PathLike, Mapping[str, Any], None]


def client_keys(curve: CurveOption, role: str = "client") -> CurveClient | None:
    """The keys a ``curve=`` argument names: a ``CurveClient``; a ``fabric keys generate``
    directory (its ``role`` pair and ``broker.key``); a mapping with ``secret_key_file`` and
    ``server_public_key_file`` (as connection files hold it); or None for no encryption."""
    if curve is None or isinstance(curve, CurveClient):
        return curve
    if isinstance(curve, Mapping):
        try:
            return CurveClient.from_files(curve["secret_key_file"],
                                          curve["server_public_key_file"])
        except KeyError as exc:
            raise ConfigError(f"curve= needs secret_key_file and server_public_key_file; "
                              f"{exc.args[0]} is missing.") from None
    return CurveClient.from_dir(curve, role)


@dataclass(frozen=True)
class CurveServer:
    """The broker's CURVE setup: its key pair and, per socket, the public keys it accepts.

    There is no "any key" setting: a peer is admitted to a socket only with a key of its
    allow-list (or, without CURVE, with a token), because libzmq lets any admitted peer
    choose its routing id and aborts the process on some choices.
    """

    public_key: bytes
    secret_key: bytes = field(repr=False)
    clients: frozenset[bytes]
    workers: frozenset[bytes]

    @classmethod
    def from_files(cls, secret_key_file: PathLike, *, allow_clients: PathLike,
                   allow_workers: PathLike) -> "CurveServer":
        """The broker's pair from ``secret_key_file`` (mode 0600); the allow-lists from the
        ``*.key`` files of two directories."""
        _require_curve()
        public, secret = load_secret_key(secret_key_file)
        return cls(public, secret, load_allow_list(allow_clients),
                   load_allow_list(allow_workers))

    @classmethod
    def from_dir(cls, directory: PathLike) -> "CurveServer":
        """The broker's setup from a ``fabric keys generate`` directory: ``broker.key_secret``,
        clients from ``clients/``, workers from ``workers/``."""
        directory = Path(directory)
        return cls.from_files(directory / "broker.key_secret",
                              allow_clients=directory / "clients",
                              allow_workers=directory / "workers")

    @property
    def allow_lists(self) -> dict[str, frozenset[bytes]]:
        """The keys admitted per ZAP domain: the broker's two sockets, and its pair's state
        socket, which admits only this key (the two brokers of a pair share their keys)."""
        return {FRONTEND_DOMAIN: self.clients, WORKERS_DOMAIN: self.workers,
                PAIR_DOMAIN: frozenset({self.public_key})}


def authenticate_peers(socket: zmq.Socket, domain: str, curve: CurveServer | None) -> None:
    """Make one of the broker's sockets (before it binds) authenticate every peer in the
    ZeroMQ handshake, asking the broker's ZAP handler in ``domain``: a CURVE server with
    ``curve``, else a PLAIN server whose password must be one of the broker's tokens."""
    if curve is not None:
        socket.curve_server = True
        socket.curve_secretkey = curve.secret_key
        socket.curve_publickey = curve.public_key
    else:
        socket.plain_server = True
    socket.zap_domain = domain.encode()


def present_token(socket: zmq.Socket, role: str, token: str | None) -> None:
    """Make ``socket`` (before it connects, without CURVE) show ``token`` in the ZeroMQ
    handshake, as the PLAIN mechanism's password (``role`` is the user name: ``client``,
    ``admin`` or ``worker``). The broker admits no connection without one of its tokens."""
    socket.plain_username = role.encode()
    socket.plain_password = (token or "").encode()


LINK_USER = b"fabric-link"  # the PLAIN user name a direct link's ticket is shown under
LINK_STALL_SECONDS = 5.0  # a direct link whose bytes TCP leaves unacknowledged this long broke


def link_keys(ticket: bytes) -> tuple[bytes, bytes]:
    """The CURVE key pair (public, secret; z85) whose secret key is a direct link's
    ``ticket`` (32 random bytes): only its holder can complete a handshake with it."""
    secret = zmq.utils.z85.encode(ticket)
    return zmq.curve_public(secret), secret


def show_ticket(socket: zmq.Socket, ticket: bytes, server_key: bytes | None) -> None:
    """Make ``socket`` (before it connects to a worker's direct-link endpoint) show
    ``ticket`` in the handshake: with CURVE, to an endpoint of public key ``server_key``, as
    its key pair's secret; without, as the PLAIN password. And writable only once that
    handshake is done (IMMEDIATE); disconnected once its bytes go unacknowledged by TCP for
    ``LINK_STALL_SECONDS`` (TCP_MAXRT), so a link cut mid-send is noticed."""
    socket.setsockopt(zmq.IMMEDIATE, 1)
    socket.setsockopt(zmq.TCP_MAXRT, int(LINK_STALL_SECONDS * 1000))
    socket.setsockopt(zmq.IPV6, True)
    if server_key is not None:
        socket.curve_publickey, socket.curve_secretkey = link_keys(ticket)
        socket.curve_serverkey = server_key
    else:
        socket.plain_username, socket.plain_password = LINK_USER, ticket


def announced_mechanism(address: str, timeout: float = 0.5) -> str | None:
    """The security mechanism (``"CURVE"``, ``"NULL"``...) the ZeroMQ peer at ``address``
    announces in its greeting; None when that cannot be learned within ``timeout`` seconds.

    A raw tcp:// or ipc:// connection sends only the start of a ZMTP 3 greeting (signature
    and major version), which makes the peer send its whole greeting, reads it and closes.
    Used on the failure path only: libzmq often reports a refused mechanism as a bare
    disconnect, because the peer closes before this end has read the peer's greeting.
    """
    deadline = time.monotonic() + timeout
    try:
        if address.startswith("tcp://"):
            host, _, port = address[len("tcp://"):].rpartition(":")
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        elif address.startswith("ipc://"):
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(timeout)
            sock.connect(address[len("ipc://"):])
        else:
            return None
        with sock:
            sock.sendall(b"\xff" + bytes(8) + b"\x7f\x03")
            greeting = b""
            while len(greeting) < 32:  # up to the end of the mechanism name
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                sock.settimeout(remaining)
                chunk = sock.recv(64 - len(greeting))
                if not chunk:
                    return None
                greeting += chunk
    except (OSError, ValueError):
        return None
    if greeting[0] != 0xFF or not greeting[9] & 1 or greeting[10] < 3:
        return None  # not a ZMTP 3 greeting
    return greeting[12:32].rstrip(b"\0").decode("ascii", "replace")


# What to do about a refused token, by whose it is.
_TOKEN_HINTS = {
    "client": "check the client token you were given (token=, the connection file's token, "
              "or FABRIC_TOKEN).",
    "admin": "admin commands need the admin token (FABRIC_ADMIN_TOKEN, or the admin_token of "
             "the admin file).",
    "worker": "start the worker with the cluster's worker token (FABRIC_WORKER_TOKEN or "
              "--worker-token-file).",
}


def _mismatch(address: str, *, encrypted: bool, mechanism: str | None) -> ConnectError:
    if encrypted:
        return EncryptionError(
            f"This connection uses CURVE encryption and the peer at {address} does not: "
            "the broker was started without --curve (then connect without CURVE keys), "
            "or the address is another service.", reason="mechanism_mismatch")
    if mechanism == "CURVE":
        return EncryptionError(
            f"The broker at {address} requires CURVE encryption and this connection has "
            "none: give your key pair and the broker's public key, as fabric keys generate "
            "writes them (curve= in Python, the connection file of fabric cluster up --curve, "
            "or a worker's --curve-secret-key and --broker-public-key).",
            reason="mechanism_mismatch")
    return ConnectError(
        f"The peer at {address} does not ask for a token in the ZeroMQ handshake (it speaks "
        f"{mechanism or 'another security mechanism'}), as every fabric broker does: it is "
        "another ZeroMQ service, or a fabric broker of an older version. Check the address "
        "and port.", reason="mechanism_mismatch")


def handshake_error(event: int, value: int, address: str, *, encrypted: bool,
                    role: str = "client") -> ConnectError | None:
    """``explain_handshake``, asking the peer which mechanism it speaks where the event needs
    it (``probe_needed``): a TCP probe that blocks for up to half a second."""
    mechanism = announced_mechanism(address) if probe_needed(event, value) else None
    return explain_handshake(event, value, address, encrypted=encrypted, mechanism=mechanism,
                             role=role)


def probe_needed(event: int, value: int) -> bool:
    """Whether explaining a socket monitor event needs the mechanism the peer announces
    (``announced_mechanism``): a handshake the peer cut short or whose mechanism differs,
    not a timeout."""
    return ((event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and value != errno.EAGAIN)
            or (event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH))


def explain_handshake(event: int, value: int, address: str, *, encrypted: bool,
                      mechanism: str | None, role: str = "client") -> ConnectError | None:
    """The error a socket monitor event during the ZeroMQ handshake means, or None when the
    event is not about authentication or encryption. ``encrypted``: this end uses CURVE;
    ``mechanism``: what the peer announces, where ``probe_needed`` (None: unknown); ``role``:
    whose token this end showed (``client``, ``admin`` or ``worker``).
    """
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        if not encrypted:
            return AuthenticationError(
                f"The broker at {address} refused the {role} token in the ZeroMQ handshake: "
                f"{_TOKEN_HINTS[role]}", status=value)
        return EncryptionError(
            f"The broker at {address} refused this connection's CURVE key: it accepts only "
            "the public keys in its allow list. Use the key pair you were given, or ask the "
            "broker's administrator to add your public key (.key file) to it.", status=value)
    if (event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH):
        return _mismatch(address, encrypted=encrypted, mechanism=mechanism)
    if probe_needed(event, value):
        if mechanism is not None and mechanism != ("CURVE" if encrypted else "PLAIN"):
            return _mismatch(address, encrypted=encrypted, mechanism=mechanism)
        if encrypted and mechanism == "CURVE":
            return EncryptionError(
                f"The broker at {address} closed the connection during the CURVE handshake: "
                "the broker public key you gave is likely not its key (check "
                "server_public_key_file or --broker-public-key).",
                reason="closed_during_handshake")
        return None
    if encrypted and event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return EncryptionError(
            f"The CURVE handshake with {address} failed (ZeroMQ protocol error {value:#x}): "
            "the broker's public key or this connection's key pair is likely wrong.",
            reason="protocol")
    return None
