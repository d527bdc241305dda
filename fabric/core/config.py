"""Tokens and secrets: where they come from, and the rule that keeps them private; the
connection file (for clients) and the admin file (for operators) that ``fabric cluster up``
writes.

Rule: a token comes from a file (which must not be readable by others), an environment
variable, or a command-line value, in that order; it is never logged or printed. CURVE secret
key files (``fabric.core.security``) pass the same ``check_private`` test. A file handed to clients
never holds the admin or worker token.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from fabric.core.errors import ConfigError


def check_private(path: str | os.PathLike[str]) -> Path:
    """``path``, once it is known to exist with no permission for group or others (the rule
    for token files and CURVE secret keys); ConfigError saying what to do otherwise."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"Cannot read {path}: {exc.strerror}.") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path} can be read by other users: run chmod 600 {path}.")
    return path


def read_secret_file(path: str | os.PathLike[str]) -> str:
    """The secret in ``path``, refused when group or others can read the file."""
    path = check_private(path)
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"Cannot read {path}: {exc.strerror}.") from None
    if not text:
        raise ConfigError(f"{path} is empty: write the token into it.")
    return text


def write_secret_file(path: str | os.PathLike[str], secret: str) -> None:
    """Write a secret to ``path``, created with mode 0600 from the start.

    It is written beside ``path`` and renamed into place, so a reader that finds the file
    finds all of it.
    """
    path = Path(path)
    fd, written = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secret + "\n")
        os.replace(written, path)
    except BaseException:
        Path(written).unlink(missing_ok=True)
        raise


def new_token() -> str:
    """A fresh random token."""
    return secrets.token_urlsafe(32)


def first_secret(*candidates: str | None) -> str | None:
    """The first of ``candidates`` that holds a token, without the whitespace around it (the
    newline ``echo`` or a copied line leaves, which is never part of a token)."""
    for candidate in candidates:
        if candidate and candidate.strip():
            return candidate.strip()
    return None


def resolve_secret(value: str | None, file: str | None, env: str) -> str | None:
    """A token from its file (``-``: the first line of standard input, as a launcher hands it
    over SSH), else the environment variable ``env``, else ``value``; the whitespace around
    it is stripped, whichever it came from."""
    if file == "-":
        # One line only: the rest of standard input is the launcher's to keep open.
        return first_secret(sys.stdin.readline())
    if file:
        return read_secret_file(file)
    return first_secret(os.environ.get(env), value)


CONNECTION_FILE_ENV = "FABRIC_CONNECTION_FILE"
ADMIN_FILE_ENV = "FABRIC_ADMIN_FILE"
# Two files, because their readers differ: the connection file goes to every user, so it holds
# only what a client needs; the admin file holds what steers the broker (the admin token) or
# joins it as a worker (the worker token, the workers' address), for operators alone. Both
# name the client's CURVE key files (paths, never keys), under ``curve``, when there are any.
CONNECTION_FILE_KEYS = ("address", "token")
ADMIN_FILE_KEYS = ("address", "worker_address", "admin_token", "worker_token")
# Written where the cluster has them: the broker's /metrics URL, beside which its dashboard
# is served (``fabric dashboard`` reads it).
ADMIN_FILE_OPTIONAL_KEYS = ("metrics",)
# Admin file keys that older releases wrote, read under their new names.
RENAMED_ADMIN_FILE_KEYS = {"backend_address": "worker_address"}


