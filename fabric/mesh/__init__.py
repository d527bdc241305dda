"""Meshes of devices and the sharded tensors on them: how a tensor lies on its devices, each
shard's ops, reductions combined across shards, and the array API standard's namespace of a
mesh (``x.__array_namespace__()`` of a sharded tensor).
"""
