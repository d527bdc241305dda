"""The broker's worker table: which workers are connected, their lanes, and device numbering.

Rule: every device has one global index for the broker's life. Devices are numbered by worker
name (naturally sorted: worker-2 before worker-10), then local index, over every worker seen
so far: a lost worker keeps its indexes, so no other device moves, and gets them back when it
registers again. A worker whose name sorts first may shift later indexes once; the sessions
on them are renumbered with them (this table reads the session records for that alone).

Lanes: a worker may give each device its own socket (its "lane", a routing identity listed in
REGISTER), so that a device's traffic skips the worker's control thread. A lane is routable
once it has said HEARTBEAT (sent after REGISTERED), so a worker's devices come online only
when all its lanes have.

Traffic of ended sessions is kept here per device (worker name, local index): a device's
totals are forgotten with the device, when more than ``MAX_REMEMBERED_WORKERS`` offline
workers would be remembered.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Mapping

from fabric.errors import NotFound, ProtocolError

from .model import Session, Traffic, Worker

log = logging.getLogger("fabric.broker")

MAX_REMEMBERED_WORKERS = 1024  # offline workers whose device indexes are kept for them


def natural_order(name: str) -> list[Any]:
    """Sort key that orders worker-2 before worker-10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", name)]


class WorkerTable:
    """Connected workers by identity, their lanes, and every device index ever given out."""

    def __init__(self, sessions: Mapping[int, Session]) -> None:
        self._sessions = sessions  # read only: to renumber their devices
        self.workers: dict[bytes, Worker] = {}
        self.lane_owner: dict[bytes, bytes] = {}  # lane identity -> its worker's identity
        self.devices: list[dict[str, Any]] = []  # the online devices, by global index
        self._device_info: dict[int, dict[str, Any]] = {}  # global index -> description
        self._device_owner: dict[int, tuple[bytes, int]] = {}  # global index -> (worker, local)
        self._known: dict[str, int] = {}  # every worker name seen -> its device count
        self.device_count = 0  # global indexes in use, online or not
        self.device_slots: list[tuple[str, int]] = []  # global index -> (worker name, local)
        self.retired: dict[tuple[str, int], Traffic] = {}  # (worker name, local) -> totals

    def find(self, identity: bytes) -> Worker | None:
        """The worker that owns this routing identity: its own socket or one of its lanes."""
        return self.workers.get(identity) or self.workers.get(self.lane_owner.get(identity))

    def owner(self, device: int) -> tuple[bytes, int] | None:
        """(worker identity, local index) of an online device; None when it is offline."""
        return self._device_owner.get(device)

    def info(self, device: int) -> dict[str, Any]:
        """The description of an online device (as DEVICE_LIST and WELCOME give it)."""
        return self._device_info[device]

    def named(self, name: str) -> Worker:
        """The connected worker called ``name``; NotFound when there is none."""
        for worker in self.workers.values():
            if worker.name == name:
                return worker
        known = ", ".join(sorted((w.name for w in self.workers.values()), key=natural_order))
        raise NotFound(f"No worker named {name!r} is connected to this broker "
                       f"(connected: {known or 'none'}): list them with fabric admin workers.",
                       worker=name)

    def replaced_by(self, identity: bytes, name: str) -> list[Worker]:
        """The workers a registration from ``identity`` as ``name`` replaces: a worker that
        restarted (same name) or reconnected (same socket) replaces its earlier self."""
        return [w for w in self.workers.values() if w.name == name or w.identity == identity]

    def lanes_refused(self, identity: bytes, name: str, lanes: Any,
                      devices: int) -> ProtocolError | None:
        """Why REGISTER's ``lanes`` cannot be used, or None: one distinct identity per
        device, none of them another peer's (a worker re-registering may reuse its own)."""
        if identity in self.lane_owner:
            return ProtocolError("A device lane cannot register: register from the worker's "
                                 "own socket.")
        if not isinstance(lanes, list) or (lanes and len(lanes) != devices) or not all(
                isinstance(lane, bytes) and 0 < len(lane) < 256 and lane[0] != 0
                for lane in lanes):
            return ProtocolError("REGISTER lanes must list one routing identity per device "
                                 "(1-255 bytes, not starting with a zero byte).")
        own = {w.identity for w in self.replaced_by(identity, name)} | {identity}
        taken = [lane for lane in lanes if lane == identity or lane in self.workers
                 or self.lane_owner.get(lane, identity) not in own]
        if taken or len(set(lanes)) != len(lanes):
            return ProtocolError("REGISTER lanes must be distinct and not another peer's "
                                 "routing identity: choose fresh random ones.")
        return None

    def add(self, worker: Worker) -> None:
        """A worker registered (whatever it replaces already removed)."""
        self.workers[worker.identity] = worker
        self.lane_owner.update(dict.fromkeys(worker.lanes, worker.identity))
        self._known.pop(worker.name, None)  # re-inserted last: the newest is forgotten last
        self._known[worker.name] = len(worker.devices)
        self._renumber()

    def attach(self, worker: Worker, lane: bytes) -> None:
        """A lane was heard from: routable now; the worker's devices come online with the
        last of its lanes."""
        worker.attached.add(lane)
        if worker.ready:
            log.info("worker %s: all %d device lanes attached", worker.name, len(worker.lanes))
            self._renumber()

    def remove(self, worker: Worker) -> None:
        """A worker is gone (its sessions already ended): its devices go offline."""
        del self.workers[worker.identity]
        for lane in worker.lanes:
            del self.lane_owner[lane]
        self._renumber()

    def retire(self, session: Session) -> None:
        """Fold an ended session's traffic into its device's totals."""
        name = self.workers[session.worker].name  # a session never outlives its worker here
        self.retired.setdefault((name, session.local), Traffic()).add(session)

    def _renumber(self) -> None:
        while len(self._known) > MAX_REMEMBERED_WORKERS:  # forget the oldest offline one
            online = {w.name for w in self.workers.values()}
            oldest = next((name for name in self._known if name not in online), None)
            if oldest is None:
                break
            del self._known[oldest]
            for key in [k for k in self.retired if k[0] == oldest]:
                del self.retired[key]
        online = {w.name: w for w in self.workers.values() if w.ready}
        self.devices, self._device_info, self._device_owner = [], {}, {}
        self.device_slots = []
        index = 0
        for name in sorted(self._known, key=natural_order):
            worker = online.get(name)
            for local in range(self._known[name]):
                self.device_slots.append((name, local))
                if worker is not None:
                    info = {"index": index, "worker": name, "local": local,
                            "backend": worker.backend, "settings": worker.devices[local]}
                    self.devices.append(info)
                    self._device_info[index] = info
                    self._device_owner[index] = (worker.identity, local)
                index += 1
        self.device_count = index
        for session in self._sessions.values():  # a new name may sort before theirs
            session.device = next(i for i, owner in self._device_owner.items()
                                  if owner == (session.worker, session.local))
