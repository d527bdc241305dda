"""The op stream of one session, sans I/O: tensor ids, batches, frees, origins and credit.

Rule: every op enters a stream through ``OpStream.enqueue``, in the order the user issued it,
from the one thread that owns the session, and is shown first to the stream's sinks (a
``fabric.capture`` trace, a graph ``Tracer``), which may refuse it. The stream batches ops
and the frees of tensors let go between them; when a batch is full it asks its owner to
flush, and the owner hands it on with ``send_batch``. How many batches may wait for the
device is the stream's rule too (``credit_needed``). No socket, no clock: tests drive it with
plain calls.
"""

from __future__ import annotations

import gc
import itertools
import math
from collections import OrderedDict, deque
from threading import get_ident as _get_ident
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from fabric.arrays.origins import Origin
from fabric.arrays.tensor import Tensor
from fabric.core.flow import COMPILES_BATCHES, MAX_BATCH_BYTES, MAX_BATCH_ENTRIES, SUBMIT_WINDOW
from fabric.core.ops import Spec
from fabric.core.protocol import Kind, Message
from fabric.core.session_life import Phase, SessionLife
from fabric.core.wire import op_entry, parse_op

# Flush the op batch at this many entries: ops, and the ids of tensors freed between them
# (the worker frees each where the client let it go, so the next result can take its memory;
# a loop like bench W1's frees one per op) ... The worker cannot start on ops it has not been
# sent, and a read waits for the last batch to run: small batches keep the worker busy while
# the client builds more, and the wait short (10,000 tiny ops, bench W1: 4096 ops a batch
# took a quarter longer than 256; below ~128, each message's own cost starts to show).
# (MAX_BATCH_ENTRIES, and MAX_BATCH_BYTES of uploaded buffers, are in ``fabric.core.flow``: they
# also bound what the broker takes in one message.)
# ... or when its ops touch this many array elements (each op's inputs and output): a few
# milliseconds of float64 work, a fraction of one on int8, against a message's tenth of one
# on each of client, broker and worker. A heavy op is then sent at once, and runs while the
# user's code goes on, instead of waiting for the next read. (At 1 << 20, Game of Life on a
# 256x256 int8 grid sent a message every 7 ops, and its three processes spent 180 ms of CPU
# where numpy spent 45; at 1 << 22, 99 ms: bench/programs.py.)
MAX_BATCH_ELEMENTS = 1 << 22
# ... but not on a device that compiles the batches it sees again (its settings' "compiles"
# say COMPILES_BATCHES): there a batch's ops run as one executable, the larger the faster,
# and a batch cut by its work would be cut elsewhere in each pass of a loop whose ops touch
# large arrays, never seen again (a 1M-element loop sent two ops a batch)


def batch_elements_bound(settings: dict[str, Any]) -> float:
    """The elements a batch's ops may touch before it is sent, on a device of ``settings``."""
    return math.inf if settings.get("compiles") == COMPILES_BATCHES else MAX_BATCH_ELEMENTS
# ... and there a full batch is cut where the loop that fills it repeats (``repeat_cut``): a
# loop's body rarely divides MAX_BATCH_ENTRIES, and batches cut at a count begin at another
# step of it each time, each of those a new batch to compile (bench W5's 100-entry step, at
# 1k elements: 50 batches compiled in 3 s before its loop ran as graphs, where one is enough)
REPEAT_MOST = MAX_BATCH_ENTRIES // 3  # the longest loop body that cuts are aligned to
_FREE = "\0"  # (a free's letter in repeat_cut's spelling of a batch)
# ... or when its graph calls run this many ops. A call costs the client one op and the
# worker all of the graph's: the worker sets the pace, so each message's own cost counts, and
# bigger batches than MAX_BATCH_ENTRIES pay (bench W5).
MAX_BATCH_GRAPH_OPS = 4096
REMEMBERED_ORIGINS = 4096  # at least this many freed tensors' origins, for late errors

_new_object = object.__new__


