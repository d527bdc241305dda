"""A session's reads through shared memory (the read side of ``fabric.transport.bulk``), for
a tensor of at least the threshold whose worker shares this host.

Rule: a read goes, in this order of preference, into the caller's own array
(``t.numpy(out=)``: the worker writes it there, or, for a tensor that lies in a slot of its
device's own pool, this process copies it out of its mapping of that slot); or, for such a
tensor, shows as that slot itself, without a copy, pinned on the worker until the array read
is collected (``workers.pins``; the unpin goes with the session's next message:
``send_unpins``): mapped copy on write, the caller's own (``t.numpy()``), or shared and
read-only (``t.numpy(copy=False)``); or goes into memory of this process's own the worker
writes (a first read of a size, faulted in ahead where it can be: ``_read_target``); or into
one of the connection's pool. Otherwise (no pool, or no slot free) it takes the socket path.
"""

from __future__ import annotations

import mmap
import weakref
from typing import Any

import numpy as np

from fabric.arrays import read_target
from fabric.arrays.tensor import Tensor
from fabric.core import cross_memory
from fabric.core.errors import ProtocolError
from fabric.core.protocol import Message, request_message
from fabric.core.segment_pool import SegmentPool, Slot, SlotMemory
from fabric.core.wire import SegmentRef, decode_segment_ref, dtype_name
from fabric.transport.bulk import device_memory
from fabric.transport.probe import pool_of

# (A session is typed Any here: fabric.client.session imports this module.)


def start_read(session: Any, tensor: Tensor, pin: bool = True, out: np.ndarray | None = None) \
        -> tuple[int, Slot | mmap.mmap | np.ndarray | None] | None:
    """A read of ``tensor`` into a slot of shared memory, sent: its request id and the
    slot; or ``out``, where the values can be written there as they are
    (``fabric.arrays.read_target.direct``): copied there by this process out of the slot
    the tensor lies in, pinned (``take``), or else written by a worker that said it can;
    or, for a first read of its size, where no slot that fits is free, new memory of this
    process's own that the worker writes (``_read_target``); None, sending nothing, where
    it must take the socket path.
    ``pin``: the device may answer with its own slot instead, pinned (``take``); for a
    tensor written into one (``Session.in_device_slots``), no slot is lent for the read
    (should the device not pin it after all, the read is made again, without a pin)."""
    nbytes = tensor.size * tensor.dtype.itemsize
    if nbytes < session.connection.shared_memory.threshold:
        return None
    pool = pool_of(session)
    if pool is None:
        return None
    body = {"op": "read_into", "id": tensor.id, "dtype": dtype_name(tensor.dtype),
            "shape": tensor.shape}
    pinned = pin and session.id not in pool.slotless
    in_slot = pinned and session.in_device_slots.get(tensor.id) is tensor
    direct = out is not None and read_target.direct(tensor, out)
    if direct and in_slot:  # (copied here out of the slot, mapped warm since written)
        return session._send_request({**body, "view": True}), out
    if direct and session.probe.reads_memory:
        pool.transfers += 1
        return session._send_request({**body, "into_memory": [out.ctypes.data, nbytes]}), out
    if pinned:
        body["view"] = True
        if in_slot:
            return session._send_request(body), None
    target = _read_target(session, pool, nbytes)
    if target is not None:
        pool.transfers += 1
        return session._send_request(
            {**body, "into_memory": [cross_memory.address(target), nbytes]}), target
    slot = pool.acquire(nbytes)
    if slot is None:
        return None
    try:
        request = session._send_request({**body, "into": slot.ref()})
    except BaseException:
        pool.discard(slot)
        raise
    return request, slot


def _read_target(session: Any, pool: SegmentPool, nbytes: int) -> mmap.mmap | None:
    """Memory of this process's own for the worker to write a read of ``nbytes`` bytes into:
    faulted in ahead where an upload of that size made some (``_warm_for_read``), else new
    (``fabric.core.cross_memory.new_memory``: one fault-in, where a new slot is faulted in
    here and then again in the worker's mapping of it); where the worker can, no slot that
    fits is free, and no read of that size came before (``SizesSeen``), or one did and the
    slot that its read had made ahead (``take``: ``SegmentPool.make_ahead``) is still being
    made: a loop's next reads find that slot, warm, where new memory would be faulted in
    each time. None where the read takes a slot (or no memory that large can be had here)."""
    if not session.probe.reads_memory or pool.free_fitting(nbytes) is not None \
            or session.read_sizes.again(nbytes) and not pool.being_made(nbytes):
        return None
    try:
        return pool.take_warm(nbytes) or cross_memory.new_memory(nbytes)
    except OSError:  # (ENOMEM: then no slot either; the sockets say why)
        return None


