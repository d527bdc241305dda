"""Attacks on the shared-memory path, run by the tests of ``test_shm_attacks`` as a process of
their own: ``python shm_intruder.py ATTACK JSON``, where JSON holds the attack's arguments
(with ``"user"``, the uid this process takes once it imported what it runs: another Unix
user, where the test runs as root). Each attack prints its findings as one JSON line (and
``ready`` lines where the test must act in between, read from standard input); the test
judges them. Nothing here asserts: an attack that fails is a finding too.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import json
import os
import sys
import time
from typing import Any

import numpy as np

import fabric
import fabric.transport.bulk  # noqa: F401 (imported before this process gives up root)
from fabric.core.errors import FabricError
from fabric.core.shm import SharedMemory, boot_id, segment_name

_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_PR_SET_DUMPABLE = 4


def become(uid: int) -> None:
    """Run as user ``uid`` from now on (its group too, no other), an ordinary process of
    that user: one whose /proc files are its own (dumpable, as setuid() left it not)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    dumpable(True)


def dumpable(flag: bool) -> None:
    """Set whether this process is dumpable (a process that is not shows its /proc files as
    root's: the worker must not take it for one of root's)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, int(flag), 0, 0, 0)


def _outcome(call: Any) -> Any:
    """What ``call()`` returned, or the name of the fabric error it raised."""
    try:
        return call()
    except FabricError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}


def _digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()


def _probe(session: fabric.Session, name: str, token: int) -> Any:
    return _outcome(lambda: session._call({"op": "shm_probe", "boot": boot_id(),
                                           "segment": name, "token": token}).body)


def _put(session: fabric.Session, ref: list[Any]) -> Any:
    """A tensor put from the slot ``ref``, read back through the sockets: its digest."""
    tensor = session.stream.new_tensor((ref[2] // 8,), np.dtype("float64"), None)
    session.stream.enqueue(["put", tensor.id, [], {"dtype": "<f8", "shape": [ref[2] // 8],
                                                   "shm": ref}], None, tensor)
    return _outcome(lambda: _digest(tensor.numpy()))


def _read_into(session: fabric.Session, tensor: fabric.Tensor, ref: list[Any]) -> Any:
    return _outcome(lambda: session._call({
        "op": "read_into", "id": tensor.id, "dtype": "<f8", "shape": list(tensor.shape),
        "into": ref}).body)


def _send_into(source: fabric.Session, destination: fabric.Session, tensor: fabric.Tensor,
               ref: list[Any], ticket: int) -> Any:
    """``tensor.to(destination)`` as the client makes it, but written into slot ``ref``."""
    moved = destination.stream.new_tensor(tensor.shape, tensor.dtype, None)
    destination._call({"op": "expect", "id": moved.id, "ticket": ticket})
    source.stream.enqueue(["send", 0, [tensor.id], {"session": destination.id,
                                                    "ticket": ticket, "into": ref}])
    source.flush()
    destination._call({"op": "await", "id": moved.id})
    return _outcome(lambda: _digest(moved.numpy()))


def others(args: dict[str, Any]) -> dict[str, Any]:
    """Finding 1: probes that name segments of processes other than this one (the worker's
    own, a victim client's) with token 0, which any fresh slot and many arrays hold; then,
    whatever the probes' answers, puts from those segments (reads), ``read_into`` into them
    and a ``send`` into them (writes). And the same after an honest probe of a segment this
    process made."""
    found: dict[str, Any] = {"probes": [], "reads": [], "writes": [], "sends": [],
                             "agreed": [], "still_served": []}
    with fabric.connect(args["address"], token=args["token"], shared_memory=False) as first:
        for owner in (args["worker"], args["victim"]):
            session = first.open(0)
            agreed = None
            for n in range(args["names"]):
                name = segment_name(boot_id(), owner, n)
                answer = _probe(session, name, 0)
                found["probes"].append([name, answer])
                if isinstance(answer, dict) and answer.get("shared_memory") is True:
                    agreed = name
                    break
            found["agreed"].append(agreed)
            _trespass(first, session, (owner, args["victim"]), args, found)
        session = first.open(0)
        for pid in (0, 1, 10**15):  # (no process, init, past any pid)
            found["probes"].append([pid, _probe(session, segment_name(boot_id(), pid, 0), 0)])
        session.close()
        page = os.sysconf("SC_PAGE_SIZE")
        own = _memfd(segment_name(boot_id(), os.getpid(), 9100), page, 79)
        dumpable(False)  # (its /proc files then read as root's, its victims' user)
        try:
            session = first.open(0)
            found["honest_probe"] = _probe(session, segment_name(boot_id(), os.getpid(), 9100),
                                           79)
            _trespass(first, session, (args["worker"], args["victim"]), args, found)
        finally:
            os.close(own)
    return found


def _trespass(connection: fabric.Session, session: fabric.Session, owners: tuple[int, ...],
              args: dict[str, Any], found: dict[str, Any]) -> None:
    """Reads from, and writes into, the first ``names`` segments of each of ``owners`` (by
    a put, a ``read_into``, a ``send`` into a victim's)."""
    nbytes = args["nbytes"]
    scribble = session.asarray(np.full(nbytes // 8, 6.25))  # (through the sockets)
    destination = connection.open(0)
    for n in range(args["names"]):
        ref = [segment_name(boot_id(), args["victim"], n), 0, nbytes]
        found["sends"].append([ref[0], _send_into(session, destination, scribble, ref,
                                                  1000 + n)])
        for owner in owners:
            ref = [segment_name(boot_id(), owner, n), 0, nbytes]
            found["reads"].append([ref[0], _put(session, ref)])
            found["writes"].append([ref[0], _read_into(session, scribble, ref)])
    found["still_served"].append(float(session.arange(4.0).sum().numpy()))
    destination.close()
    session.close()


def _memfd(name: str, size: int, token: int | None = None) -> int:
    """A sealed memfd of ``size`` bytes named ``name``, sparse (nothing allocated) but for a
    page holding ``token`` where given."""
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if token is not None:
        os.pwrite(fd, np.uint64(token).tobytes(), 0)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    return fd


def _allocated(fd: int) -> int:
    return os.fstat(fd).st_blocks * 512


def sparse(args: dict[str, Any]) -> dict[str, Any]:
    """Finding 7: a sealed sparse segment named in a probe, then (after an honest probe)
    slots of sparse segments named in puts: how much of them the worker made real."""
    found: dict[str, Any] = {}
    me = os.getpid()
    big = _memfd(segment_name(boot_id(), me, 9000), args["size"], 77)
    with fabric.connect(args["address"], token=args["token"], shared_memory=False) as session:
        found["probe"] = _probe(session, segment_name(boot_id(), me, 9000), 77)
        found["probe_allocated"] = _allocated(big)
        honest = _memfd(segment_name(boot_id(), me, 9001), os.sysconf("SC_PAGE_SIZE"), 78)
        os.posix_fallocate(honest, 0, os.sysconf("SC_PAGE_SIZE"))
        proved = session.open(0)
        found["honest_probe"] = _probe(proved, segment_name(boot_id(), me, 9001), 78)
        found["small_put"] = _put(proved, [segment_name(boot_id(), me, 9000), 0, 8192])
        found["small_put_allocated"] = _allocated(big)
        hole = _memfd(segment_name(boot_id(), me, 9002), 4 << 20)
        found["hole_put"] = _put(proved, [segment_name(boot_id(), me, 9002), 0, 4 << 20])
        found["hole_put_allocated"] = _allocated(hole)
        found["still_served"] = float(proved.arange(4.0).sum().numpy())
        for fd in (big, honest, hole):
            os.close(fd)
    return found


def _ahead_answered(session: fabric.Session, seconds: float = 10.0) -> None:
    """Wait (``seconds`` at most) until the slots ``session`` asked for ahead are answered (a
    device answers once its pool's thread made the segment)."""
    deadline = time.monotonic() + seconds
    while session.slots_ahead.asked and time.monotonic() < deadline:
        fabric.transport.bulk.take_answers(session, session.connection.segments)
        time.sleep(0.01)


def spy(args: dict[str, Any]) -> dict[str, Any]:
    """Finding 13: upload twice (the second into a slot the device lent), keep this
    client's mappings of the device's segments, let the tensors and the session go, and once
    told (a line on standard input) say what those mappings hold now."""
    values = np.random.default_rng(args["seed"]).random(args["count"])
    with fabric.connect(args["address"], token=args["token"],
                        shared_memory=SharedMemory(cross_memory=False)) as session:
        first = session.asarray(values)
        session.sync()
        _ahead_answered(session)
        second = session.asarray(values * 2)  # into the slot lent ahead
        session.sync()
        kept = [segment.memory for peer in session.connection.segments.peers.values()
                for segment in peer.maps.values()]  # (arrays over the mappings keep them)
        lent = session.slots_ahead.used
        del first, second
        session.sync()
    print(json.dumps({"ready": lent, "mapped": len(kept)}), flush=True)
    sys.stdin.readline()
    nbytes = args["count"] * 8
    return {"digests": [_digest(memory[:nbytes]) for memory in kept if memory.size >= nbytes]}


if __name__ == "__main__":
    attack, arguments = {"others": others, "sparse": sparse, "spy": spy}[sys.argv[1]], \
        json.loads(sys.argv[2])
    if arguments.get("user") is not None:
        become(arguments["user"])
    print(json.dumps(attack(arguments)), flush=True)