def repeat_cut(batch: list[Any]) -> int:
    """Where to cut a full ``batch`` (ops and frees, as queued): where its entries, from its
    first quarter on, repeat with a period (a loop's body, up to REPEAT_MOST entries, its
    frees included), the last place in it where a period starts at the same step as every
    other batch of that loop is cut (the step that begins the least of the body's rotations);
    elsewhere its end. An entry is read as its op and how far back each tensor it reads was
    made (one made more than REPEAT_MOST tensors before: far), so a loop's steps spell the
    same each time round."""
    letters: dict[Any, str] = {}
    spelled = []
    for entry in batch:
        if type(entry) is int:
            spelled.append(_FREE)
            continue
        first = entry[0]  # (read by position, as fabric.core.wire.op_entry lists)
        out, name, args = (first, entry[1], entry[2:]) if type(first) is int \
            else (entry[1], first, entry[2])  # (the compact form, or the full one)
        step = (name, *[out - arg if type(arg) is int and out - arg <= REPEAT_MOST
                        else type(arg) is int for arg in args])
        spelled.append(letters.setdefault(step, chr(0x100 + len(letters))))
    text = "".join(spelled)
    tail = text[len(text) // 4:]
    period = next((p for p in range(1, min(REPEAT_MOST, len(tail) // 2) + 1)
                   if tail[p:] == tail[:-p]), None)
    if period is None:
        return len(batch)
    body = text[-period:]
    start = min(range(period), key=lambda step: body[step:] + body[:step])
    return len(batch) - period + start if start else len(batch)


class OpSink(Protocol):
    """What a stream shows each op to before it is batched (and may refuse it by raising)."""

    def record(self, op: Sequence[Any], buffer: Any, result: Spec | None) -> None:
        """``op`` as queued; ``buffer``: the bytes it uploads, if any; ``result``: the
        tensor it makes, if any."""


class StreamOwner(Protocol):
    """What a stream needs of its owner: the one whose tensors it makes (their
    ``.session``), and who sends a full batch on."""

    def flush(self, timeout: float | None = None) -> None:
        """Send the batch now (``OpStream.send_batch``), or keep it (a trace sends none)."""


class OpStream:
    """One session's ops in order: the tensors they make, batched until sent.

    Its fields are read by whoever drives it; two are written from outside, by design:
    ``Tensor.__del__`` appends a freed tensor's id to ``batch`` and ``freed`` (a list append,
    safe from any thread), and ``sinks`` takes and loses captures.
    """

    def __init__(self, owner: StreamOwner, session_id: int = 0,
                 life: SessionLife | None = None) -> None:
        self.owner = owner
        self.session_id = session_id
        # Whether ops may enter, and from which thread (``fabric.core.session_life``): the
        # session's life, or a life of the stream's own (a graph tracer's)
        self.life = SessionLife(session_id) if life is None else life
        self.ids = itertools.count(1)  # tensor ids (``push``)
        # Whether each batch carries its sequence number: a broker pair's session, whose
        # batches may be sent again after a takeover (``fabric.core.resume``); a lone
        # broker's never are, and its reads do not pay for the key
        self.numbered = False
        self.sent_through = 0  # every tensor of an id up to this was made by a batch sent
        self.batch: list[Any] = []  # ops, and ids of tensors freed
        self.buffers: list[Any] = []  # the batch's uploads, by their ops' "buffer" number
        self.batch_bytes = 0
        self.batch_elements = 0  # array elements the batch's ops touch
        self.max_batch_elements = MAX_BATCH_ELEMENTS  # (its owner's device may lift it)
        self.cut_at_repeats = False  # a full batch is cut where its loop repeats
        self.full = False  # (while a full batch is flushed: it may be cut)
        self.batch_graph_ops = 0  # ops of the batch's graph calls (fabric.graphs.function)
        # Where each tensor's op was issued: live tensors', and the last freed ones' (at least
        # REMEMBERED_ORIGINS of them), whose ops may still fail after the user let them go.
        self.origins: dict[int, Origin | None] = {}  # (None: a traced function's input)
        self.freed: list[int] = []  # the freed tensors whose origins are kept, oldest first
        self._freed_counted = 0  # the length of freed after the last batch was sent
        # (batches_sent counts SUBMITs: the device's CREDIT says how many of them it ran)
        # (bytes_uploaded: by every path; the session counts those of shared memory and direct
        # links, the stream those that travel in its batches)
        self.counts = {"ops_sent": 0, "batches_sent": 0, "bytes_uploaded": 0,
                       "bytes_uploaded_by_socket": 0}
        self.sinks: list[OpSink] = []
        self.graphs: OrderedDict[int, Any] = OrderedDict()  # registered graphs, held by the worker

    # -- queueing ------------------------------------------------------------------------------

    def push(self, tensor_id: int, entry: tuple[Any, ...] | None, inputs: int,
             shape: tuple[int, ...], dtype: np.dtype, origin: Origin | None,
             size: int | None = None) -> Tensor:
        """Make tensor ``tensor_id`` of this stream (an id the caller took from ``ids``), the
        result of the op ``entry`` issued at ``origin``, and queue the op (``entry``: in
        either of the wire's forms, ``fabric.core.wire.op_entry``; ``inputs``: the elements it
        reads, counted with those it writes as its work; ``size``: the result's elements,
        when the caller knows them). With ``entry`` None, only the tensor is made
        (``new_tensor``).

        The tensor is made here, not by calling the class (whose call with an ``__init__``
        adds about 800 instructions to each op) nor another method (a frame, 3%); the entry
        by the caller, who has its args at hand (a tuple of them, passed to be copied into
        the entry, cost a twentieth of an op)."""
        tensor = _new_object(Tensor)
        tensor.shape = shape
        tensor.dtype = dtype
        tensor.size = size = math.prod(shape) if size is None else size  # (counted as work)
        tensor.session = self.owner
        tensor.id = tensor_id
        self.origins[tensor_id] = origin
        if entry is None:
            return tensor
        if self.sinks or _get_ident() != self.life.thread:  # (shown to sinks, or refused)
            self.enqueue(parse_op(entry), None, tensor, inputs + size)
            return tensor
        # enqueue's work for an op without upload or graph, here: a call costs a twentieth
        batch = self.batch
        batch.append(entry)
        self.batch_elements = elements = self.batch_elements + inputs + size
        if len(batch) >= MAX_BATCH_ENTRIES or elements >= self.max_batch_elements:
            self.flush_full()
        return tensor

    def push_op(self, name: str, args: tuple[Any, ...], params: dict[str, Any], inputs: int,
                shape: tuple[int, ...], dtype: np.dtype, origin: Origin | None) -> Tensor:
        """``push`` of op ``name`` on ``args`` with ``params`` (both in wire form), as a new
        tensor, its entry in the wire's form (``fabric.core.wire.op_entry``)."""
        tensor_id = next(self.ids)
        return self.push(tensor_id, op_entry(name, tensor_id, args, params), inputs, shape,
                         dtype, origin)

    def new_tensor(self, shape: tuple[int, ...], dtype: np.dtype,
                   origin: Origin | None) -> Tensor:
        """A new tensor of this stream, whose op the caller queues (or that has none: a
        traced function's input), issued at ``origin`` (None: by no op)."""
        return self.push(next(self.ids), None, 0, shape, dtype, origin)

    def enqueue(self, op: Sequence[Any], buffer: Any = None, result: Spec | None = None,
                elements: int = 0, graph_ops: int = 0) -> None:
        """Queue one op entry (``fabric.core.wire``'s form): ``buffer``, the bytes it uploads;
        ``result``, the tensor it makes; ``elements`` and ``graph_ops``, its work. A full
        batch is flushed by the owner before this returns."""
        if _get_ident() != self.life.thread:  # another thread's op, or closed (thread None)
            if result is not None:  # never made on the device, so never to be freed there
                del result.session, self.origins[result.id]
            self.life.check_usable()
        if self.sinks:  # a capture or a tracer: shown the op as it is queued
            for sink in self.sinks:
                sink.record(op, buffer, result)
        self.batch.append(op)
        self.batch_elements += elements
        if buffer is not None:  # (the bytes grow only here: an op without one skips the test)
            self.buffers.append(buffer)
            self.batch_bytes += buffer.nbytes
            if self.batch_bytes >= MAX_BATCH_BYTES:
                self.owner.flush()
                return
        if graph_ops:  # a call is as much work as its ops: keep the worker busy meanwhile
            self.batch_graph_ops += graph_ops
            if self.batch_graph_ops >= MAX_BATCH_GRAPH_OPS:
                self.owner.flush()
                return
        if (len(self.batch) >= MAX_BATCH_ENTRIES
                or self.batch_elements >= self.max_batch_elements):
            self.flush_full()

    def for_device(self, settings: dict[str, Any]) -> None:
        """Batch for a device of ``settings``: one that compiles the batches it sees again
        takes batches of any work, cut where their loop repeats (``repeat_cut``)."""
        self.max_batch_elements = batch_elements_bound(settings)
        self.cut_at_repeats = settings.get("compiles") == COMPILES_BATCHES

    def flush_full(self) -> None:
        """The owner's flush of a full batch, which (unlike a read's or a sync's, which send
        every op queued) may keep the ops past its cut for the next batch."""
        self.full = True
        try:
            self.owner.flush()
        finally:
            self.full = False

    def close(self) -> Phase:
        """Close the session's life, so that every later op is refused, and drop the batch
        (closing the session frees it all); the phase the life was in."""
        self.batch, self.buffers = [], []
        return self.life.close()

    def held(self) -> tuple[int, int]:
        """The tensors of this stream the client still holds, and their bytes on the device
        (a view's left out of the bytes: it shares its base's), from their handles alone.

        Found among the objects that refer to the stream's owner (each tensor's ``session``),
        when asked: keeping a count on each op and free would cost the hot path
        (``push``) for the sake of a display."""
        owner, count, size = self.owner, 0, 0
        for found in gc.get_referrers(owner):
            if type(found) is Tensor and found.session is owner:
                count += 1
                if getattr(found, "_view_of", None) is None:
                    size += found.nbytes
        return count, size

    # -- sending -------------------------------------------------------------------------------

    def credit_needed(self, done: int) -> int | None:
        """Backpressure: with ``done`` of this stream's batches run by the device (its
        CREDIT), how many it must have run before another batch may be sent; None when one
        may go now (fewer than ``fabric.core.flow.SUBMIT_WINDOW`` wait)."""
        sent = self.counts["batches_sent"]
        return sent - SUBMIT_WINDOW + 1 if sent - done >= SUBMIT_WINDOW else None

    def send_batch(self, send: Callable[[Message], None]) -> None:
        """Hand the batch to ``send`` as one SUBMIT, and start the next. If ``send`` raises,
        nothing is lost: the batch goes with the next one. Frees that come meanwhile (another
        thread letting tensors go) go next time."""
        batch, self.batch = self.batch, []
        freed = len(self.freed)  # (each free in the batch is in both lists)
        kept: list[Any] = []  # the entries past a full batch's cut, for the next batch
        if self.full and self.cut_at_repeats and not self.buffers and not self.batch_graph_ops:
            kept = batch[repeat_cut(batch):]
            del batch[len(batch) - len(kept):]
            self.batch[:0] = kept  # (one step: frees from other threads go after it)
        try:
            body = {"ops": batch}
            if self.numbered:  # (a device that ran it already skips it when it comes again)
                body["seq"] = self.counts["batches_sent"] + 1
            send(Message(Kind.SUBMIT, self.session_id, 0, body, self.buffers))
        except BaseException:
            self.batch = batch + self.batch
            raise
        ops_kept = [entry for entry in kept if type(entry) is not int]
        freed -= len(kept) - len(ops_kept)
        self.counts["ops_sent"] += len(batch) - (freed - self._freed_counted)
        if freed >= 2 * REMEMBERED_ORIGINS:  # the older half goes, at once, in C
            forgotten = self.freed[:-REMEMBERED_ORIGINS]
            del self.freed[:-REMEMBERED_ORIGINS]
            deque(map(self.origins.pop, forgotten, itertools.repeat(None)), 0)
            freed -= len(forgotten)
        self._freed_counted = freed
        self.counts["batches_sent"] += 1
        # (an id of no tensor, the ones before sent; or the last before the first op kept's)
        self.sent_through = next(self.ids) if not ops_kept else parse_op(ops_kept[0]).out - 1
        self.counts["bytes_uploaded"] += self.batch_bytes
        self.counts["bytes_uploaded_by_socket"] += self.batch_bytes
        self.buffers, self.batch_bytes, self.batch_elements, self.batch_graph_ops = [], 0, 0, 0
