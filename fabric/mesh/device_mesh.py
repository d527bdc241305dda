"""Meshes: sessions on many devices of one broker, where sharded tensors live.

Rule: a mesh opens one session per device over its parent session's connection (the same
broker, token, CURVE keys and options), and closes them when it closes or its parent does;
a sharded tensor's shards live on those sessions, one per device, in the mesh's order. How an
axis is cut into blocks is ``fabric.mesh.sharding``'s.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any, Callable, Sequence

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from fabric.arrays import read_target
from fabric.arrays.html_repr import devices_svg, one_line, table
from fabric.arrays.indexing import as_shape
from fabric.arrays.tensor import Tensor
from fabric.core.errors import DeviceDraining, named
from fabric.mesh import combining
from fabric.mesh import sharded_array_api  # noqa: F401  (a sharded tensor's namespace)
from fabric.mesh import sharded_linalg  # noqa: F401  (register numpy's contractions)
from fabric.mesh import sharded_selection  # noqa: F401  (register masks and assignment)
from fabric.mesh import sharded_statistics  # noqa: F401  (register numpy's statistics)
from fabric.mesh.sharded import ShardedTensor
from fabric.mesh.sharding import along, block_ranges, split_blocks
from fabric.transport.moves import move_all

Shape = tuple[int, ...]
Session = Any  # a fabric.Session (which imports this module: named, not imported)


def close_each(closing: Sequence[Any], timeout: float | None) -> None:
    """``close(timeout)`` each of ``closing`` (sessions, meshes), even after another's error,
    and raise the first error."""
    failure = None
    for each in closing:
        try:
            each.close(timeout)
        except Exception as exc:  # (the others are still closed)
            failure = failure or exc
    if failure is not None:
        raise failure


class Mesh:
    """Sessions on several devices that hold sharded tensors (``session.mesh()``): use as a
    context manager or call ``close()``; the session that opened it closes it too."""

    def __init__(self, parent: Session, sessions: list[Session],
                 skipped: Sequence[int] = ()) -> None:
        self.parent = parent
        self.sessions = sessions
        self.devices: tuple[int, ...] = tuple(s.device.index for s in sessions)
        # Devices a default mesh left out because they were draining (``open``)
        self.skipped: tuple[int, ...] = tuple(skipped)
        self.random = MeshRandom(self)
        self.closed = False

    @classmethod
    def open(cls, parent: Session, devices: Sequence[int] | None = None) -> "Mesh":
        """A mesh of a session per device of ``devices`` (by default every online device
        that is not draining, with a warning naming those left out), each opened over
        ``parent``'s connection."""
        skipped: list[int] = []
        if devices is None:
            listed = parent.devices()
            devices = [device.index for device in listed if not device.draining]
            skipped = [device.index for device in listed if device.draining]
            if skipped and not devices:
                raise DeviceDraining(
                    f"Every online device is draining ({', '.join(map(str, skipped))}): an "
                    "administrator stopped their workers from taking new sessions. Ask for "
                    "one to be undrained (fabric admin undrain WORKER), or wait for another "
                    "worker.", devices=skipped)
            if skipped:
                warnings.warn(f"The mesh leaves out device(s) {', '.join(map(str, skipped))}: "
                              "draining (their workers take no new sessions).", stacklevel=3)
        elif isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence) or any(
                isinstance(d, bool) or not isinstance(d, (int, np.integer)) for d in devices):
            raise TypeError("devices= takes a list of device indexes (ints), not "
                            f"{named(devices)}.")
        devices = [operator.index(d) for d in devices]
        if not devices or len(set(devices)) != len(devices):
            raise ValueError(f"devices= must name at least one device, each once, not {devices}: "
                             "fabric.devices(...) lists them.")
        sessions: list[Session] = []
        try:
            for device in devices:
                sessions.append(parent.open(device))
        except BaseException:
            for session in sessions:
                session.close()
            raise
        mesh = cls(parent, sessions, skipped)
        parent.meshes.append(mesh)
        return mesh

    def _fields(self) -> list[tuple[str, Any]]:
        """What the client knows of the mesh (``fabric.arrays.html_repr``): no device asked."""
        fields: list[tuple[str, Any]] = [
            ("devices", list(self.devices)),
            ("backends", [session.device.backend for session in self.sessions]),
            ("state", "closed" if self.closed else "open")]
        if self.skipped:
            fields.append(("skipped draining", list(self.skipped)))
        return fields

    def __repr__(self) -> str:
        return one_line("Mesh", self._fields())

    def _repr_html_(self) -> str:
        """The notebook's view: the mesh's fields, and its devices drawn in a row."""
        return table("Mesh", self._fields(), devices_svg(
            [f"device {s.device.index} ({s.device.backend})" for s in self.sessions]))

    def __enter__(self) -> "Mesh":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self, timeout: float | None = None) -> None:
        """Close the mesh's sessions, freeing what they hold (idempotent); ``timeout``: how
        long each may wait for its device (default: the session's)."""
        if self.closed:
            return
        self.closed = True
        self.parent.meshes.remove(self)
        combining.forget_sessions(self.sessions)
        close_each(self.sessions, timeout)

    # -- reading -------------------------------------------------------------------------------

    def gather(self, tensors: Sequence[Tensor],
               outs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """The values of ``tensors`` (each of one of the mesh's sessions), every read sent
        before any is waited for, so the devices answer in parallel; with ``outs`` (one
        array of each tensor's shape), written into those, which are returned."""
        reads = []
        try:
            for index, tensor in enumerate(tensors):
                out = None if outs is None else outs[index]
                reads.append(tensor.session.start_read(tensor, out=out))
            if outs is None:
                return [read.result() for read in reads]
            return [read_target.fill(out, read.result()) for out, read in zip(outs, reads)]
        finally:  # (after an error: the replies still to come are dropped)
            for read in reads:
                read.cancel()

    # -- making sharded tensors ----------------------------------------------------------------

    def per_device(self, shape: Any, axis: int | None,
                   make: Callable[[Session, Shape], Tensor]) -> ShardedTensor:
        """A sharded tensor of ``shape`` whose shards ``make(session, block_shape)`` creates
        on each device: split along ``axis`` in ``array_split`` blocks, or (None) whole on
        each."""
        shape = as_shape(shape)
        if axis is None:
            return ShardedTensor(self, [make(s, shape) for s in self.sessions], None)
        axis = normalize_axis_index(operator.index(axis), len(shape))
        blocks = split_blocks(shape[axis], len(self.sessions))
        return ShardedTensor(self, [make(s, shape[:axis] + (block,) + shape[axis + 1:])
                                    for s, block in zip(self.sessions, blocks)], axis)

    def asarray(self, array: Any, axis: int | None = 0, dtype: Any = None) -> ShardedTensor:
        """``array`` split along ``axis`` in near-equal blocks (numpy's ``array_split``
        rule), one uploaded to each device; ``axis=None`` replicates it. A tensor of one
        session is cut there and moved worker to worker; a sharded tensor is resharded."""
        if isinstance(array, ShardedTensor):
            resharded = array.reshard(axis)
            return resharded if dtype is None else resharded.astype(dtype)
        if isinstance(array, Tensor):
            whole = array if dtype is None else array.astype(dtype)
            if axis is None:
                return ShardedTensor(self, move_all([(whole, s) for s in self.sessions]), None)
            axis = normalize_axis_index(operator.index(axis), whole.ndim)
            bounds = block_ranges(split_blocks(whole.shape[axis], len(self.sessions)))
            return ShardedTensor(self, move_all([(whole[along(axis, whole.ndim, slice(*b))], s)
                                                 for s, b in zip(self.sessions, bounds)]), axis)
        values = np.asarray(array, dtype=dtype)
        if axis is None:
            return ShardedTensor(self, [s.asarray(values) for s in self.sessions], None)
        axis = normalize_axis_index(operator.index(axis), values.ndim)
        pieces = np.array_split(values, len(self.sessions), axis=axis)
        return ShardedTensor(self, [s.asarray(p) for s, p in zip(self.sessions, pieces)], axis)

    def replicate(self, array: Any) -> ShardedTensor:
        """The same array on every device of the mesh (a numpy array uploaded to each, a
        tensor moved worker to worker, a sharded tensor gathered on each device)."""
        return self.asarray(array, axis=None)

    def from_shards(self, shards: Sequence[Any], axis: int = 0) -> ShardedTensor:
        """A sharded tensor made of ``shards``, one per device of the mesh in order, joined
        along ``axis``: each a tensor of that device's session (``mesh.sessions[i]``) or an
        array, uploaded there. Their shapes must agree but along ``axis``, and their dtypes."""
        if len(shards) != len(self.sessions):
            raise ValueError(f"from_shards takes one shard per device of the mesh "
                             f"({len(self.sessions)}), not {len(shards)}.")
        tensors = []
        for i, (shard, session) in enumerate(zip(shards, self.sessions)):
            if not isinstance(shard, Tensor):
                shard = session.asarray(shard)
            elif shard.session is not session:
                raise ValueError(f"Shard {i} is not a tensor of device {session.device.index}'s "
                                 f"session: move it there with .to(mesh.sessions[{i}]).")
            tensors.append(shard)
        first = tensors[0]
        axis = normalize_axis_index(operator.index(axis), first.ndim)
        for i, shard in enumerate(tensors):
            if shard.dtype != first.dtype:
                raise TypeError(f"Shard {i} is {shard.dtype} and shard 0 {first.dtype}: cast "
                                "them to one dtype with .astype(...) first.")
            if shard.ndim != first.ndim or any(
                    n != m for d, (n, m) in enumerate(zip(shard.shape, first.shape)) if d != axis):
                raise ValueError(f"Shard {i} has shape {shard.shape} and shard 0 {first.shape}: "
                                 f"shards may differ along axis {axis} only.")
        return ShardedTensor(self, tensors, axis)

    def zeros(self, shape: Any, dtype: Any = "float64", axis: int | None = 0) -> ShardedTensor:
        """Zeros, made on the devices, split along ``axis`` (None: on each device)."""
        return self.per_device(shape, axis, lambda s, block: s.zeros(block, dtype))

    def ones(self, shape: Any, dtype: Any = "float64", axis: int | None = 0) -> ShardedTensor:
        """Ones, made on the devices, split along ``axis`` (None: on each device)."""
        return self.per_device(shape, axis, lambda s, block: s.ones(block, dtype))

    def empty(self, shape: Any, dtype: Any = "float64", axis: int | None = 0) -> ShardedTensor:
        """Whatever the devices' memory held, split along ``axis`` (None: on each device)."""
        return self.per_device(shape, axis, lambda s, block: s.empty(block, dtype))

    def full(self, shape: Any, fill_value: Any, dtype: Any = None,
             axis: int | None = 0) -> ShardedTensor:
        """``fill_value`` everywhere, made on the devices, split along ``axis``."""
        return self.per_device(shape, axis, lambda s, block: s.full(block, fill_value, dtype))


class MeshRandom:
    """Random sharded tensors, each shard drawn on its device from that session's generator:
    ``seed`` makes every device's draws reproducible, and distinct from the others'."""

    def __init__(self, mesh: Mesh) -> None:
        self._mesh = mesh

    def seed(self, seed: int) -> None:
        """Seed each device's generator with its own child of ``seed`` (numpy's
        ``SeedSequence.spawn``): the same seed on a mesh of the same devices draws the same."""
        children = np.random.SeedSequence(operator.index(seed)).spawn(len(self._mesh.sessions))
        for session, child in zip(self._mesh.sessions, children):
            session.random.seed(int(child.generate_state(1, np.uint64)[0]))

    def _draw(self, size: Any, axis: int | None,
              draw: Callable[[Session, Shape], Tensor]) -> ShardedTensor:
        if axis is None:
            raise ValueError("Each device draws its own values, so a random tensor is split: "
                             "give an axis, or draw on one session and replicate it with "
                             "mesh.replicate(session.random...).")
        return self._mesh.per_device(size, axis, draw)

    def uniform(self, low: float = 0.0, high: float = 1.0, size: Any = (),
                dtype: Any = "float64", axis: int = 0) -> ShardedTensor:
        """Uniform draws from [low, high), of shape ``size``, split along ``axis``."""
        return self._draw(size, axis, lambda s, block: s.random.uniform(low, high, block, dtype))

    def normal(self, loc: float = 0.0, scale: float = 1.0, size: Any = (),
               dtype: Any = "float64", axis: int = 0) -> ShardedTensor:
        """Normal draws of mean ``loc`` and deviation ``scale``, split along ``axis``."""
        return self._draw(size, axis, lambda s, block: s.random.normal(loc, scale, block, dtype))

    def random(self, size: Any = (), dtype: Any = "float64", axis: int = 0) -> ShardedTensor:
        """Uniform draws from [0, 1), of shape ``size``, split along ``axis``."""
        return self._draw(size, axis, lambda s, block: s.random.random(block, dtype))

    def integers(self, low: int, high: int | None = None, size: Any = (), dtype: Any = "int64",
                 endpoint: bool = False, axis: int = 0) -> ShardedTensor:
        """Integers drawn uniformly from [low, high) (as numpy's ``Generator.integers``),
        split along ``axis``."""
        return self._draw(size, axis, lambda s, block: s.random.integers(
            low, high, block, dtype, endpoint))
