"""The broker's worker table: which workers are connected, their lanes, and device numbering.

Rule: every device has one global index for the broker's life. A worker name seen for the
first time gets the next indexes after the highest ever given, whatever the name sorts as;
a lost worker keeps its indexes, so no device ever moves, and gets them back when it
registers again under its name (one that comes back with more devices gets new indexes for
the extra ones, after the highest). A name held by a live worker is not taken over by
another process (``name_held``): only the same worker process reconnecting (its REGISTER
carries the random instance id of its first), or a worker whose old connection is gone,
replaces the registration of its name. A holder that is only quiet (busy) keeps it: its
connection goes when its process ends, or when its link is silent past the liveness bound
(``broker.registry``), and the newcomer retries that long.

Lanes: a worker may give each device its own socket (its "lane", a routing identity listed in
REGISTER), so that a device's traffic skips the worker's control thread. A lane is routable
once it has said HEARTBEAT (sent after REGISTERED), so a worker's devices come online only
when all its lanes have. Its beacon (one more routing identity in REGISTER, a socket that
carries only libzmq's heartbeats) is not a lane: nothing it sends is the worker's traffic,
and it is there only to be found unroutable when the worker's link is gone.

An offline worker's last registration (host, address, when last heard from) is kept while its
indexes are, for ``fabric admin workers``.

Traffic of ended sessions is kept here per device (worker name, local index): a device's
totals are forgotten with the device, when more than ``MAX_REMEMBERED_WORKERS`` offline
workers would be remembered, or when an operator forgets an offline worker (``forget``).

The numbering (worker name -> indexes, and how many were ever given) is the broker's only
state worth keeping across a restart: ``state()`` gives it and ``restore`` takes it back, and
``revision`` counts its changes, for the I/O loop that writes it to ``--state-file``.
"""

from __future__ import annotations

import hmac
import logging
import re
from typing import Any

from fabric.core.errors import NotFound, ProtocolError, WorkerNameTaken

from .model import Session, Traffic, Worker

log = logging.getLogger("fabric.broker")

MAX_REMEMBERED_WORKERS = 1024  # offline workers whose device indexes are kept for them


