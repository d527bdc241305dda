"""``fabric.Session``: a session bound to one device, which sends its op stream there and reads.

Rule: the session is the op stream's only way to its socket: it hands a full batch to the
connection once the device has run enough of the earlier ones (backpressure by CREDIT, with
a deadline), and makes every read, sync and close a request that first sends what is
batched. A remote error comes back naming the op and the line of user code that issued it.
"""

from __future__ import annotations

import atexit
import math
import mmap
import os
import secrets
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Sequence

import numpy as np

from fabric.arrays import read_target
from fabric.arrays.creation import ArrayNamespace
from fabric.arrays.device_warnings import issue_warnings
from fabric.arrays.html_repr import byte_text, one_line, table
from fabric.arrays.origins import origin_line
from fabric.arrays.progress import WAIT_BEFORE_BAR, wait_showing
from fabric.arrays.tensor import Tensor
from fabric.core import protocol
from fabric.core.device import Device
from fabric.core.errors import (FabricError, HandshakeTimeout, ProtocolError, RemoteError,
                                RequestTimeout, SessionLost, error_from_wire, named)
from fabric.core.flow import DEFAULT_MAX_MESSAGE_BYTES, SUBMIT_WINDOW
from fabric.core.protocol import Kind, Message
from fabric.core.security import CurveClient
from fabric.core.session_life import CLOSED, OPEN
from fabric.core.segment_pool import Slot
from fabric.core.shm import SharedMemory
from fabric.core.sockets import try_send
from fabric.core.wire import array_from_frame, device_dtype, dtype_name
from fabric.graphs.function import Function
from fabric.mesh.device_mesh import Mesh, close_each
from fabric.transport import bulk, bulk_reads, direct_link, probe
from fabric.transport.connection import (ZMTP_HANDSHAKE_LIMIT, Connection, ask_devices,
                                         check_version, expect_reply, naming_connection_file)
from fabric.transport.moves import move_all
from fabric.transport.slots_ahead import SizesSeen, SlotsAhead