def take(session: Any, slot: Slot | mmap.mmap | None, tensor: Tensor, copy: bool,
         reply: Message) -> np.ndarray | None:
    """The values a read wrote into ``slot``, as an array over the slot itself, which stays
    lent to it until it and every array made from it are gone: no one else writes there, so
    it is the caller's own (writable), or with ``copy`` False read-only. Where the device
    pinned its own slot instead (``"pinned"``), that slot, which is unpinned once the array
    and every array made from it are collected: with ``copy``, mapped anew copy on write
    (``_own_mapping``: writable, the caller's own, its writes never reaching the slot);
    else a read-only view of the slot's mapping. None where the device pinned none for a
    read that lent it no slot, or this process cannot map it (then unpinned, and the device
    asked for no pins again): the read is then to be made again, without a pin."""
    pool = session.connection.segments
    counted = slot is not None  # (lending a target counted the transfer)
    if isinstance(slot, np.ndarray):  # (the caller's out=: written there, or to copy into)
        return slot if "pinned" not in reply.body else _copy_pinned(session, pool, reply, slot)
    if isinstance(slot, mmap.mmap):
        if "pinned" not in reply.body:  # (written there)
            values = np.frombuffer(slot, tensor.dtype, tensor.size).reshape(tensor.shape)
            values.flags.writeable = copy
            pool.make_ahead(values.nbytes)  # (the next read of the size takes a slot)
            return values
        slot = None  # (the device pinned its own: nothing was written, or will be)
    if "pinned" not in reply.body:
        holder = SlotMemory(slot.array(tensor.dtype, tensor.shape), writable=copy)
        weakref.finalize(holder, pool.give_back_from_any_thread, slot)
        return np.asarray(holder)
    if slot is not None:
        pool.give_back(slot)  # (not written into)
    mapped = _map_pinned(session, pool, reply, tensor.size * tensor.dtype.itemsize, copy)
    if mapped is None:
        return None
    if not counted:
        pool.transfers += 1
    name, values = mapped
    holder = SlotMemory(values.view(tensor.dtype).reshape(tensor.shape), writable=copy)
    weakref.finalize(holder, _unpin_later, weakref.ref(session), name)
    return np.asarray(holder)


def _copy_pinned(session: Any, pool: SegmentPool, reply: Message, out: np.ndarray) \
        -> np.ndarray | None:
    """``out``, holding the values of the device's slot that the reply names as pinned,
    copied on the pool's threads out of this process's mapping of it (which the upload that
    wrote them faulted in), and the slot unpinned with the next message; None as ``take``
    answers it."""
    mapped = _map_pinned(session, pool, reply, out.nbytes, private=False)
    if mapped is None:
        return None
    pool.transfers += 1
    name, values = mapped
    pool.copies.copy(out.reshape(-1).view(np.uint8), values)
    session.unpinning.append(name)
    return out


def _map_pinned(session: Any, pool: SegmentPool, reply: Message, nbytes: int,
                private: bool) -> tuple[str, np.ndarray] | None:
    """The name of the device's slot that ``reply`` names as pinned, and its ``nbytes``
    bytes mapped here: anew copy on write where ``private`` (``_own_mapping``), else this
    process's shared mapping (``_device_memory``). None where the device pinned none, or
    the slot cannot be mapped here (then unpinned with the next message, and the device
    asked for no pins again)."""
    if reply.body["pinned"] is None:
        return None
    try:
        pinned = decode_segment_ref(reply.body["pinned"])
    except ProtocolError:
        pool.slotless.add(session.id)
        return None  # (then unknown to the device: nothing to unpin)
    values = None if pinned.nbytes != nbytes else _own_mapping(pool, pinned) if private \
        else device_memory(session, pool, pinned, nbytes)
    if values is None:
        pool.slotless.add(session.id)
        session.unpinning.append(pinned.name)
        return None
    return pinned.name, values


def _own_mapping(pool: SegmentPool, slot: SegmentRef) -> np.ndarray | None:
    """``slot`` of a device (pinned: it does not change while pinned), mapped anew copy on
    write (``fabric.core.shm.map_private``): the caller's own array, without a
    copy; None where it cannot be."""
    try:
        return pool.peer(slot.owner.pid).private(slot.name, slot.offset, slot.nbytes)
    except ProtocolError:
        return None


def unused(session: Any, slot: Slot | mmap.mmap | np.ndarray, written: bool) -> None:
    """A read's ``slot`` will not be read: back to the pool, where the worker ``written``
    into it (it answered); else, as it may still write, closed (a slot) or retired and kept
    (memory of this process's own: ``fabric.core.cross_memory.retire``; the caller's
    ``out=``, kept alive, so that a late write never lands in memory reused since)."""
    if isinstance(slot, np.ndarray):
        if not written:
            _RETIRED.append(slot)
    elif isinstance(slot, mmap.mmap):
        if not written:
            cross_memory.retire(slot)
            _RETIRED.append(slot)
    elif written:
        session.connection.segments.give_back(slot)
    else:
        session.connection.segments.discard(slot)


# The memory of the reads given up before their workers wrote it: retired, its addresses
# reserved for this process's life (they cost no memory), or a caller's out=, kept
_RETIRED: list[mmap.mmap | np.ndarray] = []


def _unpin_later(session: weakref.ref, name: str) -> None:
    """A view of pinned slot ``name`` was collected (in any thread): unpin it with the
    session's next message (none once it closed: its device retired its pins)."""
    live = session()
    if live is not None and not live.closed:
        live.unpinning.append(name)


def send_unpins(session: Any) -> None:
    """Unpin the slots of ``session``'s collected views (``_unpin_later``), in one request
    sent alone, whose answer no one waits for."""
    names = []
    while session.unpinning:
        names.append(session.unpinning.popleft())
    connection = session.connection
    connection.pending.forget(connection.send_request(
        request_message(session.id, {"op": "unpin", "slots": names})))
