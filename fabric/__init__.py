"""Fabric: numpy-style arrays that live on remote devices, served over ZeroMQ."""

from .client import Device, Session, connect, devices
from .cluster import LocalCluster
from .errors import (
    AuthenticationError,
    ConnectError,
    DeviceNotHostable,
    FabricError,
    HandshakeError,
    HandshakeTimeout,
    NoSuchDevice,
    ProtocolError,
    RemoteError,
    ServerDisconnected,
    SessionLost,
    VersionMismatch,
)
from .protocol import PROTOCOL_VERSION

__version__ = "0.1.0"

__all__ = [
    "PROTOCOL_VERSION", "AuthenticationError", "ConnectError", "Device", "DeviceNotHostable",
    "FabricError", "HandshakeError", "HandshakeTimeout", "LocalCluster", "NoSuchDevice",
    "ProtocolError", "RemoteError", "ServerDisconnected", "Session", "SessionLost",
    "VersionMismatch", "connect", "devices",
]