class Session(ArrayNamespace):
    """A session bound to one device; use as a context manager or call ``close()``.

    Arrays live on the device: create them with ``asarray``, ``zeros``, ``ones``, ``full``,
    ``empty``, ``arange``, ``linspace``, ``eye`` or ``random``; ops on them are streamed.
    """

    def __init__(self, connection: Connection, session_id: int, welcome: Message,
                 timeout: float, token: str) -> None:
        super().__init__(Device.from_wire(welcome.body["device"]), session_id,
                         connection.life.new_session(session_id))
        # Open, lost with its error, or closed: what every check of this session reads
        # (``fabric.core.session_life``), its stream's and its connection's too
        self.life = self.stream.life
        self.connection = connection
        connection.users += 1
        self._token = token
        self.id = session_id
        self.timeout = timeout
        secret = welcome.body.get("secret")
        if isinstance(secret, bytes) and connection.brokers:  # (resumed at a takeover)
            connection.resume_keys[session_id] = secret
            self.stream.numbered = True
        self.device_count: int = welcome.body["device_count"]
        self.server: str = welcome.body["server"]
        # The largest array this session may upload in one piece: every socket on the way
        # to its device takes it (an oversized frame would silently cost the connection),
        # and so does the caller's own max_message_bytes=, which bounds both directions.
        limit = welcome.body.get("max_message_bytes")
        own = connection.max_message_bytes
        way = limit if type(limit) is int and limit > 0 else own
        self.max_upload_bytes: int = min(way, own)
        if own < way:
            self.upload_limit_hint = "pass a larger max_message_bytes= to fabric.connect"
        self.on_close: Callable[[], None] | None = None  # set by whoever owns the cluster
        self.meshes: list[Mesh] = []  # opened by mesh(), closed with this session
        self.opened: list[Session] = []  # opened by open() (a mesh's too), closed with it
        self.parent: Session | None = None  # the session whose open() opened this one
        self.shares_memory: bool | None = None  # with its worker (None: not known yet, bulk)
        self.probe: probe.Probe | None = None  # asking it (fabric.transport.probe)
        # The last request ``_send_request`` sent, and the batches sent before it and with it
        self._last_request = (0, 0)
        self.slots_ahead = SlotsAhead()  # its device's slots lent ahead of uploads (bulk)
        self.read_sizes = SizesSeen()  # of its reads through shared memory (bulk)
        self.unpinning: deque[str] = deque()  # slots of views collected, to unpin (bulk)
        # Tensors written into a slot of the device's own pool, by id: a read pins it (bulk;
        # not a WeakSet, whose look-ups would compare tensors with ==, an op)
        self.in_device_slots: weakref.WeakValueDictionary[int, Tensor] = \
            weakref.WeakValueDictionary()
        # The arrays upload_buffer lent, by slot (segment name, offset): read-only once this
        # session closes (bulk)
        self.upload_buffers: weakref.WeakValueDictionary[tuple[str, int], np.ndarray] = \
            weakref.WeakValueDictionary()
        connection.set_send_timeout(timeout)
        # What the client waited for (stats): every request answered, the reads among them
        self.stream.counts.update(round_trips=0, reads=0, bytes_read=0, moves_sent_again=0)
        _OPEN.add(self)
        bulk.at_open(self)  # (its probe and start slot asked, a first read's memory warmed)
        # Registered again with each session: atexit runs the last registered first, so
        # sessions close while the clusters started before them still serve.
        atexit.unregister(_close_at_exit)
        atexit.register(_close_at_exit)

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called (its life is CLOSED)."""
        return self.life.phase is CLOSED

    def _fields(self) -> list[tuple[str, Any]]:
        """What the client knows of the session (``fabric.arrays.html_repr``), never asking
        the device."""
        return [("id", f"{self.id:#x}"), ("address", self.connection.address),
                ("device", self.device.index), ("backend", self.device.backend),
                ("worker", self.device.worker), ("state", self.life.phase.value)]

    def __repr__(self) -> str:
        # (without the tensors held: a repr lands in errors and logs, and finding them walks
        # the objects that refer to the session)
        return one_line("Session", self._fields())

    def _repr_html_(self) -> str:
        """The notebook's view: address, device, backend, worker, state, and the tensors the
        client holds here with their bytes (no read, no question to the device)."""
        count, size = self.stream.held()
        return table("Session", [*self._fields(), ("tensors", count),
                                 ("bytes", byte_text(size))])

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def open(self, device: int, timeout: float | None = None) -> "Session":
        """Another session, on ``device``, over this session's connection (one connection
        serves sessions on any number of devices; it closes with its last session). It
        closes with this session, or by its own ``close()``."""
        self.life.check_usable()
        check_argument("device", device, (int,), "a device index (an int)")
        if timeout is not None:
            check_argument("timeout", timeout, (int, float), "seconds (an int or a float)")
        child = open_session(self.connection, self._token, device,
                             self.timeout if timeout is None else timeout)
        child.parent = self
        self.opened.append(child)
        return child

    def mesh(self, devices: Sequence[int] | None = None) -> Mesh:
        """A mesh of a new session on each of ``devices`` (by default every online device
        but draining ones, left out with a warning), over this session's connection, for
        sharded tensors (``mesh.asarray(a, axis=0)``); it closes with this session, or by its
        own ``close()``."""
        self.life.check_usable()
        return Mesh.open(self, devices)

    def devices(self) -> list[Device]:
        """Every online device of the broker, asked over this session's connection."""
        self.life.check_usable()
        return ask_devices(self.connection, self._token, self.timeout)

    def close(self, timeout: float | None = None) -> None:
        """Close the session and free everything it holds on the device (idempotent), and
        the sessions and meshes it opened; ``timeout``: how long each may wait for its
        device (default: the session's)."""
        if self.life.phase is CLOSED:
            return
        try:
            close_each([*self.meshes, *self.opened], timeout)
        finally:
            self._close_own(timeout)

    def _close_own(self, timeout: float | None) -> None:
        was = self.stream.close()  # every later op is refused; closing frees what was batched
        self.connection.life.forget(self.id)  # (its CLOSE answers to the connection alone)
        self.connection.forget_session(self.id)  # (nor is it resumed at a takeover)
        try:
            if was is OPEN:  # (a lost session is gone on the broker: nothing to tell it)
                if self.unpinning:  # (back to the pool: retired, were they pinned at the end)
                    bulk_reads.send_unpins(self)
                reply = self.connection.request(Message(Kind.CLOSE, self.id),
                                                self.timeout if timeout is None else timeout,
                                                session=self.id)
                check_version(reply)
        except SessionLost:
            pass  # already gone on the broker: nothing left to free
        finally:
            _OPEN.discard(self)
            if self.parent is not None:
                self.parent.opened.remove(self)
            if self.probe is not None:
                self.probe.close()
            bulk.close_buffers(self)
            if self.connection.segments is not None:
                self.connection.segments.discard_session(self.id)
            self.slots_ahead.forget(self.connection.pending.forget)
            self.connection.pending.done.pop(self.id, None)  # (its CREDITs came before CLOSED)
            self.connection.users -= 1
            if not self.connection.users:
                self.connection.close()
            if self.on_close is not None:
                self.on_close()

    # -- sending the stream ------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send the batched ops now (reads, syncs and close do this for you). If the device
        has not yet run the session's last batches (``fabric.core.flow.SUBMIT_WINDOW`` of them),
        wait for it first, up to ``timeout`` (default: the session's)."""
        if not self.stream.batch or self.life.phase is CLOSED:  # (closed: tensors freed
            return  # since, nothing to send)
        if self.unpinning:
            bulk_reads.send_unpins(self)
        self._make_room(timeout)
        self.stream.send_batch(self.connection.send)

    def _make_room(self, timeout: float | None) -> None:
        # Backpressure before a batch is sent: see flush
        needed = self.stream.credit_needed(self.connection.pending.done.get(self.id, 0))
        if needed is not None:
            self._wait_for_device(needed, self.timeout if timeout is None else timeout)

    def _wait_for_device(self, done: int, timeout: float) -> None:
        """Backpressure: wait until the device has run ``done`` of this session's batches."""
        def busy(deadline: float) -> RequestTimeout:
            return RequestTimeout(
                f"Device {self.device.index} ran none of this session's {SUBMIT_WINDOW} "
                f"waiting batches of ops in {timeout:g} s: it is busy with long ops, or "
                "stuck. Wait for it with session.sync(timeout=...) before sending more, or "
                "raise timeout=.", device=self.device.index, waiting=SUBMIT_WINDOW)
        self.connection.wait_for_credit(self.id, done, time.monotonic() + timeout, busy)

    # -- requests and reads ------------------------------------------------------------------

    def upload_buffer(self, shape: Any, dtype: Any = "float64") -> np.ndarray:
        """A writable array that ``asarray`` makes a tensor of without copying it (Ray's
        create and seal): on this host, memory the device lent (``fabric.transport.bulk``); after
        ``asarray(buffer)`` the array is read-only and shows the tensor's values. Where no
        such memory can be had (small, no shared memory, its pool full), an ordinary array,
        which ``asarray`` copies as any other."""
        self.life.check_usable()
        return bulk.upload_buffer(self, shape, dtype)

    def _upload(self, array: np.ndarray) -> Tensor:
        self.life.check_usable()  # (before the paths below send anything)
        tensor, path = bulk.seal(self, array), "shared_memory"
        if tensor is None and array.size >= self.connection.bulk_elements:
            tensor = bulk.upload(self, array)
        if tensor is None and array.nbytes >= direct_link.DIRECT_BYTES:  # (another host's?)
            tensor, path = direct_link.upload(self, array), "direct_link"
        if tensor is None:
            return super()._upload(array)  # (its batch counts its bytes)
        counts = self.stream.counts
        counts["bytes_uploaded"] += array.nbytes
        counts[f"bytes_uploaded_by_{path}"] = counts.get(f"bytes_uploaded_by_{path}", 0) \
            + array.nbytes
        return tensor

    def _send_request(self, body: dict[str, Any], timeout: float | None = None,
                      reads: Tensor | None = None) -> int:
        """Send a request to the device with the ops batched before it, which run first (one
        message, where a flush and then a request were two: a read inside a loop waits for
        one trip to the device); its request id, for ``_reply``. A read of a tensor made by
        a batch already sent (``reads``) goes alone: it need not wait for the ops since."""
        if self.life.phase is CLOSED:  # (every read: the call only to raise)
            self.life.check_usable()
        if self.unpinning:
            bulk_reads.send_unpins(self)
        connection = self.connection
        stream = self.stream
        if not stream.batch or reads is not None and reads.id <= stream.sent_through:
            request = connection.send_request(protocol.request_message(self.id, body))
        else:
            self._make_room(timeout)
            sent: list[int] = []  # (the batch's own SUBMIT, sent as the request instead)
            stream.send_batch(lambda submit: sent.append(connection.send_request(
                protocol.request_message(self.id, {**body, **submit.body}, submit.buffers))))
            request = sent[0]
        self._last_request = (request, stream.counts["batches_sent"])
        return request

    def _reply(self, request: int, timeout: float | None = None) -> Message:
        timeout = self.timeout if timeout is None else timeout
        longer = timeout > WAIT_BEFORE_BAR  # (no min(): every read pays for this)
        try:  # the common case, an answer within WAIT_BEFORE_BAR, pays only this
            reply = self.connection.wait_for_reply(
                request, WAIT_BEFORE_BAR if longer else timeout, session=self.id,
                keep_on_timeout=longer)
        except RequestTimeout:
            if not longer:
                raise
            reply = wait_showing(lambda seconds, keep: self.connection.wait_for_reply(
                request, seconds, session=self.id, keep_on_timeout=keep),
                timeout - WAIT_BEFORE_BAR, self._waiting_for)
        self.stream.counts["round_trips"] += 1
        self._answered(request)
        bulk.after_reply(self)
        reply = expect_reply(reply, Kind.REPLY)
        if "warnings" in reply.body:  # numpy's, on the device: issued here, at their lines
            issue_warnings(reply.body, self.stream)
        return reply

    def _answered(self, request: int) -> None:
        """``request``, sent by ``_send_request``, was answered: if it was the last, the
        device ran every batch sent before it (it runs a session's requests in order with
        its batches), as if their CREDIT had come."""
        if request == self._last_request[0]:
            done = self.connection.pending.done
            done[self.id] = max(done.get(self.id, 0), self._last_request[1])

    def _waiting_for(self) -> str:
        return f"waiting for device {self.device.index}"

    def _call(self, body: dict[str, Any], timeout: float | None = None) -> Message:
        """Send a request with the batched ops (``_send_request``); its reply, or its error."""
        reply = self._reply(self._send_request(body, timeout), timeout)
        if "error" in reply.body:
            raise self._remote_error(reply.body["error"])
        return reply

    def _remote_error(self, wire: dict[str, Any]) -> Exception:
        """The device's error, naming the line that issued the failed op (and, inside a
        graph, the function's line)."""
        error = error_from_wire(wire)
        origin = self.stream.origins.get(error.details.get("tensor"))
        if isinstance(error, RemoteError) and origin is not None:
            file, line = origin_line(origin)
            error.details["origin"] = f"{file}:{line}"
            error.args = (f"{error.message}\n  the op was issued at {file}, line {line}",)
        graph = self.stream.graphs.get(error.details.get("graph"))
        index = error.details.get("graph_op")
        if graph is not None and type(index) is int and 0 <= index < len(graph.origins):
            file, line = graph.origins[index]
            error.args = (f"{error.args[0]}\n  inside {graph.name}, at {file}, line {line}",)
        return error

    def read(self, tensor: Tensor, copy: bool = True, out: np.ndarray | None = None) \
            -> np.ndarray:
        """``tensor``'s values, read back (``t.numpy()``): an ordinary, writable numpy array,
        with ``copy=False`` a read-only one that may share memory with the worker, or ``out``."""
        if out is not None:
            return read_target.fill(out, self.start_read(tensor, out=out).result())
        if not copy or tensor.size >= self.connection.bulk_elements \
                or tensor.size >= direct_link.DIRECT_ELEMENTS:
            return self.start_read(tensor, copy).result()
        self._count_read(tensor)
        reply = self._reply(self._send_request(_read_body(tensor), reads=tensor))
        if "error" in reply.body:  # (start_read's, without an object between: every read)
            raise self._remote_error(reply.body["error"])
        return read_values(reply, tensor)

    def start_read(self, tensor: Tensor, copy: bool = True, pin: bool = True,
                   out: np.ndarray | None = None) -> "ReadInFlight":
        """Send a read of ``tensor`` (and the ops batched before it) now, without waiting
        for the values: ``.result()`` waits for them (``copy`` as ``read`` takes it). Reads of
        many sessions can so be in flight at once (a sharded tensor's ``numpy()`` gathers its
        shards so). ``pin``: a tensor in a slot of its device's own shared memory may be
        shown as that slot, without a copy (False: the device writes a copy). ``out``: where
        the values may be written (``.result()`` is then ``out``, else to ``fill`` it with)."""
        self._count_read(tensor)
        sent = None
        if tensor.size >= self.connection.bulk_elements:  # (a small read tests only this)
            sent = bulk_reads.start_read(self, tensor, pin, out)
        if sent is None and tensor.size >= direct_link.DIRECT_ELEMENTS:
            read = direct_link.start_read(self, tensor, _read_body(tensor), read_values)
            if read is not None:  # (another host's worker: over a direct link)
                read.copy = copy
                return read
        if sent is None:
            read = ReadInFlight(self, tensor, self._send_request(_read_body(tensor),
                                                                 reads=tensor))
        else:
            read = SharedReadInFlight(self, tensor, *sent)
        if not copy:
            read.copy = False
        return read

    def _count_read(self, tensor: Tensor) -> None:
        counts = self.stream.counts
        counts["reads"] += 1
        counts["bytes_read"] += tensor.nbytes

    def resolve_shape(self, tensor: Tensor) -> None:
        """Learn ``tensor``'s shape and dtype from the device, its op sent and run first: one
        small round trip (``a[mask]``, ``np.nonzero``, ``np.unique``, ``np.linalg.eig``). The
        op's error, if it failed, is raised here, naming the line that issued it."""
        body = self._call({"op": "shape", "id": tensor.id}).body
        shape = body.get("shape")
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape) \
                or len(shape) != len(tensor.shape):
            raise ProtocolError(f"A shape reply must list {len(tensor.shape)} sizes.")
        dtype_text = body.get("dtype")
        try:
            dtype = device_dtype(dtype_text if type(dtype_text) is str else "a missing name")
        except TypeError:
            raise ProtocolError("A shape reply must name the tensor's dtype.") from None
        tensor.shape, tensor.dtype = tuple(shape), dtype
        tensor.size = math.prod(shape)

    def receive_from(self, source: Tensor) -> Tensor:
        """``source``, a tensor of another session, sent worker to worker (``t.to(self)``).

        This session's device first agrees to take it, as a new tensor, with a one-time
        ticket that only this client knows and the sending device attaches: no other client
        can push a tensor into a session, or replace one there (``fabric.transport.moves``)."""
        return move_all([(source, self)])[0]

    def sync(self, timeout: float | None = None) -> None:
        """Wait until the device has run everything sent so far; raise its first error."""
        self._call({"op": "sync"}, timeout)

    def compile(self, fn: Callable[..., Any]) -> Function:
        """``fn`` traced once per input signature and replayed on this session's device.

        Like ``@fabric.function``, bound to this session: numpy array arguments are
        uploaded to it, and tensors of other sessions are refused."""
        return Function(fn, session=self)

    def stats(self) -> dict[str, int]:
        """Counts for this session: what the client sent, what the device holds and ran.

        ``ops`` counts the ops the worker received (a graph call is one); the device adds
        ``ops_fused`` and ``expressions_evaluated`` (0 on numpy), and the session's graphs
        ``graphs`` held, ``graph_registrations``, ``graph_replays`` and
        ``bytes_saved_by_replay`` (the op lists replays did not send, less the calls sent).
        ``bytes_uploaded`` counts every upload's bytes, whichever way they went:
        ``bytes_uploaded_by_socket`` (through the broker), ``_by_shared_memory`` and
        ``_by_direct_link`` (where any went that way) say how many took each.
        ``round_trips`` counts the requests whose answer the client waited for (reads, shapes
        learned from the device, syncs, moves; not these stats), the points where a program
        blocks; ``reads`` and ``bytes_read`` the reads of values among them, and their bytes.
        ``moves_sent_again`` counts the tensors moved here (``t.to()``) that the device could
        not take as they came (a lend of a worker it may not read, a message that overtook its
        agreement to take it), sent once more, their bytes in the message.
        """
        device = self._call({"op": "stats"}).body  # flushes first, so counts are current
        self.stream.counts["round_trips"] -= 1  # (this call's own is not the program's)
        return {**self.stream.counts, **device}

    def foreign_tensor(self, tensor: Tensor) -> Exception:
        """The error for an op that mixes this session's tensors with another's."""
        return ValueError(f"{tensor._handle()} lives on another session than {self!r}: move "
                          "it with .to(session) first.")


