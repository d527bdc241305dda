"""Meshes of devices and the sharded tensors on them: how a tensor lies on its devices, each
shard's ops, and reductions combined across shards.
"""
