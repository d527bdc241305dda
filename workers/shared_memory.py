"""A worker's side of the shared-memory path (``fabric.core.shm``): the probe that agrees to it,
the device's own pool whose slots uploads and moves are written into and their tensors keep,
uploads copied out of a client's segment, and reads and moves written into one.

Rule: a session uses shared memory only after its probe succeeded here: the client's boot id
is this worker's, and the segment the probe names is of one page (a probe's; every pool's
segments are multiples of a huge page), sealed, allocated, held open by a process that is not
this worker, and holds the token the client wrote there. That process is then the session's
client (``ClientProcess``: watched through a pidfd, so that its pid, reused once it ended,
proves nothing), and the session names only: its segments (their names carry its pid), each
checked against its transfer before it is mapped (``fabric.core.shm.PeerSegments``); the
device's own slots offered to that session (``offer``); and, for a moved tensor, a slot of
another process of the client's user (its real user, from ``/proc/PID/status``), or of a
device of this worker that offered it to the same client process. So the worker writes only
where its client could itself. A slot of the device's own pool, once offered to a client
process, is lent again to that process alone (a client keeps its mappings): no client sees
another's data through it. A worker maps others' segments only when sealed; each mapping is
kept while its owner holds the segment (mapping afresh would fault every page in again) and
dropped with the session (a client killed with SIGKILL leaves nothing once the broker closes
its sessions). ``--no-shared-memory`` (``HostSharing.enabled``) answers every probe no.

The device's own pool, and the ``shm_slot`` requests that it answers, are
``workers.device_pool``'s.
"""

from __future__ import annotations

import errno
import mmap
import os
import select
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fabric.core import cross_memory
from fabric.core.errors import ProtocolError
from fabric.core.parallel_copy import ParallelCopy
from fabric.core.protocol import Message, reply_to
from fabric.core.segment_pool import Slot, SlotMemory
from fabric.core.shm import (DEFAULT_POOL_BYTES, IDLE_SECONDS, START_SLOT_BYTES, PeerSegments,
                             Segment, WrongSizeSegment, boot_id, held_segments)
from fabric.core.wire import SegmentRef, decode_segment_ref, device_dtype
from fabric.core.worker_options import WorkerOptions

from .device_session import DeviceSession
from .pins import SessionPins


class LendingPool(Protocol):
    """What a session's segments ask of the device's own pool whose slots they were offered
    (``workers.device_pool.DevicePool``, which builds on this module)."""

    def charge(self, segment: Segment, owner: SessionSegments | None, amount: int) -> None:
        """Charge ``amount`` bytes of ``segment`` to ``owner`` (None: the device)."""

    def settle(self) -> None:
        """Charge the device for its free segments, and no one for those it closed."""

    def give_back_from_any_thread(self, slot: Slot, retire: bool = False) -> None:
        """Take ``slot`` back, from whatever thread."""


@dataclass(frozen=True)
class HostSharing:
    """What the worker's options say of shared memory with clients on its host, and the
    copier into and out of it (``fabric.core.parallel_copy``) that its devices share: one per
    worker, held by each device's ``Executor`` (``workers.control_io`` joins the copier's
    threads as it closes)."""

    enabled: bool = True  # whether this worker agrees to shared memory
    pool_bytes: int = DEFAULT_POOL_BYTES  # each device's own pool
    idle: float = IDLE_SECONDS  # how long a free segment of it is kept
    start_slot: int = START_SLOT_BYTES  # its segment kept for a start slot (0: none)
    copies: ParallelCopy = field(default_factory=lambda: ParallelCopy(threads=1, min_bytes=0))

    @classmethod
    def of(cls, options: WorkerOptions) -> "HostSharing":
        """The sharing ``options`` ask for."""
        return cls(options.shared_memory, options.shared_memory_limit,
                   options.shared_memory_idle, options.start_slot,
                   ParallelCopy(options.copy_threads, options.copy_min_bytes))

# The slots the devices of this worker offered and are not yet used: segment name -> the
# client process (``ClientProcess.key``) offered it, for a move between two devices of this
# worker (``SessionSegments.target``). Each device's thread writes its own entries.
_OFFERED: dict[str, Any] = {}
_OFFERED_LOCK = threading.Lock()
_worker_pid = os.getpid  # (this worker's process: a sans-I/O test plays its client in it)


def user_of(pid: int) -> int | None:
    """The user process ``pid`` runs as: its real, effective, saved and file-system uid, where
    all four are one; None where they are not, or it is gone. (Not the owner of /proc/PID,
    which reads as root for a process that made itself not dumpable.)"""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Uid:"):
                    uids = set(line.split()[1:])
                    return int(uids.pop()) if len(uids) == 1 else None
    except (OSError, ValueError):
        pass
    return None