class ReadInFlight:
    """A read sent by ``Session.start_read``, its reply not yet taken."""

    copy = True  # False: the values come back read-only

    def __init__(self, session: Session, tensor: Tensor, request: int) -> None:
        self.session, self.tensor, self.request = session, tensor, request

    def result(self, timeout: float | None = None) -> np.ndarray:
        """The values, waited for up to ``timeout`` (default: the session's); the op's
        error, if it failed, naming the line that issued it."""
        reply = self.session._reply(self.request, timeout)
        if "error" in reply.body:
            raise self.session._remote_error(reply.body["error"])
        array = read_values(reply, self.tensor)
        if not self.copy:
            array.flags.writeable = False
        return array

    def cancel(self) -> None:
        """Stop waiting for the values: a reply that comes later is dropped."""
        self.session.connection.pending.forget(self.request)


def _read_body(tensor: Tensor) -> dict[str, Any]:
    # A read request: the worker checks what this client inferred, and answers with the
    # bytes alone
    return {"op": "read", "id": tensor.id, "dtype": dtype_name(tensor.dtype),
            "shape": tensor.shape}


def read_values(reply: Message, tensor: Tensor) -> np.ndarray:
    """The values a read's reply (without an error) carries for ``tensor``."""
    if len(reply.buffers) != 1:
        raise ProtocolError("A read reply must carry exactly one buffer.")
    return array_from_frame(reply.buffers[0], tensor.dtype, tensor.shape)


