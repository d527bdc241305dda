"""Tokens and secrets: where they come from, and the rule that keeps them private.

Rule: a token comes from a file (which must not be readable by others), an environment
variable, or a command-line value, in that order; it is never logged or printed. CURVE secret
key files (``fabric.security``) pass the same ``check_private`` test.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import Any

from .errors import ConfigError


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


def resolve_secret(value: str | None, file: str | None, env: str) -> str | None:
    """A token from its file, else the environment variable ``env``, else ``value``."""
    if file:
        return read_secret_file(file)
    return os.environ.get(env) or value or None


CONNECTION_FILE_ENV = "FABRIC_CONNECTION_FILE"
_CONNECTION_KEYS = ("address", "backend_address", "token", "admin_token", "worker_token")


def default_connection_file() -> Path:
    """Where ``fabric cluster up`` writes its connection file unless told otherwise."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "fabric" / "cluster.json"


def write_connection_file(path: str | os.PathLike[str], info: dict[str, Any]) -> Path:
    """Write addresses and tokens (and the paths of CURVE key files, under ``curve``) as
    JSON, mode 0600 from the start; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    content = {k: info[k] for k in _CONNECTION_KEYS}
    if info.get("curve"):  # the client's CURVE key files (paths, not keys)
        content["curve"] = dict(info["curve"])
    write_secret_file(path, json.dumps(content, indent=2))
    return path


def load_connection_file(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Addresses and tokens from a connection file (``path``, else $FABRIC_CONNECTION_FILE).

    Raises ConfigError with a sentence that says what to do when it is missing, readable by
    others, or not a fabric connection file.
    """
    path = path or os.environ.get(CONNECTION_FILE_ENV)
    if not path:
        raise ConfigError(f"No connection file given: pass one, or set {CONNECTION_FILE_ENV}.")
    text = read_secret_file(path)
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    if not isinstance(info, dict) or not all(isinstance(info.get(k), str) for k in
                                             ("address", "token")):
        raise ConfigError(f"{path} is not a fabric connection file: write one with "
                          "fabric cluster up --connection-file.")
    curve = info.get("curve")
    if curve is not None and not (isinstance(curve, dict) and all(
            isinstance(curve.get(k), str) for k in ("secret_key_file", "server_public_key_file"))):
        raise ConfigError(f"{path} has a malformed curve entry: it needs secret_key_file and "
                          "server_public_key_file; write it again with fabric cluster up --curve.")
    info["path"] = str(path)
    return info
