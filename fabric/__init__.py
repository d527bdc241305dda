"""Fabric: numpy-style arrays that live on remote devices, served over ZeroMQ.

Names load on first use (PEP 562): brokers and workers import only the sans-I/O core
(``fabric.core.protocol``, ``fabric.core.wire``, ...), and must not pay for the client, the cluster
launcher or asyncio.
"""

from __future__ import annotations

import importlib
from typing import Any

from fabric.core.version import __version__

# Each public name and the module that defines it.
_ERRORS = (  # every class of fabric.core.errors (tests/unit/test_errors.py checks it)
    "AuthenticationError", "BackendMissing", "BrokerPassive", "ClusterError", "ConfigError",
    "ConnectError", "DeviceDraining", "DeviceNotHostable", "DeviceOffline", "DtypeNotSupported",
    "DuplicateSession", "EncryptionError", "FabricError",
    "GraphError", "HandshakeError", "HandshakeTimeout", "MessageTooLarge", "NoActiveBroker",
    "NoSuchDevice", "NotFound", "ProtocolError", "QuotaExceeded", "RemoteError", "RemoteWarning",
    "ReplyLost", "RequestTimeout", "ResumeRefused", "ServerDisconnected", "SessionClosed",
    "SessionLost",
    "TooManySessions", "TraceError", "VersionMismatch", "WorkerNameTaken", "WrongPort",
)
_HOMES = {
    "Admin": "client.admin", "Trace": "graphs.capture", "capture": "graphs.capture",
    "Device": "core.device", "Session": "client.session", "connect": "api",
    "devices": "api", "LocalCluster": "launch.local", "Function": "graphs.function",
    "function": "graphs.function", "PROTOCOL_VERSION": "core.protocol",
    "CurveClient": "core.security", "CurveServer": "core.security",
    "generate_keys": "core.security", "Tensor": "arrays.tensor", "Mesh": "mesh.device_mesh",
    "ShardedTensor": "mesh.sharded", "show_progress": "arrays.progress", "Sharding": "mesh.sharding", "SharedMemory": "core.shm",
    **{name: "core.errors" for name in _ERRORS},
}
# The subpackages, loaded on first use too (``fabric.core.flow.SUBMIT_WINDOW``).
_SUBPACKAGES = ("core", "arrays", "array_api", "transport", "mesh", "graphs", "client", "launch", "cli")

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'fabric' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES) | set(_SUBPACKAGES))
