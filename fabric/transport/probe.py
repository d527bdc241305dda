"""Whether a session's worker shares this process's memory, asked once (the ``shm_probe``:
``Probe``), as the session opens, and the connection's pool of shared memory
(``connection_pool``), made at its first session, with memory faulted in ahead there for a
first read (``at_open``). The transfers themselves: ``fabric.transport.bulk``.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any

import numpy as np

from fabric.core.errors import FabricError, ProtocolError, RequestTimeout
from fabric.core.protocol import Kind
from fabric.core.segment_pool import SegmentPool
from fabric.core.shm import boot_id
from fabric.transport.connection import expect_reply

# (A session is typed Any here: fabric.client.session imports this module.)


PROBE_SECONDS = 2.0  # an upload's wait for the probe's answer; then it takes the sockets
WARM_AT_OPEN = 8 << 20  # memory a connection faults in ahead at its first session, for a read
PROBES_AT_OPEN = 8  # a connection's probes sent as sessions open and not yet answered, at most


def pool_of(session: Any) -> SegmentPool | None:
    """The pool ``session`` moves arrays through, or None where its worker cannot share its
    memory, or has not said so yet (asked once per session: ``Probe``)."""
    if session.shares_memory is None:
        if session.probe is None:
            session.probe = Probe.send(session)
        session.shares_memory = session.probe.answer(session)
    return session.connection.segments if session.shares_memory else None


class Probe:
    """A session's ``shm_probe``, sent: its request, and the segment its worker must map.

    The answer comes after the device's queued work (a probe is one of the session's
    requests; sent as the session opens, it has come by its first transfer), so the first
    upload waits for it ``PROBE_SECONDS`` at most, then takes the socket path; later ones
    take the answer once it has come, without waiting. An upload never fails because its
    device is busy, on either path."""

    def __init__(self, request: int | None, segment: Any, heap: np.ndarray | None = None,
                 pool: SegmentPool | None = None) -> None:
        self.request = request  # None: not sent (no shared memory here: the answer is no)
        self.segment = segment
        self.pool = pool  # whose ``probe_segment`` it is
        self.heap = heap  # the token in this process's own memory, for the worker to read
        self.reads_memory = False  # whether the worker said it can (``_upload_from_memory``)
        self.waited = False

    @classmethod
    def send(cls, session: Any) -> "Probe":
        """Ask ``session``'s worker whether it maps this process's shared memory."""
        connection = session.connection
        if connection.shared_memory is None or not boot_id():
            return cls(None, None)
        token = secrets.randbits(63)
        pool = connection_pool(connection)
        try:
            segment = pool.probe_segment(token)
        except OSError:  # no memory left for it
            return cls(None, None)
        body = {"op": "shm_probe", "boot": boot_id(), "segment": segment.name, "token": token}
        heap = np.array([token], np.uint64) if connection.shared_memory.cross_memory else None
        if heap is not None:
            body["heap"] = heap.ctypes.data
        try:
            return cls(session._send_request(body), segment, heap, pool)
        except BaseException:
            pool.close_probe(segment)
            raise

    def answer(self, session: Any) -> bool | None:
        """Whether the worker agreed; None while it has not answered."""
        if self.request is None:
            return False
        connection = session.connection
        wait, self.waited = 0.0 if self.waited else PROBE_SECONDS, True
        connection.receive_arrived()
        try:
            reply = connection.wait_for_reply(self.request, wait, session=session.id,
                                              keep_on_timeout=True)
            body = expect_reply(reply, Kind.REPLY).body
            session._answered(self.request)
            agreed = body.get("shared_memory") is True
            self.reads_memory = agreed and body.get("reads_memory") is True
        except RequestTimeout:
            return None
        except ProtocolError:  # a worker that predates shared memory
            agreed = False
        self.close()
        return agreed

    def close(self) -> None:
        """The worker answered, or the session ends: no one maps the segment any more."""
        if self.segment is not None:
            self.pool.close_probe(self.segment)
            self.segment = None
        self.heap = None


def connection_pool(connection: Any) -> SegmentPool:
    """``connection``'s pool of shared memory (made at its first need), with the limits its
    ``shared_memory`` options set."""
    if connection.segments is None:
        options = connection.shared_memory
        connection.segments = SegmentPool(lambda s: connection.pending.done.get(s, 0),
                                          options.limit, options.idle_seconds,
                                          copy_threads=options.copy_threads)
        connection.segments.start()
    return connection.segments


def at_open(session: Any) -> bool:
    """``session`` opened, where this process may share memory: its probe is sent now (not at
    its first transfer, which then finds the answer come: about 2.5 ms of a first upload of
    8 MiB), unless ``PROBES_AT_OPEN`` of its connection's still hold their segments (a
    descriptor each, until answered: a session past them asks at its first transfer); and
    at its connection's first session, where workers may write reads into this process's own
    memory (``fabric.core.cross_memory``), ``WARM_AT_OPEN`` bytes are faulted in ahead on the
    pool's maker thread, for a first read to take (``bulk_reads._read_target``; uploads warm
    more, sized as they are: ``bulk._warm_for_read``). Unused, that memory goes after the pool's
    ``idle_seconds``. Whether ``session`` is its connection's first to share memory."""
    connection = session.connection
    options = connection.shared_memory
    if options is None or not boot_id():
        return False
    first = connection.segments is None
    if len(connection_pool(connection).probes) < PROBES_AT_OPEN:
        with contextlib.suppress(FabricError):  # (its connection lost since the welcome:
            session.probe = Probe.send(session)  # its first transfer asks, and says so)
    if first and options.cross_memory:
        connection.segments.warm_ahead(WARM_AT_OPEN)
    return first
