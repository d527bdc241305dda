"""Fabric: numpy-style arrays that live on remote devices, served over ZeroMQ."""

from .admin import Admin
from .capture import Trace, capture
from .client import Device, Session, connect, devices
from .cluster import LocalCluster
from .errors import (
    AuthenticationError,
    ConnectError,
    DeviceNotHostable,
    EncryptionError,
    FabricError,
    GraphError,
    HandshakeError,
    HandshakeTimeout,
    MessageTooLarge,
    NoSuchDevice,
    ProtocolError,
    RemoteError,
    RequestTimeout,
    ServerDisconnected,
    SessionLost,
    TooManySessions,
    TraceError,
    VersionMismatch,
)
from .graph import Function, function
from .protocol import PROTOCOL_VERSION
from .security import CurveClient, CurveServer, generate_keys
from .tensor import Tensor

__version__ = "0.1.0"

__all__ = [
    "PROTOCOL_VERSION", "Admin", "AuthenticationError", "ConnectError", "CurveClient",
    "CurveServer", "Device", "DeviceNotHostable", "EncryptionError", "FabricError", "Function",
    "GraphError", "HandshakeError", "HandshakeTimeout", "LocalCluster", "NoSuchDevice",
    "ProtocolError", "RemoteError", "ServerDisconnected", "Session", "SessionLost", "Tensor",
    "Trace", "TraceError", "VersionMismatch", "capture", "connect", "devices", "function",
    "generate_keys", "MessageTooLarge", "RequestTimeout", "TooManySessions",
]
