"""Fabric: numpy-style arrays that live on remote devices, served over ZeroMQ."""

from .admin import Admin
from .capture import Trace, capture
from .client import Device, Session, connect, devices
from .cluster import LocalCluster
from .errors import (
    AuthenticationError,
    ConnectError,
    DeviceNotHostable,
    FabricError,
    GraphError,
    HandshakeError,
    HandshakeTimeout,
    NoSuchDevice,
    ProtocolError,
    RemoteError,
    ServerDisconnected,
    SessionLost,
    TraceError,
    VersionMismatch,
)
from .graph import Function, function
from .protocol import PROTOCOL_VERSION

__version__ = "0.1.0"

__all__ = [
    "PROTOCOL_VERSION", "Admin", "AuthenticationError", "ConnectError", "Device",
    "DeviceNotHostable", "FabricError", "Function", "GraphError", "HandshakeError",
    "HandshakeTimeout", "LocalCluster", "NoSuchDevice", "ProtocolError", "RemoteError",
    "ServerDisconnected", "Session", "SessionLost", "Trace", "TraceError", "VersionMismatch",
    "capture", "connect", "devices", "function",
]
