"""A worker's default identity: its host's name and the lowest slot free on that host.

Rule: a slot is held by a live process and by nothing else. The claim is an abstract Unix
socket (Linux) bound under a name made of the broker's address and the slot number: the kernel
lets one process bind it and frees it the moment that process ends, however it ends (SIGKILL
included). So workers of one host that start at once get distinct slots, and ``N`` workers
restarted by a supervisor take back slots ``0..N-1``, and with them their names and device
indexes, at once. The host decides, not the broker: the broker cannot tell a killed worker's
registration from a live one until its liveness bound passes, and would hand a prompt restart
a new slot. Slots are per broker address, so clusters sharing a host do not shift each other.
"""

from __future__ import annotations

import errno
import hashlib
import socket

from fabric.core.errors import ConfigError

MAX_SLOTS = 4096  # unnamed workers of one broker on one host


class HostSlot:
    """A claimed slot: ``name`` (``HOST/SLOT``), held until ``close()`` or the process ends."""

    def __init__(self, host: str, slot: int, claim: socket.socket) -> None:
        self.host = host
        self.slot = slot
        self.name = f"{host}/{slot}"
        self._claim = claim

    def close(self) -> None:
        """Free the slot for another worker of this host."""
        self._claim.close()


def claim_slot(broker: str, host: str | None = None) -> HostSlot:
    """Claim the lowest slot no live process of this host holds for the broker at ``broker``.

    ``host`` defaults to this machine's host name. Raises ConfigError when all ``MAX_SLOTS``
    are held; OSError where abstract Unix sockets do not exist (outside Linux: give a name).
    """
    host = host or socket.gethostname()
    scope = hashlib.sha256(broker.encode()).hexdigest()[:24]
    for slot in range(MAX_SLOTS):
        claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            claim.bind(f"\0fabric-worker-slot-{scope}-{slot}")
        except OSError as exc:
            claim.close()
            if exc.errno != errno.EADDRINUSE:
                raise
            continue
        return HostSlot(host, slot, claim)
    raise ConfigError(f"All {MAX_SLOTS} worker slots of this host for {broker} are held: "
                      "give each worker a --name.")