def default_connection_file() -> Path:
    """Where ``fabric cluster up`` writes the connection file (for clients) unless told
    otherwise."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "fabric" / "cluster.json"


def admin_file_beside(connection_file: str | os.PathLike[str]) -> Path:
    """Where ``fabric cluster up`` writes the admin file unless told otherwise: beside the
    connection file, ``NAME-admin.json`` for ``NAME.json``."""
    return _beside(connection_file, "admin")


def state_file_beside(connection_file: str | os.PathLike[str]) -> Path:
    """Where ``fabric cluster up``'s broker keeps its device numbering (``--state-file``):
    ``NAME-state.json`` beside the connection file ``NAME.json``."""
    return _beside(connection_file, "state")


def _beside(connection_file: str | os.PathLike[str], what: str) -> Path:
    path = Path(connection_file)
    return path.with_name(f"{path.stem}-{what}{path.suffix or '.json'}")


def logs_beside(connection_file: str | os.PathLike[str], started: datetime) -> Path:
    """Where ``fabric cluster up`` keeps its processes' logs unless told otherwise: a folder
    beside the connection file, dated when the cluster started, ``NAME-logs-YYYYmmdd-HHMMSS``
    for ``NAME.json``."""
    path = Path(connection_file)
    return path.with_name(f"{path.stem}-logs-{started:%Y%m%d-%H%M%S}")


def default_admin_file() -> Path:
    """Where ``fabric cluster up`` writes the admin file (for operators) by default."""
    return admin_file_beside(default_connection_file())


def _write_json_file(path: str | os.PathLike[str], info: dict[str, Any],
                     keys: tuple[str, ...], optional: tuple[str, ...] = ()) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    content = {k: info[k] for k in keys}
    content.update((k, info[k]) for k in optional if info.get(k))
    if info.get("curve"):  # the client's CURVE key files (paths, not keys)
        content["curve"] = dict(info["curve"])
    if info.get("brokers"):  # a broker pair's clients' addresses (``address``: the primary's)
        content["brokers"] = list(info["brokers"])
    write_secret_file(path, json.dumps(content, indent=2))
    return path


def write_connection_file(path: str | os.PathLike[str], info: dict[str, Any]) -> Path:
    """Write the connection file clients use: the address, the client token, the paths of
    the client's CURVE key files (``curve``) and a broker pair's addresses (``brokers``), as
    JSON, mode 0600 from the start. Nothing else of ``info`` is written. Returns the path."""
    return _write_json_file(path, info, CONNECTION_FILE_KEYS)


def write_admin_file(path: str | os.PathLike[str], info: dict[str, Any]) -> Path:
    """Write the operators' admin file: the address for clients (``address``) and for workers
    (``worker_address``), the admin and worker tokens, the CURVE key files ``fabric admin``
    connects with (``curve``) and the broker's /metrics URL (``metrics``), where there are
    any, as JSON, mode 0600 from the start. The client token is not written. Returns the
    path."""
    return _write_json_file(path, info, ADMIN_FILE_KEYS, ADMIN_FILE_OPTIONAL_KEYS)


def _read_json_file(path: str | os.PathLike[str], what: str) -> dict[str, Any]:
    """A connection or admin file's content with its ``address`` (and ``curve``, if any)
    checked, plus ``path``; ConfigError saying what to do otherwise."""
    text = read_secret_file(path)
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not isinstance(info.get("address"), str) or not all(
            isinstance(value, str) for key, value in info.items()
            if key not in ("curve", "brokers")):
        raise ConfigError(f"{path} is not a fabric {what}: fabric cluster up writes one.")
    curve = info.get("curve")
    if curve is not None and not (isinstance(curve, dict) and all(
            isinstance(curve.get(k), str) for k in ("secret_key_file", "server_public_key_file"))):
        raise ConfigError(f"{path} has a malformed curve entry: it needs secret_key_file and "
                          "server_public_key_file; write it again with fabric cluster up --curve.")
    info["path"] = str(path)
    return info


def load_connection_file(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The address, client token (and CURVE key files) from a connection file (``path``,
    else $FABRIC_CONNECTION_FILE); an older file that also holds the admin and worker tokens
    is read too. A broker pair's file lists both brokers' addresses in ``brokers`` as well.

    Raises ConfigError with a sentence that says what to do when it is missing, readable by
    others, an operator's admin file, or not a fabric connection file.
    """
    path = path or os.environ.get(CONNECTION_FILE_ENV)
    if not path:
        raise ConfigError(f"No connection file given: pass one, or set {CONNECTION_FILE_ENV}.")
    info = _read_json_file(path, "connection file")
    if "token" not in info:
        if "admin_token" in info:
            raise ConfigError(
                f"{path} is the operators' admin file, not a connection file: it holds the admin "
                "and worker tokens and no client token. Connect with the connection file "
                "fabric cluster up wrote beside it, and keep this one for fabric admin.")
        raise ConfigError(f"{path} holds no client token: write it again with fabric cluster up.")
    brokers = info.get("brokers")  # a broker pair's clients' addresses (``address``: the first)
    if brokers is not None and not (isinstance(brokers, list) and brokers
                                    and all(isinstance(b, str) and b for b in brokers)):
        raise ConfigError(f"{path}'s brokers is not a list of addresses: write it again with "
                          "fabric cluster up --standby.")
    return info


def load_admin_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The address, admin token (and CURVE key files) from an operator's admin file (or an
    older file that held every token). A client's connection file is read too, for its address
    and keys: it has no ``admin_token``, which the caller must then find elsewhere. An older
    file's ``backend_address`` is returned as ``worker_address``, the workers' address.

    Raises ConfigError with a sentence that says what to do when it is missing, readable by
    others, or not a fabric file.
    """
    info = _read_json_file(path, "admin file")
    for old, new in RENAMED_ADMIN_FILE_KEYS.items():
        if old in info:
            info.setdefault(new, info.pop(old))
    return info