class SharedReadInFlight(ReadInFlight):
    """A read whose values the worker writes into ``slot``: shared memory of this client's
    pool (``fabric.transport.bulk``), or memory of its own (``fabric.core.cross_memory``: new,
    or the caller's ``out=``); or shows in its device's own slot (a view; ``slot`` None where
    the client lent none); its reply not yet taken."""

    def __init__(self, session: Session, tensor: Tensor, request: int,
                 slot: Slot | mmap.mmap | np.ndarray | None) -> None:
        super().__init__(session, tensor, request)
        self.slot = slot

    def result(self, timeout: float | None = None) -> np.ndarray:
        """The values, as ``ReadInFlight.result`` gives them (``bulk_reads.take``)."""
        try:
            reply = self.session._reply(self.request, timeout)
        except BaseException:
            self.cancel()  # (a worker that is only slow may still write into the slot)
            raise
        slot, self.slot = self.slot, None  # (given back, or its array's: cancel leaves it)
        if "error" in reply.body:
            if slot is not None:
                bulk_reads.unused(self.session, slot, written=True)
            raise self.session._remote_error(reply.body["error"])
        values = bulk_reads.take(self.session, slot, self.tensor, self.copy, reply)
        if values is None:  # (a slot the device did not pin, or that cannot be mapped here)
            values = self.session.start_read(self.tensor, self.copy, pin=False).result(timeout)
        return values

    def cancel(self) -> None:
        """Stop waiting, and give the slot up: the worker may still write into it
        (``bulk_reads.unused``)."""
        super().cancel()
        if self.slot is not None:
            bulk_reads.unused(self.session, self.slot, written=False)
            self.slot = None


