"""Tokens and secrets: where they come from, and the rule that keeps them private.

Rule: a token comes from a file (which must not be readable by others), an environment
variable, or a command-line value, in that order; it is never logged or printed.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from .errors import ConfigError


def read_secret_file(path: str | os.PathLike[str]) -> str:
    """The secret in ``path``, refused when group or others can read the file."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"Cannot read {path}: {exc.strerror}.") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path} can be read by other users: run chmod 600 {path}.")
    if not text:
        raise ConfigError(f"{path} is empty: write the token into it.")
    return text


def write_secret_file(path: str | os.PathLike[str], secret: str) -> None:
    """Write a secret to ``path``, created with mode 0600 from the start."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.chmod(path, 0o600)


def new_token() -> str:
    """A fresh random token."""
    return secrets.token_urlsafe(32)


def resolve_secret(value: str | None, file: str | None, env: str) -> str | None:
    """A token from its file, else the environment variable ``env``, else ``value``."""
    if file:
        return read_secret_file(file)
    return os.environ.get(env) or value or None
