"""What ``fabric top`` shows: snapshots of the admin commands, and a view of two of them.

Rule: ``snapshot`` is the only I/O (the admin commands ``status``, ``workers``, ``devices``
and ``sessions``, read through one ``fabric.Admin``); ``view`` is a pure function of two
snapshots, and every rate in it is a difference of their counts over the time between them.
The broker counts data messages, bytes and SUBMITs (batches of ops: it never decodes the ops
themselves); a device's ops, memory and bytes through shared memory, and a worker's bytes
over direct links, are what its worker last said in a heartbeat (None until it has), so
their rates are over the heartbeats within the interval.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from fabric.client.admin import Admin

Snapshot = Mapping[str, Any]


def snapshot(admin: Admin) -> dict[str, Any]:
    """The broker now: its status, workers, devices and sessions, with the local time."""
    return {"at": time.monotonic(), "address": admin.address, "status": admin.status(),
            "workers": admin.workers(), "devices": admin.devices(),
            "sessions": admin.sessions()}


_COUNTS = ("messages", "bytes", "submits")
# what workers report, past the broker: through shared memory, by device; over direct links
_DEVICE_COUNTS = (*_COUNTS, "ops", "shm_in_bytes", "shm_out_bytes")
_WORKER_COUNTS = (*_COUNTS, "link_sent_bytes", "link_received_bytes")


def _rates(new: Mapping[str, Any], old: Mapping[str, Any] | None, seconds: float,
           counts: tuple[str, ...] = _COUNTS) -> dict[str, float | None]:
    """Per second, of each of ``counts``: ``new``'s less ``old``'s (a row missing from the
    older snapshot, or a count it did not have yet, is new since: all of it is from the
    interval); None where ``new`` has no such count (a device not reported yet)."""
    # (a count never goes back, but a device's totals can be forgotten with its worker)
    return {f"{count}_per_s": None if new[count] is None else 0.0 if seconds <= 0 else
            max(new[count] - ((old or {}).get(count) or 0), 0) / seconds for count in counts}


def view(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """What one frame shows: ``after``'s figures, with rates since ``before``."""
    seconds = after["at"] - before["at"]
    status = after["status"]
    old_devices = {row["index"]: row for row in before["devices"]}
    old_sessions = {row["id"]: row for row in before["sessions"]}
    old_workers = {row["name"]: row for row in before["workers"]}
    return {
        "address": after["address"],
        "interval": seconds,
        "broker": {
            "server": status["server"], "uptime": status["uptime"],
            "workers": status["workers"], "devices_online": status["devices_online"],
            "devices_total": status["devices_total"], "sessions": status["sessions"],
            "sessions_ended": status["sessions_ended"], "traffic": status["traffic"],
            "rejects": sum(status["rejects"].values()), "queues": status["queues"],
            **_rates(status["traffic"], before["status"]["traffic"], seconds)},
        "workers": [{**row, **_rates(row, old_workers.get(row["name"]), seconds,
                                     _WORKER_COUNTS)}
                    for row in after["workers"]],
        "devices": [{**row, **_rates(row, old_devices.get(row["index"]), seconds,
                                     _DEVICE_COUNTS)}
                    for row in after["devices"]],
        "sessions": [{**row, **_rates(row, old_sessions.get(row["id"]), seconds)}
                     for row in after["sessions"]],
    }
