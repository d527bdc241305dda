"""Fabric: numpy-style arrays that live on remote devices, served over ZeroMQ.

Names load on first use (PEP 562): brokers and workers import only the sans-I/O core
(``fabric.protocol``, ``fabric.wire``, ...), and must not pay for the client, the cluster
launcher or asyncio.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Each public name and the module that defines it.
_ERRORS = (
    "AuthenticationError", "ConnectError", "DeviceNotHostable", "EncryptionError", "FabricError",
    "GraphError", "HandshakeError", "HandshakeTimeout", "MessageTooLarge", "NoSuchDevice",
    "ProtocolError", "RemoteError", "RemoteWarning", "RequestTimeout", "ServerDisconnected",
    "SessionLost", "TooManySessions", "TraceError", "VersionMismatch", "WrongPort",
)
_HOMES = {
    "Admin": "admin", "Trace": "trace", "capture": "trace", "Device": "device",
    "Session": "session", "connect": "client", "devices": "client", "LocalCluster": "cluster",
    "Function": "graph", "function": "graph", "PROTOCOL_VERSION": "protocol",
    "CurveClient": "security", "CurveServer": "security", "generate_keys": "security",
    "Tensor": "tensor", "Mesh": "mesh", "ShardedTensor": "sharded", "Sharding": "sharding",
    "SharedMemory": "shm",
    **{name: "errors" for name in _ERRORS},
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'fabric' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