# Every open session of this process (weakly: one collected needs no close), and how long
# closing them at interpreter exit may take in all.
_OPEN: weakref.WeakSet[Session] = weakref.WeakSet()
EXIT_CLOSE_SECONDS = 2.0


def _close_at_exit() -> None:
    """Close the sessions this process left open, so that their devices free them now, within
    ``EXIT_CLOSE_SECONDS`` in all. A session of another thread, or one past the time, is left
    to its broker, which ends the sessions of a connection that closed."""
    deadline = time.monotonic() + EXIT_CLOSE_SECONDS
    for session in list(_OPEN):
        if session.life.thread == threading.get_ident():
            try:
                session.close(max(0.0, deadline - time.monotonic()))
            except FabricError:  # (the broker gone or slow: nothing to tell at exit)
                pass


def check_argument(name: str, value: Any, kinds: tuple[type, ...], takes: str) -> None:
    """A ``TypeError`` naming the argument and what it takes when ``value`` is not one of
    ``kinds`` (a bool is not an int here): checked at the call, before a malformed request
    travels and the broker refuses it as a protocol error."""
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise TypeError(f"{name}= takes {takes}, not {type(value).__name__} {named(value)}.")


def open_session(connection: Connection, token: str, device: int, timeout: float,
                 hello_timeout: float | None = None) -> Session:
    """HELLO on ``connection`` (answered within ``hello_timeout``, by default ``timeout``,
    the session's calls' own); the session, or the typed error (closing an unused
    connection)."""
    session_id = secrets.randbits(64) or 1
    hello = Message(Kind.HELLO, session_id, body={
        "token": token, "device": device, "client": f"pid {os.getpid()}",
        "max_message_bytes": connection.max_message_bytes})
    try:
        welcome = expect_reply(connection.request(
            hello, timeout if hello_timeout is None else hello_timeout), Kind.WELCOME)
    except HandshakeTimeout:
        # A slow broker may still open it: ask it to drop the session, best effort (a full
        # queue skips it: the timeout is what the caller hears of).
        try_send(connection.socket, protocol.encode(Message(Kind.CLOSE, session_id)))
        if not connection.users:
            connection.close(linger=0.2)
        raise
    except BaseException:
        if not connection.users:
            connection.close()
        raise
    return Session(connection, session_id, welcome, timeout, token)


def dial(address: str, token: str, device: int, timeout: float, curve: CurveClient | None,
         max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
         connection_file: str | None = None,
         shared_memory: SharedMemory | None = SharedMemory(),
         hello_timeout: float | None = None, brokers: Sequence[str] = ()) -> Session:
    """A session on ``device`` of the broker at ``address``, over a new connection
    (``connection_file``: where the address came from, if a file; ``shared_memory``: how
    large arrays use it with a worker on this host, None: never; ``hello_timeout``: the
    handshake's deadline where it is shorter than ``timeout``, its calls'; ``brokers``: the
    pair ``address`` belongs to, whose other broker takes the session up at a takeover)."""
    opening = timeout if hello_timeout is None else hello_timeout
    connection = Connection(address, token, handshake_limit=min(opening, ZMTP_HANDSHAKE_LIMIT),
                            curve=curve, max_message_bytes=max_message_bytes,
                            shared_memory=shared_memory, brokers=list(brokers))
    with naming_connection_file(connection_file):
        return open_session(connection, token, device, timeout, opening)
