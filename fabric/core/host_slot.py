"""A worker's default identity: its host's name and the lowest slot free on that host.

Rule: a slot is held by a live process of the worker's user and by nothing else. The claim is
a lock (``flock``) on a file named after the broker's address and the slot number, in a folder
only that user may write (``slot_folder``): the kernel lets one open file hold the lock and
frees it the moment its process ends, however it ends (SIGKILL included), and no other user
can make, hold or remove the file. (Abstract Unix sockets, the claims before, are one name
space for every user of the host: another user could hold every slot.) So workers of one host
that start at once get distinct slots, and ``N`` workers restarted by a supervisor take back
slots ``0..N-1``, and with them their names and device indexes, at once. The host decides,
not the broker: the broker cannot tell a killed worker's registration from a live one until
its liveness bound passes, and would hand a prompt restart a new slot. Slots are per broker
address, so clusters sharing a host do not shift each other. A worker that ends as it should
removes its file; a killed one leaves it empty, and the slot's next claim takes it over.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import hashlib
import os
import pwd
import socket
import stat
from pathlib import Path

from fabric.core.errors import ConfigError

MAX_SLOTS = 4096  # unnamed workers of one broker on one host
FOLDER_ENV = "FABRIC_HOST_SLOTS"  # a folder of the user's own for the claims, in place of ours


class HostSlot:
    """A claimed slot: ``name`` (``HOST/SLOT``), held until ``close()`` or the process ends
    (closed as it exits, if it exits as it should)."""

    def __init__(self, host: str, slot: int, claim: int, path: Path) -> None:
        self.host = host
        self.slot = slot
        self.name = f"{host}/{slot}"
        self._claim: int | None = claim
        self._path = path
        atexit.register(self.close)

    def close(self) -> None:
        """Free the slot for another worker of this host (its file goes first: a claim that
        opened it meanwhile finds it gone once it holds the lock, and claims afresh)."""
        if self._claim is None:
            return
        atexit.unregister(self.close)
        try:
            os.unlink(self._path)
        except FileNotFoundError:
            pass
        os.close(self._claim)
        self._claim = None


def slot_folder() -> Path:
    """The folder this user's claims on this host live in: ``$FABRIC_HOST_SLOTS`` where it is
    set, else ``~/.cache/fabric/host-slots/HOST`` (the home of the user this process runs as,
    whatever ``$HOME`` says, so that every worker of the user finds the same), else
    ``/tmp/fabric-UID/host-slots``: the first that is, or can be made, a folder of this
    user's that no other user may write into or replace (``private``). ConfigError where
    none is."""
    chosen = os.environ.get(FOLDER_ENV)
    if chosen:
        folder = Path(chosen)
        why = private(folder)
        if why is not None:
            raise ConfigError(f"{FOLDER_ENV}={chosen} cannot hold worker slots: {why}. Name a "
                              "folder only this user may write, or give each worker a --name.")
        return folder
    uid = os.geteuid()
    candidates = [Path(pwd.getpwuid(uid).pw_dir, ".cache", "fabric", "host-slots",
                       socket.gethostname()), Path("/tmp", f"fabric-{uid}", "host-slots")]
    reasons = []
    for folder in candidates:
        why = private(folder)
        if why is None:
            return folder
        reasons.append(f"{folder}: {why}")
    raise ConfigError("No folder can hold this host's worker slots (" + "; ".join(reasons)
                      + f"): set {FOLDER_ENV} to a folder only this user may write, or give "
                      "each worker a --name.")


def private(folder: Path) -> str | None:
    """Make ``folder`` (and its parents) where missing; None where it is a folder of this
    user's that no other may write into, and whose parents no other may rename it in (owned
    by this user or root, and not writable by others unless sticky); else why not."""
    uid = os.geteuid()
    try:
        missing, above = [], folder  # (each made for this user alone, as mkdir -p would
        while not os.path.lexists(above):  # not under a umask that lets a group write)
            missing.append(above)
            above = above.parent
        for made in reversed(missing):
            try:
                os.mkdir(made, 0o700)
            except FileExistsError:
                pass
        found = os.lstat(folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not stat.S_ISDIR(found.st_mode):
        return "it is not a folder"
    if found.st_uid != uid:
        return f"it belongs to user {found.st_uid}"
    if found.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "other users may write into it"
    for parent in Path(os.path.realpath(folder)).parents:
        try:
            above = os.lstat(parent)
        except OSError as exc:
            return exc.strerror or str(exc)
        if above.st_uid not in (uid, 0):
            return f"{parent} belongs to user {above.st_uid}"
        if above.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not above.st_mode & stat.S_ISVTX:
            return f"other users may write into {parent}"
    return None


def claim_slot(broker: str, host: str | None = None, folder: Path | None = None) -> HostSlot:
    """Claim the lowest slot no live process of this user on this host holds for the broker
    at ``broker``, in ``folder`` (default: ``slot_folder()``).

    ``host`` defaults to this machine's host name. Raises ConfigError when all ``MAX_SLOTS``
    are held, or no folder can hold them; OSError where the folder cannot be written.
    """
    host = host or socket.gethostname()
    folder = slot_folder() if folder is None else folder
    scope = hashlib.sha256(broker.encode()).hexdigest()[:24]
    for slot in range(MAX_SLOTS):
        path = folder / f"{scope}-{slot}"
        while True:
            claim = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(claim)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                break  # held: the next slot
            try:
                same = os.path.samestat(os.stat(path), os.fstat(claim))
            except FileNotFoundError:
                same = False
            if same:
                return HostSlot(host, slot, claim, path)
            os.close(claim)  # (its holder removed it as it ended: claim it afresh)
    raise ConfigError(f"All {MAX_SLOTS} worker slots of this host for {broker} are held: "
                      "give each worker a --name.")
