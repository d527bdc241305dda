"""``fabric.Device``: a device of the cluster, as the broker describes it.

Rule: a plain frozen record made from the broker's WELCOME or DEVICE_LIST; it opens nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Device:
    """A device of the cluster: its global index, the worker that owns it, what it is, and
    whether it was draining when listed (an administrator stopped its worker from taking new
    sessions: opening one there raises ``DeviceDraining``; sessions already open go on)."""

    index: int
    worker: str
    backend: str
    settings: dict[str, Any]
    local: int = 0
    # (not compared: a device that starts or stops draining is still the same device)
    draining: bool = field(default=False, compare=False)

    def __hash__(self) -> int:
        # (its settings, a dict, left out: a device is a key, as the array API's devices are)
        return hash((self.index, self.worker, self.backend, self.local))

    @classmethod
    def from_wire(cls, body: dict[str, Any]) -> "Device":
        """The device a broker's message describes."""
        return cls(int(body["index"]), str(body["worker"]), str(body["backend"]),
                   dict(body.get("settings", {})), int(body.get("local", 0)),
                   body.get("draining") is True)
