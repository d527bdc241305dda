"""A ``fabric.function`` called with sharded tensors: its graph replayed on each shard's device.

Rule: the function sees each device's block, as dask's ``map_blocks`` does, so it must treat
the split axis's rows apart. Its sharded arguments must be split alike; replicated ones and
constants go to every device as they are. It is traced for the whole array's shapes too, so
numpy's errors come at the call with the whole array's shapes, and each result must be the
whole one's cut along some axis (``sharding.joined_axis``): a result that is not (a reduction
over the split axis, a reshape across it) is refused before anything is sent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fabric.arrays.tensor import Tensor
from fabric.mesh.sharded import ShardedTensor, mesh_operands, split_differently
from fabric.mesh.sharding import joined_axis

Function = Any  # a fabric.Function (whose module imports this one: named, not imported)


def call_per_shard(function: Function, structure: Any, leaves: list[Any]) -> Any:
    """Queue ``function``'s graph on each device of the sharded ``leaves``' mesh, with that
    device's shards; its result, each tensor a sharded one (split as the arguments are, or
    replicated when they all are)."""
    if any(isinstance(leaf, np.ndarray) for leaf in leaves):
        raise TypeError(f"{function.name} got a numpy array beside sharded tensors: put it on "
                        "the mesh first (mesh.replicate(array), or mesh.asarray(array, "
                        "axis=...) split as the others).")
    mesh, tensors = mesh_operands([leaf for leaf in leaves if isinstance(leaf, Tensor)])
    split = [t for t in tensors if t.axis is not None]
    for other in split[1:]:
        if other.sharding != split[0].sharding:
            raise split_differently(split[0], other)
    per_device = [[leaf._tensors()[i] if isinstance(leaf, ShardedTensor) else leaf
                   for leaf in leaves] for i in range(len(mesh.sessions))]
    for session, shard_leaves in zip(mesh.sessions, per_device):
        function.bind(shard_leaves, session)
    whole = function.traced(structure, leaves)  # numpy's errors, with the whole shapes
    graphs = [function.traced(structure, shard_leaves) for shard_leaves in per_device]
    axes = [None if not split else _result_axis(function, whole, graphs, j, split[0].axis)
            for j in range(len(whole.outputs))]
    results = [function.replay(session, graph, shard_leaves)
               for session, graph, shard_leaves in zip(mesh.sessions, graphs, per_device)]
    return whole.rebuild([ShardedTensor(mesh, [outputs[j] for outputs in results], axis)
                          for j, axis in enumerate(axes)])


def _result_axis(function: Function, whole: Any, graphs: list[Any], output: int,
                 split: int) -> int:
    """The axis along which the shards' ``output``-th results join into the whole array's."""
    shape, dtype = whole.outputs[output]
    parts = [graph.outputs[output] if len(graph.outputs) == len(whole.outputs) else ((), None)
             for graph in graphs]
    axis = joined_axis(shape, [part for part, _ in parts], split)
    if axis is None or any(part_dtype != dtype for _, part_dtype in parts):
        raise ValueError(
            f"{function.name} applied to each shard gives results of shapes "
            f"{[part for part, _ in parts]}, which do not join into its result for the whole "
            f"array (shape {shape}) along any axis: it reduces or reshapes across the split "
            f"axis {split}, which needs data from every device. Return what each row gives "
            "and reduce it outside the function (f(x).sum(axis=0) combines the shards' "
            "partial results), or reshard first so that the axis it works along lies whole "
            "on each device (x.reshard(axis=...)).")
    return axis
