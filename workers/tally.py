"""What a device did, for its worker's heartbeat report (``fabric.core.protocol.WorkerReport``).

Rule: the op loop pays one clock read on each side of a batch, never one per op. A device's
thread is the only writer of its ``DeviceTally`` (its ``Executor`` times batches, its
sessions' ``SessionGraphs`` count graph calls here as well as their own); the worker's
control thread only reads it, to build a heartbeat, so no lock is needed: each figure is
one int or float, and a heartbeat that reads a batch's figures half updated is mended by
the next. Counts only grow, over every session the device ever held, so the broker shows
them as Prometheus counters.
"""

from __future__ import annotations

from bisect import bisect_left

from fabric.core.protocol import OP_SECONDS_BUCKETS, DeviceReport


class DeviceTally:
    """One device's op histogram, graph counts, and bulk traffic through shared memory."""

    __slots__ = ("op_buckets", "op_seconds", "graph_replays", "graph_registrations",
                 "shm_in", "shm_in_bytes", "shm_out", "shm_out_bytes")

    def __init__(self) -> None:
        self.op_buckets = [0] * (len(OP_SECONDS_BUCKETS) + 1)  # the last is +Inf
        self.op_seconds = 0.0
        self.graph_replays = self.graph_registrations = 0
        self.shm_in = self.shm_in_bytes = self.shm_out = self.shm_out_bytes = 0

    def came_shared(self, nbytes: int) -> None:
        """An upload, or a tensor moved here, came through shared memory."""
        self.shm_in += 1
        self.shm_in_bytes += nbytes

    def went_shared(self, nbytes: int) -> None:
        """A read, or a tensor moved away, went out through shared memory."""
        self.shm_out += 1
        self.shm_out_bytes += nbytes

    def ran(self, ops: int, seconds: float) -> None:
        """A batch of ``ops`` ops took ``seconds``: each is counted at the batch's time per op
        (as Prometheus' ``le`` says: in the first bucket whose bound is at least that)."""
        if ops:
            self.op_buckets[bisect_left(OP_SECONDS_BUCKETS, seconds / ops)] += ops
            self.op_seconds += seconds

    def report(self, resident_bytes: int, queued: int, pool_bytes: int = 0) -> DeviceReport:
        """The device's figures now, with the bytes it holds, the messages waiting for it and
        the bytes of its own shared-memory pool."""
        return DeviceReport(resident_bytes, tuple(self.op_buckets), self.op_seconds,
                            self.graph_replays, self.graph_registrations, queued,
                            self.shm_in, self.shm_in_bytes, self.shm_out, self.shm_out_bytes,
                            pool_bytes)