def natural_order(name: str) -> list[Any]:
    """Sort key that orders worker-2 before worker-10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part)
            for part in re.split(r"(\d+)", name)]


class WorkerTable:
    """Connected workers by identity, their lanes, and every device index ever given out."""

    def __init__(self) -> None:
        self.workers: dict[bytes, Worker] = {}
        self.lane_owner: dict[bytes, bytes] = {}  # lane identity -> its worker's identity
        self.beacon_owner: dict[bytes, bytes] = {}  # beacon identity -> its worker's identity
        self.devices: list[dict[str, Any]] = []  # the online devices, by global index
        self._device_info: dict[int, dict[str, Any]] = {}  # global index -> description
        self._device_owner: dict[int, tuple[bytes, int]] = {}  # global index -> (worker, local)
        # Every remembered worker name -> its global indexes, by local index (oldest first).
        self._known: dict[str, list[int]] = {}
        self.device_count = 0  # global indexes ever given: the next name's start after them
        self.device_slots: dict[int, tuple[str, int]] = {}  # global index -> (name, local)
        self.retired: dict[tuple[str, int], Traffic] = {}  # (worker name, local) -> totals
        self.revision = 0  # changes to the numbering (``state()``) so far
        self.lost: dict[str, Worker] = {}  # each remembered offline worker's last registration

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

    def drain(self, name: str, draining: bool) -> Worker:
        """Set whether the connected worker ``name`` takes new sessions (NotFound, changing
        nothing, when there is none); its devices are listed with it."""
        worker = self.named(name)
        worker.draining = draining
        self._list_online()
        return worker

    def replaced_by(self, identity: bytes, name: str) -> list[Worker]:
        """The workers a registration from ``identity`` as ``name`` replaces: a worker that
        restarted (same name) or reconnected (same socket) replaces its earlier self."""
        return [w for w in self.workers.values() if w.name == name or w.identity == identity]

    def name_held(self, identity: bytes, name: str, instance: bytes, now: float,
                  alive_for: float) -> WorkerNameTaken | None:
        """The refusal of a registration as ``name`` from ``identity`` (of worker process
        ``instance``) while another process registered under that name is connected; None
        when the name is free, or is this connection's or this process's own (the instance
        ids match). ``alive_for``: the liveness bound, past which a holder whose link fell
        silent has lost its connection (the newcomer retries that long)."""
        for worker in self.workers.values():
            if (worker.name == name and worker.identity != identity
                    and not (instance and hmac.compare_digest(instance, worker.instance))):
                return WorkerNameTaken(
                    f"Worker name {name!r} belongs to a live worker connected to this broker "
                    f"(heard from {now - worker.last_seen:.1f} s ago): give this worker "
                    f"another --name, or stop the other one first (a worker whose process "
                    f"ended, or whose link is silent for {alive_for:g} s, is replaced).",
                    worker=name, alive_for=alive_for)
        return None

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
                 or self.lane_owner.get(lane, identity) not in own
                 or self.beacon_owner.get(lane, identity) not in own]
        if taken or len(set(lanes)) != len(lanes):
            return ProtocolError("REGISTER lanes must be distinct and not another peer's "
                                 "routing identity: choose fresh random ones.")
        return None

    def beacon_refused(self, identity: bytes, name: str, beacon: Any,
                       lanes: list[bytes]) -> ProtocolError | None:
        """Why REGISTER's ``beacon`` cannot be used, or None: a routing identity of its own,
        not another peer's (a worker re-registering may reuse its own)."""
        if not (isinstance(beacon, bytes) and 0 < len(beacon) < 256 and beacon[0] != 0):
            return ProtocolError("REGISTER beacon must be a routing identity (1-255 bytes, "
                                 "not starting with a zero byte).")
        own = {w.identity for w in self.replaced_by(identity, name)} | {identity}
        if (beacon == identity or beacon in lanes or beacon in self.workers
                or beacon in self.lane_owner
                or self.beacon_owner.get(beacon, identity) not in own):
            return ProtocolError("REGISTER beacon must be distinct and not another peer's "
                                 "routing identity: choose a fresh random one.")
        return None

    def add(self, worker: Worker) -> None:
        """A worker registered (whatever it replaces already removed)."""
        self.workers[worker.identity] = worker
        self.lane_owner.update(dict.fromkeys(worker.lanes, worker.identity))
        if worker.beacon:
            self.beacon_owner[worker.beacon] = worker.identity
        # Re-inserted last: the newest is forgotten last. Indexes only ever grow.
        self.lost.pop(worker.name, None)
        indexes = self._known.pop(worker.name, [])
        self._known[worker.name] = indexes
        for local in range(len(indexes), len(worker.devices)):
            indexes.append(self.device_count)
            self.device_slots[self.device_count] = (worker.name, local)
            self.device_count += 1
        self.revision += 1  # (the order of names changed at least: the oldest go first)
        self._list_online()

    def global_index(self, worker: Worker, local: int) -> int:
        """The global index of a registered worker's device ``local``."""
        return self._known[worker.name][local]

    def forget(self, name: str) -> list[int]:
        """Drop an offline worker's name and its indexes, which are never given again; the
        indexes dropped. NotFound for a name never seen; WorkerNameTaken while it is online."""
        if any(worker.name == name for worker in self.workers.values()):
            raise WorkerNameTaken(f"Worker {name!r} is connected: stop it first (fabric admin "
                                  "drain, then end its process); only an offline worker's "
                                  "indexes can be forgotten.", worker=name)
        if name not in self._known:
            known = ", ".join(sorted(self._known, key=natural_order)) or "none"
            raise NotFound(f"No worker named {name!r} has devices on this broker (known: "
                           f"{known}): list them with fabric admin devices.", worker=name)
        return self._drop(name)

    def _drop(self, name: str) -> list[int]:
        indexes = self._known.pop(name)
        self.lost.pop(name, None)
        for index in indexes:
            del self.device_slots[index]
        for key in [k for k in self.retired if k[0] == name]:
            del self.retired[key]
        self.revision += 1
        return indexes

    def state(self) -> dict[str, Any]:
        """The numbering, as JSON takes it: indexes given so far, and each name's."""
        return {"device_count": self.device_count,
                "workers": {name: list(indexes) for name, indexes in self._known.items()}}

    def restore(self, state: Any) -> None:
        """Take back a numbering ``state()`` gave (before any worker registers); ValueError
        naming what is wrong when it is not one."""
        try:
            count, known = state["device_count"], state["workers"]
            slots = {index: (name, local) for name, indexes in known.items()
                     for local, index in enumerate(indexes)}
            valid = (type(count) is int and all(type(name) is str for name in known)
                     and all(type(i) is int and 0 <= i < count for i in slots)
                     and len(slots) == sum(map(len, known.values())))
        except (TypeError, KeyError, AttributeError):
            valid = False
        if not valid:
            raise ValueError("it is not a device numbering this broker wrote (device_count, "
                             "and each worker's distinct indexes below it)")
        self._known = {name: list(indexes) for name, indexes in known.items()}
        self.device_slots, self.device_count = slots, count

    def attach(self, worker: Worker, lane: bytes) -> None:
        """A lane was heard from: routable now; the worker's devices come online with the
        last of its lanes."""
        worker.attached.add(lane)
        if worker.ready:
            log.info("worker %s: all %d device lanes attached", worker.name, len(worker.lanes))
            self._list_online()

    def remove(self, worker: Worker) -> None:
        """A worker is gone (its sessions already ended): its devices go offline."""
        del self.workers[worker.identity]
        self.lost[worker.name] = worker  # (replaced at once when it re-registers)
        for lane in worker.lanes:
            del self.lane_owner[lane]
        self.beacon_owner.pop(worker.beacon, None)
        self._list_online()

    def retire(self, session: Session) -> None:
        """Fold an ended session's traffic into its device's totals."""
        name = self.workers[session.worker].name  # a session never outlives its worker here
        self.retired.setdefault((name, session.local), Traffic()).add(session)

    def _list_online(self) -> None:
        """Forget the oldest offline workers past ``MAX_REMEMBERED_WORKERS`` (their indexes
        are never given again), and list the online devices by their fixed indexes."""
        while len(self._known) > MAX_REMEMBERED_WORKERS:
            online = {w.name for w in self.workers.values()}
            oldest = next((name for name in self._known if name not in online), None)
            if oldest is None:
                break
            self._drop(oldest)
        self._device_info, self._device_owner = {}, {}
        for worker in self.workers.values():
            if not worker.ready:
                continue
            for local, index in enumerate(self._known[worker.name][:len(worker.devices)]):
                info = {"index": index, "worker": worker.name, "local": local,
                        "backend": worker.backend, "settings": worker.devices[local],
                        "draining": worker.draining}
                self._device_info[index] = info
                self._device_owner[index] = (worker.identity, local)
        self.devices = [self._device_info[index] for index in sorted(self._device_info)]
