"""Batches of streamed ops that a compiling device has seen before, run as one graph.

Rule: a SUBMIT's batch is the same batch again when its ops, scalars and params are the same
and its inputs have the same shapes and dtypes, whatever the tensor ids: its signature
numbers the ids by their first appearance. A batch seen a second time is registered as a
graph of its own (``registered_graphs.register``: the device compiles it, the jax device
into one XLA executable) and kept, at most ``BATCH_GRAPHS`` per device, least recently used
evicted; every later sighting replays it and stores what the batch leaves alive under the
ids the client gave them. Only a device that compiles asks for this (``compiles_batches``).

Nothing changes for the session but the speed: a batch holding anything a graph must not
(an upload, an update, a random draw, a data-dependent shape, a session op), reading a
tensor the session does not hold (poisoned, freed), refused by admission, or failing in any
way runs op by op instead, where each op fails, poisons and is named as it always is.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import msgpack
import numpy as np

from fabric.core.errors import QuotaExceeded
from fabric.core.ops import (DATA_DEPENDENT_DTYPE, DATA_DEPENDENT_OPS, NO_PARAMS, OPS,
                             RANDOM_OPS, WRITES_IN_PLACE)

from .device_session import DeviceSession
from .registered_graphs import RegisteredGraph, register

BATCH_GRAPHS = 64  # batches kept compiled per device
SEEN = 1024  # batch signatures remembered (once seen) per device
MIN_OPS = 4  # shorter batches run op by op: a replay saves them nothing
# Ops a batch graph never holds: what a traced function refuses
_NEVER = RANDOM_OPS | DATA_DEPENDENT_OPS | DATA_DEPENDENT_DTYPE | set(WRITES_IN_PLACE)


class Batch:
    """A batch as a graph: its signature (``key``), the graph's ``ops`` (local ids, inputs
    first) and ``outputs``, the session's tensors it reads (``inputs``, with their
    ``specs``) and makes alive (``results``: the ids of ``outputs``), the ids it frees, and
    how many ops it runs."""

    __slots__ = ("key", "ops", "outputs", "inputs", "specs", "results", "freed", "count")

    def __init__(self, key: bytes, ops: list[list[Any]], outputs: list[int], inputs: list[int],
                 specs: list[tuple[tuple[int, ...], np.dtype]], results: list[int],
                 freed: list[int], count: int) -> None:
        self.key, self.ops, self.outputs = key, ops, outputs
        self.inputs, self.specs, self.results = inputs, specs, results
        self.freed, self.count = freed, count


def signature(ops: list[Any], tensors: dict[int, Any]) -> Batch | None:
    """The batch ``ops`` (a SUBMIT's entries) as a graph over ``tensors`` (the session's), or
    None where it cannot be one."""
    made: dict[int, int] = {}  # session id -> its op's number, for the ids alive
    inputs: dict[int, int] = {}  # session id -> -(its input number), for ids read first
    entries: list[list[Any]] = []
    freed: list[int] = []
    for op in ops:
        if type(op) is int:
            made.pop(op, None)  # (its value lives on in the graph while an op reads it)
            freed.append(op)
            continue
        if type(op) is not list or not op:
            return None
        if type(op[0]) is int:  # the compact form
            out, name, args, params = op[0], op[1], op[2:], NO_PARAMS
        elif len(op) == 4 and type(op[1]) is int and type(op[2]) is list \
                and type(op[3]) is dict:
            name, out, args, params = op
        else:
            return None
        if name not in OPS or name in _NEVER or "in_place" in params or out in tensors \
                or out in freed:
            return None
        local_args = []
        for arg in args:
            if type(arg) is not int:
                local_args.append(arg)  # (a scalar, as the wire has it)
            elif arg in made:
                local_args.append(made[arg])
            elif arg in tensors and arg not in freed:
                local_args.append(inputs.setdefault(arg, -1 - len(inputs)))
            else:
                return None  # poisoned, freed or never made: run op by op
        made[out] = len(entries) + 1
        entries.append([name, len(entries) + 1, local_args, params])
    if len(entries) < MIN_OPS:
        return None
    k = len(inputs)  # inputs are 1..k, in the order they are first read; op i makes k + i
    graph_ops = [[name, out + k, [(-a if a < 0 else a + k) if type(a) is int else a
                                  for a in args], params] for name, out, args, params in entries]
    outputs = [number + k for number in made.values()]
    specs = [(tuple(tensors[t].shape), np.dtype(tensors[t].dtype)) for t in inputs]
    key = msgpack.packb([graph_ops, outputs, [[list(s), d.str] for s, d in specs]])
    return Batch(key, graph_ops, outputs, list(inputs), specs, list(made), freed, len(entries))


class BatchGraphs:
    """One device's batches: those seen once, and the graphs of those seen again."""

    def __init__(self, limit: int = BATCH_GRAPHS) -> None:
        self.limit = limit
        self.seen: OrderedDict[bytes, None] = OrderedDict()
        self.graphs: OrderedDict[bytes, RegisteredGraph | None] = OrderedDict()  # None:
        # a batch that cannot be a graph (its registration or compile failed)
        self.registered = 0
        self.replays = 0

    def graph(self, batch: Batch, device: Any) -> RegisteredGraph | None:
        """The graph of ``batch`` if it was seen before (registered now on its second
        sighting); None the first time, or where it cannot be one."""
        if batch.key in self.graphs:
            self.graphs.move_to_end(batch.key)
            return self.graphs[batch.key]
        if batch.key not in self.seen:
            self.seen[batch.key] = None
            if len(self.seen) > SEEN:
                self.seen.popitem(last=False)
            return None
        del self.seen[batch.key]
        try:
            graph = register({"graph": 0, "name": "a batch seen again",
                              "inputs": [[list(s), d.str] for s, d in batch.specs],
                              "ops": batch.ops, "outputs": batch.outputs}, device)
        except Exception:
            graph = None
        self.graphs[batch.key] = graph
        self.registered += graph is not None
        while len(self.graphs) > self.limit:
            self.graphs.popitem(last=False)
        return graph

    def stats(self) -> dict[str, int]:
        """The device's batch graphs, as ``session.stats()`` shows them (every session's)."""
        return {"device_batch_graphs": sum(g is not None for g in self.graphs.values()),
                "device_batch_replays": self.replays}


class BatchOps:
    """The executor's replay of batches seen before, mixed into ``Executor`` (which has
    ``device``, ``_require``, ``_store`` and ``_drop``)."""

    batches: BatchGraphs | None
    device: Any

    def _replayed(self, session: DeviceSession, ops: list[Any]) -> bool:
        """Run ``ops`` as the graph of a batch seen before; False, with nothing done, where
        they run op by op instead."""
        tensors = session.tensors
        batch = signature(ops, tensors)
        graph = None if batch is None else self.batches.graph(batch, self.device)
        if graph is None:
            return False
        try:
            self._require(session, "a batch of ops run as one", graph.output_bytes,
                          graph.need)
        except QuotaExceeded:
            return False  # (op by op, the op past the limit is refused and named)
        try:
            results = graph.plan([tensors[t] for t in batch.inputs], session.rng)
        except Exception:
            if not graph.called:  # its compile failed: never again
                self.batches.graphs[batch.key] = None
            return False
        graph.called = True
        self.batches.replays += 1
        for tensor_id, value in zip(batch.results, results):
            self._store(session, tensor_id, self.device.held(value))
        self._drop(session, batch.freed)
        session.ops += batch.count
        return True
