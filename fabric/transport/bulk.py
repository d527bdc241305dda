"""A session's shared-memory path: large uploads and moves through segments
(``fabric.core.shm``) instead of inside messages, when its worker shares this host (reads:
``fabric.transport.bulk_reads``).

Rule: a session asks its worker once, as it opens or at its first array of at least the
threshold (``shm_probe``, ``fabric.core.wire``: ``fabric.transport.probe``); until the
worker agrees, and whenever no slot is free, the session is off or the op stream is being
captured, every array takes the socket path as before, so this path only ever replaces a
transfer the socket path would make. An upload or a move goes into a slot the receiving
device lends from its own pool (``shm_slot``; for an upload, one lent ahead, whose answer
has come or is waited for a bounded time: ``fabric.transport.slots_ahead``), else, for an
upload the device is idle for and whose worker may read this process's memory, no slot: the
worker reads the array itself (``_upload_from_memory``), else into one of the connection's
pool. A tensor written into a slot of its device's own pool is noted
(``Session.in_device_slots``): its reads may show or copy that slot. Small arrays never come
here: the caller tests the size first. An upload buffer (``upload_buffer``) is a slot the
device lent, handed to the caller to write in; ``seal`` makes it the tensor, as an upload into
a lent slot, without the copy.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import Any, Iterator, Literal, NamedTuple

import numpy as np

from fabric.arrays.indexing import as_shape
from fabric.arrays.origins import issued_at
from fabric.arrays.tensor import Tensor
from fabric.core.errors import ProtocolError, RequestTimeout
from fabric.core.protocol import Kind, Message, request_message
from fabric.core.segment_pool import SegmentPool, Slot
from fabric.core.shm import fits
from fabric.core.wire import SegmentRef, decode_segment_ref, device_dtype
from fabric.transport import probe
from fabric.transport.probe import pool_of

# (A session is typed Any here: fabric.client.session imports this module.)


SLOT_SECONDS = 2.0  # an upload's wait for a slot asked ahead, not yet answered (``_on_its_way``)
WARM_AFTER = 0.05  # an upload warms memory for a read after this long (``_warm_for_read``)


def upload(session: Any, array: np.ndarray) -> Tensor | None:
    """``array`` uploaded through shared memory, as a new tensor (its put sent at once):
    written into a slot the device lent ahead (which the tensor then keeps: one copy in
    all); or else, where no slot of this process's pool that fits is free and the worker
    can, read by the worker straight out of ``array`` (``_upload_from_memory``: one copy,
    into new memory of the worker's); or else into a slot of this process's pool (which the
    worker copies out); None, sending nothing, where it must take the socket path. The only
    waits are for the read out of ``array``, and, where the worker cannot read it, for the
    answer to a slot asked for ahead that fits and has not come (its segment being made:
    ``_on_its_way``); the slot for a later upload is asked for now (where the worker cannot
    read this process's memory, or the size came before: a start slot's first of its size
    is followed by a read out of memory), its answer taken then
    (``fabric.transport.slots_ahead``)."""
    if array.nbytes < session.connection.shared_memory.threshold or session.stream.sinks \
            or array.nbytes > session.max_upload_bytes:
        return None  # (a capture keeps the put to replay; too large: the socket path says so)
    dtype = device_dtype(array.dtype).newbyteorder("=")
    pool = pool_of(session)
    if pool is None:
        return None
    lent = _lent_ahead(session, pool, array.nbytes)
    if lent is None and _read_from_memory(session, pool, array, dtype):
        tensor = _upload_from_memory(session, pool, array)
        after_memory_read(session, array.nbytes)
        _warm_for_read(session, pool, array.nbytes)
        return tensor
    if lent is None:
        lent = _on_its_way(session, pool, array.nbytes)
    values = device_memory(session, pool, lent, array.nbytes) if lent is not None else None
    if not session.probe.reads_memory or session.slots_ahead.read_from_memory.again(
            array.nbytes):  # (a first of its size, in the start slot: the next is read from
        _ask_ahead(session, pool, array.nbytes)  # memory; before the put: answered sooner)
    slot = None if values is not None else pool.acquire(array.nbytes)
    if slot is not None:
        values, ref = slot.array(np.uint8, (slot.nbytes,)), slot.ref()
    elif values is None:
        return None
    else:
        ref = [lent.name, lent.offset, array.nbytes]  # (the slot's start: it may be larger)
        pool.transfers += 1  # (an own slot counts itself when lent)
    pool.copies.copy(values.view(dtype).reshape(array.shape), array)  # (any layout and
    # byte order)
    tensor = _put(session, array.shape, dtype, {"shm": ref})
    stream = session.stream
    if slot is None:
        session.in_device_slots[tensor.id] = tensor
    try:
        session.flush()  # (an own slot is held until the put ran: send it now)
    finally:  # its batch, sent, or the next if this one waits for credit
        if slot is not None:
            pool.lend_until(slot, session.id,
                            stream.counts["batches_sent"] + (1 if stream.batch else 0))
    return tensor


def _put(session: Any, shape: tuple[int, ...], dtype: np.dtype,
         source: dict[str, Any]) -> Tensor:
    """A new tensor of ``session``, its put queued: ``shape`` and ``dtype``, its bytes where
    ``source`` says: ``{"shm": [segment name, offset, nbytes]}``, already in that slot, or
    ``{"from": address}``, in this process's memory (``_upload_from_memory``)."""
    stream = session.stream
    tensor = stream.new_tensor(shape, dtype, issued_at())
    stream.enqueue(["put", tensor.id, [], {"dtype": dtype.str, "shape": list(shape),
                                           **source}], None, tensor)
    return tensor


def _warm_for_read(session: Any, pool: SegmentPool, nbytes: int) -> None:
    """An upload of ``nbytes`` bytes went: where a first read of that size would be written
    into this process's own memory (``_read_target``), fault some in ahead for it (a result
    read back is often the size of what went up), on the pool's maker thread, once
    ``WARM_AFTER`` passed: a read, or a ``sync``, that follows at once then has the cores to
    itself (and a read that takes the memory before stops its fault-in)."""
    if session.probe.reads_memory and nbytes not in session.read_sizes:
        pool.warm_ahead(nbytes, WARM_AFTER)


def after_memory_read(session: Any, nbytes: int) -> None:
    """``session``'s worker read an upload or a move of ``nbytes`` bytes out of another
    process's memory: where that size came before (a loop's), a slot is asked for ahead, so
    that a later one finds it warm; asked now, its fault-in takes no core from the read."""
    if session.slots_ahead.read_from_memory.again(nbytes):
        _ask_ahead(session, session.connection.segments, nbytes)


def _read_from_memory(session: Any, pool: SegmentPool, array: np.ndarray,
                      dtype: np.dtype) -> bool:
    """Whether ``array`` goes best by its worker reading it out of this process's memory:
    no slot of this process's pool that fits is free (a fresh one is faulted in 4 KiB at a
    time, and then copied out: ``fabric.core.cross_memory``), the worker said it can read
    here, the array is as the device keeps it (C order, its dtype), and the device, as far
    as this session knows, has run all it was sent, and nothing but frees (which take it no
    time) waits to be sent: the upload waits for the read, so it must not wait for the
    device's other work (an upload never waits for a busy device)."""
    stream = session.stream
    return session.probe.reads_memory and array.flags.c_contiguous and array.dtype == dtype \
        and all(type(entry) is int for entry in stream.batch) \
        and session.connection.pending.done.get(session.id, 0) >= stream.counts["batches_sent"] \
        and pool.free_fitting(array.nbytes) is None


def _upload_from_memory(session: Any, pool: SegmentPool, array: np.ndarray) -> Tensor:
    """``array`` uploaded by its worker reading it straight out of this process's memory
    (``workers.shared_memory.read_from_client``: one copy), as a new tensor: its put sent at
    once, and waited for (its batch's CREDIT comes as soon as it ran, after the ops queued
    before it), so that the caller may change the array once this returns."""
    tensor = _put(session, array.shape, array.dtype, {"from": array.ctypes.data})
    session.flush()
    session._wait_for_device(session.stream.counts["batches_sent"], session.timeout)
    pool.transfers += 1
    return tensor


class UploadBuffer:
    """The memory of an array ``upload_buffer`` made: ``ref``, a slot that ``session``'s
    device lent it, mapped here. Unsealed, it is writable, and the slot goes back to the
    device once the array and its views are collected (with the session's next slot
    request, or its close). Sealed (``seal``), it is read-only and holds the tensor that
    keeps the slot (so no one is lent it while the array lives)."""

    def __init__(self, values: np.ndarray, session: Any, ref: SegmentRef) -> None:
        self.values = values  # keeps the mapping alive as long as any array uses it
        self.session = weakref.ref(session)
        self.tensor: Tensor | None = None  # once sealed
        self.unsealed = [ref]  # (taken by ``seal``; its finalizer must not hold ``self``)
        self.__array_interface__ = values.__array_interface__
        weakref.finalize(self, _unused_back, self.session, self.unsealed)


def _unused_back(session: weakref.ref, unsealed: list[SegmentRef]) -> None:
    """An upload buffer was collected (in any thread): an unsealed one's slot goes back to
    its device with the session's next slot request (none once it closed: its device took
    back what it lent)."""
    live = session()
    if unsealed and live is not None and not live.closed:
        live.slots_ahead.returning.append(unsealed[0])


def upload_buffer(session: Any, shape: Any, dtype: Any) -> np.ndarray:
    """A writable array of ``shape`` and ``dtype`` (C order, zeros or a slot's old bytes)
    for ``seal`` to make a tensor of without a copy: a slot of ``session``'s device's own
    pool, lent ahead or else asked for now (a round trip); an ordinary ``np.empty`` where
    none can be (small, no shared memory, the pool full, a capture), which an upload then
    copies as any other array."""
    shape, dtype = as_shape(shape), device_dtype(dtype).newbyteorder("=")
    if min(shape, default=0) < 0:
        raise ValueError(f"An upload buffer's shape {shape} has a negative dimension.")
    nbytes = math.prod(shape) * dtype.itemsize
    pool = None if session.connection.shared_memory is None or session.stream.sinks \
        or nbytes < session.connection.shared_memory.threshold else pool_of(session)
    lent = None if pool is None else _lent_ahead(session, pool, nbytes)
    if pool is not None:
        if lent is None:  # (asked before the next one ahead: its device makes them in turn)
            device = _lend_from_device(session, pool, nbytes)
            lent = None if device is None else decode_segment_ref(device.reference)
        _ask_ahead(session, pool, nbytes)
    values = None if lent is None else device_memory(session, pool, lent, nbytes)
    if values is None:
        return np.empty(shape, dtype)
    buffer = UploadBuffer(values.view(dtype).reshape(shape), session,
                          lent._replace(nbytes=nbytes))
    array = np.asarray(buffer)
    session.upload_buffers[lent.name, lent.offset] = array  # (slots share segments)
    return array


def close_buffers(session: Any) -> None:
    """``session`` closed: the upload buffers it lent turn read-only (their slots are the
    device's again, to lend to anyone: a write there could land in another's tensor)."""
    for array in list(session.upload_buffers.values()):
        array.flags.writeable = False
    session.upload_buffers.clear()


def seal(session: Any, array: np.ndarray) -> Tensor | None:
    """``array``, a whole unsealed ``upload_buffer`` of ``session``, as a new tensor that
    keeps its slot (its put sent at once, naming the slot: no copy), the array made
    read-only; None for any other array (uploaded as usual: copied)."""
    buffer = array.base
    if type(buffer) is not UploadBuffer or not buffer.unsealed \
            or buffer.session() is not session or session.stream.sinks \
            or array.__array_interface__ != buffer.__array_interface__:
        return None
    tensor = _put(session, array.shape, array.dtype, {"shm": list(buffer.unsealed.pop()[:3])})
    session.in_device_slots[tensor.id] = tensor
    buffer.tensor = tensor
    array.flags.writeable = False
    session.connection.segments.transfers += 1
    session.flush()
    return tensor


def _lent_ahead(session: Any, pool: SegmentPool, nbytes: int) -> SegmentRef | None:
    """A slot for ``nbytes`` bytes that ``session``'s device lent ahead and whose answer has
    come (the answers that came are taken first, without waiting); None where none has. A
    worker that lends none (one that predates it, or answers with something this process
    cannot use) is asked for none again."""
    take_answers(session, pool)
    return None if session.id in pool.slotless else session.slots_ahead.take(nbytes)


def _on_its_way(session: Any, pool: SegmentPool, nbytes: int) -> SegmentRef | None:
    """The slot for ``nbytes`` bytes that ``session``'s device was asked for ahead and has
    not answered yet (making its segment, or running an op), waited for ``SLOT_SECONDS`` at
    most; None where none was asked, or none came by then."""
    ahead = session.slots_ahead
    request = next((request for request, asked in ahead.asked.items()
                    if fits(asked, nbytes)), None)
    if request is None or session.id in pool.slotless:
        return None
    try:
        reply = session.connection.wait_for_reply(request, SLOT_SECONDS, session=session.id,
                                                  keep_on_timeout=True)
    except RequestTimeout:
        return None
    _on_answer(session, pool, request, reply, fault_in=False)
    return _lent_ahead(session, pool, nbytes)


def take_answers(session: Any, pool: SegmentPool, fault_in: bool = False) -> None:
    """Take the answers to ``session``'s slot requests that have come, without waiting (a
    device answers one that no free segment fits once it made the segment); with
    ``fault_in`` (no upload waits to take one), each slot lent is mapped now and faulted in
    on the pool's maker thread (else the upload that takes it faults it in as it maps it)."""
    ahead = session.slots_ahead
    if ahead.asked and session.id not in pool.slotless:
        session.connection.receive_arrived()
        for request in list(ahead.asked):
            reply = session.connection.pending.take(request)
            if reply is not None:
                _on_answer(session, pool, request, reply, fault_in)


def _on_answer(session: Any, pool: SegmentPool, request: int, reply: Message,
               fault_in: bool) -> None:
    """Note the answer to ``session``'s slot request ``request``; with ``fault_in``, the
    slot it lends (if any) mapped now and faulted in on the pool's maker thread."""
    slot = _lent_slot(session, pool, reply)
    session.slots_ahead.on_answer(request, slot)
    values = None if not fault_in or slot is None \
        else device_memory(session, pool, slot, slot.nbytes, populate=False)
    if values is not None:
        pool.fault_in(values)


def at_open(session: Any) -> None:
    """``session`` opened: its probe is sent (``fabric.transport.probe.at_open``), and, where
    it is its connection's first (this process's first upload is its), right behind it the
    request for its start slot (``fabric.transport.slots_ahead``), which its device answers
    after the probe. The answer is not waited for: waited for here, it made connecting 3.3
    ms slower (8.0 ms against 4.7, medians of 20), more than it saved the first upload; it
    is taken with the session's next reply (``after_reply``), or by its first upload."""
    if probe.at_open(session) and session.probe is not None \
            and session.probe.request is not None:  # (its connection's first: options set)
        start = session.connection.shared_memory.start_slot
        if start:
            _ask_ahead(session, session.connection.segments, start, start=True)


def after_reply(session: Any) -> None:
    """A reply of ``session``'s came (each round trip's end): the answers to slots asked ahead
    that came are taken, their slots faulted in off this thread (none asked: one look)."""
    if session.slots_ahead.asked and session.connection.segments is not None:
        take_answers(session, session.connection.segments, fault_in=True)


def _lent_slot(session: Any, pool: SegmentPool, reply: Message) -> SegmentRef | None:
    """The slot a ``shm_slot`` answer lends; None where it lends none (its device's pool is
    full, or the device lends none: then it is asked for none again)."""
    if reply.kind is not Kind.REPLY:
        return None  # (the session is lost: its next message says so)
    if "error" in reply.body:  # (a worker that predates it)
        pool.slotless.add(session.id)
        return None
    try:
        return None if reply.body.get("slot") is None else decode_segment_ref(reply.body["slot"])
    except ProtocolError:
        pool.slotless.add(session.id)
        return None


def _ask_ahead(session: Any, pool: SegmentPool, nbytes: int, start: bool = False) -> None:
    """Ask ``session``'s device for a slot of ``nbytes`` bytes for a later upload (``start``:
    its start slot), not waiting for the answer, where ``SlotsAhead.wanted`` allows."""
    ahead = session.slots_ahead
    if session.id in pool.slotless or not ahead.wanted(nbytes, pool.idle_seconds):
        return
    connection = session.connection
    # (alone, never with the batched ops: it need not wait for them)
    ahead.ask(connection.send_request(request_message(session.id, ahead.request(nbytes, start))),
              nbytes)


class DeviceSlot(NamedTuple):
    """A slot a device lent from its own pool (``shm_slot``): the tensor written there
    keeps it, on that device, so it is never the client's to give back."""

    reference: list[Any]

    def ref(self) -> list[Any]:
        """The slot as it travels (``fabric.core.wire``)."""
        return self.reference


def _lend_from_device(session: Any, pool: SegmentPool, nbytes: int) -> DeviceSlot | None:
    """A slot of ``nbytes`` bytes that ``session``'s device lends from its own pool, for a
    move; None where it has none free, or lends none (a worker that predates it, or one
    whose memory this process cannot map: ``device_memory``). A round trip: with ops
    batched before it, after the device ran them; alone, after the op it is running."""
    if session.id in pool.slotless:
        return None
    try:
        ref = session._call({"op": "shm_slot", "nbytes": nbytes}).body.get("slot")
    except ProtocolError:
        pool.slotless.add(session.id)
        return None
    return None if ref is None else DeviceSlot(ref)  # (None: full for now)


def device_memory(session: Any, pool: SegmentPool, slot: SegmentRef, nbytes: int,
                  populate: bool = True) -> np.ndarray | None:
    """The first ``nbytes`` bytes of ``slot``, mapped here (faulted in, unless not
    ``populate``); None, and the device asked for none again, where they cannot be."""
    try:
        segment = pool.peer(slot.owner.pid).map(slot.name, slot.offset, nbytes, populate)
        if slot.nbytes < nbytes or slot.offset + slot.nbytes > segment.size:
            raise ProtocolError(f"The device lent a slot of {slot.nbytes} bytes at "
                                f"{slot.offset} in {segment.size} for {nbytes}.")
    except ProtocolError:
        pool.slotless.add(session.id)
        return None
    return segment.memory[slot.offset:slot.offset + nbytes]


def slot_for_move(session: Any, source: Tensor, moved: Tensor) \
        -> Slot | DeviceSlot | Literal["by_memory"] | None:
    """How ``source`` (a tensor of another session of this process) moves to ``session``
    (``t.to()``): through a slot of shared memory that ``source``'s worker writes into, one
    ``session``'s device lends (the moved tensor keeps it): lent ahead, its answer come
    or on its way; or else ``"by_memory"``, read by ``session``'s worker straight out of
    ``source``'s (``workers.lent_memory``), where both can read this process's memory
    (after it, ``after_memory_read``); or else a slot asked for now (a round trip);
    or else one of this process's pool (``session``'s worker copies it out). None where
    either worker cannot share memory with this process, or neither has a slot free. The
    next move's (or upload's) slot is asked for ahead. ``moved``: the tensor ``source``
    becomes in ``session``."""
    shared = session.connection.shared_memory
    nbytes = source.size * source.dtype.itemsize
    if shared is None or nbytes < shared.threshold \
            or source.session.connection.shared_memory is None:
        return None
    pool = pool_of(session)
    if pool is None or pool_of(source.session) is None:
        return None
    ahead = _lent_ahead(session, pool, nbytes) or _on_its_way(session, pool, nbytes)
    if ahead is None and session.probe.reads_memory and source.session.probe.reads_memory:
        return "by_memory"
    # (the slot asked for now before the next one ahead: its device makes them in turn)
    lent = DeviceSlot([ahead.name, ahead.offset, nbytes]) if ahead is not None \
        else _lend_from_device(session, pool, nbytes)
    _ask_ahead(session, pool, nbytes)
    if lent is None:
        return pool.acquire(nbytes)
    pool.transfers += 1  # (an own slot counts itself when lent)
    session.in_device_slots[moved.id] = moved
    return lent


@contextlib.contextmanager
def lent(pool: SegmentPool | None, slot: Slot | DeviceSlot | None) -> Iterator[None]:
    """Inside: ``slot`` (if any) is in use; after, one of ``pool``'s is given back, or
    closed if what was inside failed (a worker may still write into it). A device's slot
    stays with the tensor moved into it (or, unused, with its session)."""
    own = slot if isinstance(slot, Slot) else None
    try:
        yield
    except BaseException:
        if own is not None:
            pool.discard(own)
        raise
    if own is not None:
        pool.give_back(own)