def start_time(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class ClientProcess:
    """A process as it was when this worker first looked at it: ``pid``, its user ``uid``
    (``user_of``) and ``key``, which names it among every process this boot; ``same()``
    says whether ``pid`` is still that process (a pid is reused once its process ended),
    through a pidfd (Linux 5.3), else its start time. OSError where it is gone."""

    def __init__(self, pid: int) -> None:
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except OverflowError:  # (a pid no process has)
            raise ProcessLookupError(errno.ESRCH, f"there is no process {pid}") from None
        except OSError as exc:
            if exc.errno != errno.ENOSYS:
                raise
            self._pidfd = None
        self.pid = pid
        self.uid = user_of(pid)
        self.key = (pid, start_time(pid))
        if self.key[1] is None:
            self.close()
            raise ProcessLookupError(errno.ESRCH, f"process {pid} is gone")

    def same(self) -> bool:
        """Whether ``pid`` is still the process it was."""
        if self._pidfd is None:
            return start_time(self.pid) == self.key[1]
        watch = select.poll()
        watch.register(self._pidfd, select.POLLIN)
        return not watch.poll(0)  # (a pidfd turns readable once its process ended)

    def close(self) -> None:
        """Stop watching it."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None


class SessionSegments:
    """The shared memory of one session: its client process and its segments, as this
    worker maps them, the slots of the device's own pool offered to its uploads and not yet
    used, those its client's reads pin (``workers.pins``), and the bytes of the
    device's pool charged to it (``workers.device_pool.DevicePool``; not in its ``resident``
    bytes)."""

    def __init__(self, process: ClientProcess) -> None:
        self.process = process
        self.client = PeerSegments(process.pid, process.same)
        self.reads_memory = False  # whether this worker may read the client's memory
        # (``read_from_client``: its probe said so)
        self.peers: dict[int, PeerSegments] = {}  # other processes' segments moves go to
        self.watched: list[ClientProcess] = []  # (those processes)
        self.offered: dict[str, tuple[LendingPool, Slot]] = {}
        self.start: str | None = None  # the segment of its start slot, once lent or being made
        self.charged = 0
        self.closed = False
        self.pins = SessionPins()
        self.pruned = time.monotonic()  # when closed segments were last unmapped (``prune``)

    def slot(self, ref: Any) -> np.ndarray:
        """The bytes of the client's slot ``ref`` (``fabric.core.wire.decode_segment_ref``);
        ProtocolError for a slot of another process, past its segment's end, or in a segment
        not of the size it needs."""
        slot = decode_segment_ref(ref)
        if slot.owner.pid != self.client.pid or slot.owner.boot != boot_id():
            raise ProtocolError("A shared-memory slot must be in a segment of the process that "
                                "agreed to shared memory for this session (its client).")
        return _slot_bytes(self.client.map(slot.name, slot.offset, slot.nbytes), slot)

    def target(self, ref: Any) -> np.ndarray:
        """The bytes of slot ``ref`` for a tensor moved to another session to be written
        into: the client's (``slot``); one that a device of this worker offered to the same
        client process; or one of another process of the client's user on this host (a
        device's own, of another worker: the moved tensor keeps it there). ProtocolError for
        any other: this worker writes only where its client itself could."""
        slot = decode_segment_ref(ref)
        pid = slot.owner.pid
        if pid == self.client.pid:
            return self.slot(ref)
        if slot.owner.boot != boot_id():
            raise ProtocolError("A tensor may be moved only into a slot of shared memory of "
                                "this host.")
        if pid == _worker_pid():
            with _OFFERED_LOCK:
                lent = _OFFERED.get(slot.name) == self.process.key
            if not lent:
                raise ProtocolError("A tensor may be moved into a slot of this worker's own "
                                    "only where one of its devices offered it to the same "
                                    "client (shm_slot) and it is not yet used.")
        elif pid not in self.peers:
            try:
                process = ClientProcess(pid)
            except OSError:
                raise ProtocolError(f"The process that owns shared-memory segment "
                                    f"{slot.name} is gone.") from None
            if process.uid is None or process.uid != self.process.uid:
                process.close()
                raise ProtocolError("A tensor may be moved only into a slot of its client or "
                                    "of another process of the same user on this host.")
            self.watched.append(process)
            self.peers[pid] = PeerSegments(pid, process.same)
        if pid not in self.peers:  # (this worker's own: trusted)
            self.peers[pid] = PeerSegments(pid)
        return _slot_bytes(self.peers[pid].map(slot.name, slot.offset, slot.nbytes), slot)

    def lend(self, pool: LendingPool, slot: Slot) -> None:
        """``slot`` of the device's own ``pool`` is offered to this session's uploads."""
        name = slot.segment.name
        self.offered[name] = (pool, slot)
        with _OFFERED_LOCK:
            _OFFERED[name] = self.process.key
        pool.charge(slot.segment, self, slot.segment.size)

    def take(self, name: str) -> tuple[LendingPool, Slot]:
        """The offered slot ``name``, used now (its charge stays until its user says)."""
        pool, slot = self.offered.pop(name)
        with _OFFERED_LOCK:
            _OFFERED.pop(name, None)
        return pool, slot

    def give_back(self, name: str) -> None:
        """The offered slot ``name`` was never used: back to its pool."""
        pool, slot = self.take(name)
        pool.give_back_from_any_thread(slot)

    def prune(self, idle: float) -> None:
        """Unmap the segments their owners closed, at most once every ``idle`` seconds (a
        look at each owner's open files)."""
        now = time.monotonic()
        if now - self.pruned > idle:
            self.pruned = now
            for peer in (self.client, *self.peers.values()):
                peer.prune()

    def close(self) -> None:
        """Unmap the client's segments and the others', give the unused offered slots back,
        retire the pinned ones, and stop watching the processes."""
        self.closed = True
        self.client.close()
        for peer in self.peers.values():
            peer.close()
        for name in list(self.offered):
            self.give_back(name)
        self.pins.retire()
        for process in (self.process, *self.watched):
            process.close()


def _slot_bytes(segment: Segment, slot: SegmentRef) -> np.ndarray:
    """The bytes of ``slot`` in ``segment``; ProtocolError where it reaches past the end."""
    if slot.offset + slot.nbytes > segment.size:
        raise ProtocolError(f"A slot of {slot.nbytes} bytes at {slot.offset} does not fit "
                            f"in segment {slot.name} ({segment.size} bytes).")
    return segment.memory[slot.offset:slot.offset + slot.nbytes]


def probe(executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer a ``shm_probe`` (an ``Executor`` request): whether this session may use shared
    memory, and why not; ProtocolError for a probe no client of fabric's makes (one naming
    a segment of this worker, or of the wrong size, or a second naming another process)."""
    process = _proved(message.body, executor.sharing.enabled)
    if isinstance(process, str):
        return [reply_to(message, {"shared_memory": False, "reason": process})]
    if session.segments is not None:
        again = session.segments.process.key == process.key
        process.close()
        if not again:
            raise ProtocolError("This session already agreed to shared memory with another "
                                "process: a session's client proves itself once; open a new "
                                "session for another process.")
    else:
        session.segments = SessionSegments(process)
        session.segments.reads_memory = _reads_memory(process, message.body)
    return [reply_to(message, {"shared_memory": True,
                               "reads_memory": session.segments.reads_memory})]


def _reads_memory(process: ClientProcess, body: dict[str, Any]) -> bool:
    """Whether this worker can read the memory of the client ``process`` proved: the probe's
    ``"heap"`` (the address of 8 bytes of the client's own, holding its token) reads as the
    token (a client that predates it names none)."""
    address, token = body.get("heap"), np.zeros(1, np.uint64)
    if not _an_address(address):
        return False
    try:
        cross_memory.read(process.pid, address, token)
    except OSError:  # no right to ptrace it (another user, Yama), or no such bytes
        return False
    return int(token[0]) == body.get("token") and process.same()


def _an_address(value: Any) -> bool:
    """Whether ``value``, as a peer sent it, can be an address in a 64-bit process."""
    return type(value) is int and 0 < value < 1 << 64


def _proved(body: dict[str, Any], enabled: bool) -> ClientProcess | str:
    """The client process the probe in ``body`` proves, or why it proves none (none where
    this worker does not share memory: not ``enabled``)."""
    if not enabled:
        return "this worker was started with --no-shared-memory"
    if body.get("boot") != boot_id() or not boot_id():
        return "the client runs under another kernel (another host or virtual machine)"
    probed = decode_segment_ref([body.get("segment"), 0, 8])
    if probed.owner.pid == _worker_pid():
        raise ProtocolError("A shm_probe must name a segment its client process made "
                            "(fabric.connect(..., shared_memory=fabric.SharedMemory()) makes "
                            "one), never one of the worker's own.")
    try:
        process = ClientProcess(probed.owner.pid)
    except OSError:
        return "this worker cannot see the client's process (another pid namespace, or gone)"
    try:
        segment = Segment.open(probed.name, held_segments(process.pid)[probed.name],
                               (mmap.PAGESIZE, mmap.PAGESIZE))
    except WrongSizeSegment as exc:
        process.close()
        raise ProtocolError(f"A shm_probe names a segment of one page, allocated, as fabric's "
                            f"SharedMemory makes it; segment {exc}.") from None
    except (OSError, KeyError):
        process.close()
        return ("this worker cannot map the client's shared memory (another pid namespace, "
                "another user, or a segment not sealed against shrinking)")
    try:
        token = int(segment.memory[:8].view(np.uint64)[0])
    finally:
        segment.close()
    if token != body.get("token") or not process.same():
        process.close()
        return "the probe's segment does not hold the client's token"
    return process


def closed(executor: Any, session: DeviceSession) -> None:
    """``session`` closed (its client closed it, or the broker found the client gone): its
    mappings go, and the slots offered to it go back to the device's pool."""
    if session.segments is not None:
        session.segments.close()
        if executor.slots is not None:
            executor.slots.settle()


def segments_of(session: DeviceSession) -> SessionSegments:
    """The session's client segments; ProtocolError if it never agreed to shared memory."""
    if session.segments is None:
        raise ProtocolError("This session has not agreed to shared memory (shm_probe) with "
                            "this worker: send arrays in the message instead.")
    return session.segments


def uploaded(session: DeviceSession, params: dict[str, Any]) -> np.ndarray:
    """The array a ``put`` (or a TRANSFER) placed in shared memory: the device's own slot
    offered for it (the put names its start and the array's bytes, which may be fewer than
    the slot's), which the array keeps until it is collected; or a view of the client's
    slot (which the client reuses once the put ran: ``owned`` copies it)."""
    dtype = device_dtype(params["dtype"])
    segments = segments_of(session)
    ref = decode_segment_ref(params["shm"])
    if ref.name in segments.offered:
        pool, slot = segments.take(ref.name)
        try:
            if ref.offset != slot.offset or ref.nbytes > slot.nbytes:
                raise ProtocolError("A put must name the start of the slot it was offered, "
                                    "and at most the slot's bytes.")
            values = slot._replace(nbytes=ref.nbytes).array(dtype, params["shape"])
        except BaseException:
            pool.give_back_from_any_thread(slot)
            pool.settle()
            raise
        # (its tensor is charged its own bytes when stored; the session, the rest of the slot)
        pool.charge(slot.segment, segments, slot.segment.size - values.nbytes)
        holder = SlotMemory(values, writable=False, lent=(pool, slot))
        weakref.finalize(holder, pool.give_back_from_any_thread, slot)
        return np.asarray(holder)
    session.slots_used = True  # (its client waits for the CREDIT of this batch to reuse it)
    return segments.slot(params["shm"]).view(dtype).reshape(params["shape"])


def declared(params: dict[str, Any]) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype that a transfer read out of another process's memory declares (a
    put's ``"from"``, a TRANSFER's ``"lent"``), which say how many bytes it reads;
    ProtocolError for a shape that is not a list of whole numbers of at least 0."""
    shape = params.get("shape")
    if type(shape) is not list or len(shape) > 64 \
            or not all(type(length) is int and length >= 0 for length in shape):
        raise ProtocolError("A transfer read from another process's memory needs a shape: a "
                            "list of at most 64 whole numbers of at least 0.")
    return tuple(shape), device_dtype(params.get("dtype"))


def read_from_client(session: DeviceSession, address: Any, into: np.ndarray,
                     copies: ParallelCopy) -> np.ndarray:
    """``into``, filled with the bytes at ``address`` in ``session``'s client process (a put's
    ``"from"``: its array, C-contiguous, which the client lets change only once this batch's
    CREDIT came): one copy, by ``copies``' threads, into memory of this worker's own
    (``fabric.core.cross_memory``). ProtocolError where the probe found the client's memory
    unreadable, the client is gone, or the bytes are not all its own."""
    _client_memory(session, cross_memory.read, address, into, copies, "upload")
    return into


def _client_memory(session: DeviceSession, copy: Any, address: Any, local: np.ndarray,
                   copies: ParallelCopy, what: str) -> None:
    """``copy`` (``cross_memory.read`` or ``write``, by ``copies``' threads) between ``local``
    and ``address`` in ``session``'s client process; ProtocolError as ``read_from_client``
    says."""
    segments = segments_of(session)
    if not segments.reads_memory:
        raise ProtocolError(f"This worker cannot reach this session's client's memory (its "
                            f"probe said so): {what} through a shared-memory slot.")
    if not _an_address(address) or not segments.process.same():
        raise ProtocolError("A transfer through the client's memory names the address of "
                            "its bytes in the client process that probed, while it lives.")
    try:
        copy(segments.process.pid, address, local, copies)
    except OSError as exc:
        raise ProtocolError(f"The client's {local.nbytes} bytes at {address:#x} could not be "
                            f"reached ({exc.strerror}) for the {what}: they must stay mapped "
                            "until it returns.") from None


def owned(copies: ParallelCopy, array: np.ndarray) -> np.ndarray:
    """``uploaded``'s array as the tensor's own: a slot it keeps as it is, a view of the
    client's copied (by ``copies``)."""
    if isinstance(array.base, SlotMemory):
        return array
    copied = np.empty_like(array)
    copies.copy(copied, array)
    return copied


def carry_in_slot(copies: ParallelCopy, session: DeviceSession, ref: Any, array: np.ndarray,
                  body: dict[str, Any]) -> None:
    """Write ``array`` into slot ``ref`` by ``copies`` (a ``send`` op's ``into``: a tensor
    moved to another session through shared memory; ``SessionSegments.target``) and name the
    slot in the TRANSFER's ``body``; or, where the slot is not one, put the error there for the
    tensor to carry."""
    try:
        target = segments_of(session).target(ref)
        if target.nbytes != array.nbytes:
            raise ProtocolError(f"A slot of {target.nbytes} bytes cannot hold the tensor's "
                                f"{array.nbytes}.")
    except ProtocolError as exc:
        body["error"] = exc.to_wire()
        return
    copies.copy(target.view(array.dtype).reshape(array.shape), array)
    body["shm"] = ref


def read_into(executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer a ``read_into`` (an ``Executor`` request): the read's bytes (as
    ``Executor._read`` answers) written into the client's slot (``"into"``), or straight
    into its own memory (``"into_memory"``: ``[address, nbytes]``, where its probe found
    that this worker may: ``fabric.core.cross_memory``), instead of carried; an error
    reply as it is. With ``"view": True`` (a client that maps it: ``fabric.transport.bulk``),
    a tensor that lies in a slot of the device's own pool is not written: that slot is pinned
    and named (``{"pinned": slot}``), for the client to map; for any other, a request that
    names neither is answered ``{"pinned": None}``."""
    replies = executor._read(session, message)
    if len(replies) != 1 or len(replies[0].buffers) != 1:
        return replies
    data = replies[0].buffers[0]
    if message.body.get("view") is True:
        pinned = segments_of(session).pins.pin(executor, session,
                                               session.tensors.get(message.body.get("id")))
        if pinned is not None:
            executor.tally.went_shared(data.nbytes)
        if pinned is not None or "into" not in message.body and "into_memory" not in \
                message.body:  # (None: the client, which lent no slot, counted on a pin;
            # it reads again)
            return [replies[0]._replace(body={**replies[0].body, "pinned": pinned},
                                        buffers=())]
    if "into_memory" in message.body:  # [address, nbytes] in the client's own memory
        address, nbytes = _memory_target(message.body["into_memory"])
        values = np.frombuffer(data, np.uint8)
        if nbytes != values.nbytes:
            raise ProtocolError(f"A read_into of {nbytes} bytes cannot take the tensor's "
                                f"{values.nbytes}.")
        _client_memory(session, cross_memory.write, address, values,
                       executor.sharing.copies, "read")
        executor.tally.went_shared(values.nbytes)
        return [replies[0]._replace(buffers=())]
    target = segments_of(session).slot(message.body.get("into"))
    if target.nbytes != data.nbytes:
        raise ProtocolError(f"A read_into slot of {target.nbytes} bytes cannot hold the "
                            f"tensor's {data.nbytes}.")
    executor.sharing.copies.copy(target, data)
    executor.tally.went_shared(data.nbytes)
    return [replies[0]._replace(buffers=())]


def _memory_target(target: Any) -> tuple[int, int]:
    """A ``read_into``'s ``"into_memory"``: the address and size of the client's memory."""
    if type(target) is not list or len(target) != 2 \
            or not all(type(n) is int and n >= 0 for n in target):
        raise ProtocolError("A read_into's into_memory is [address, nbytes].")
    return target[0], target[1]


def unpin(executor: Any, session: DeviceSession, message: Message) -> list[Message]:
    """Answer an ``unpin`` (an ``Executor`` request, ``{"slots": [name, ...]}``): the client's
    arrays read from those pinned slots are gone (``workers.pins``)."""
    segments_of(session).pins.unpin(executor, session, message.body.get("slots"))
    return [reply_to(message, {"ok": True})]
