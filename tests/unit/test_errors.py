"""The error hierarchy: stable wire codes, and errors that survive the trip over the wire."""

from __future__ import annotations

import pytest

from fabric.core import errors, protocol
from fabric.core.errors import (
    ERRORS_BY_CODE,
    ConnectError,
    FabricError,
    HandshakeError,
    NoSuchDevice,
    VersionMismatch,
    error_from_wire,
)
from fabric.core.protocol import Kind

# The codes travel on the wire between versions: renaming one is a protocol change.
STABLE_CODES = {
    "FabricError": "fabric_error",
    "ConnectError": "connect_failed",
    "EncryptionError": "encryption_failed",
    "HandshakeError": "handshake_failed",
    "ServerDisconnected": "server_disconnected",
    "HandshakeTimeout": "handshake_timeout",
    "VersionMismatch": "version_mismatch",
    "AuthenticationError": "unauthorized",
    "NoSuchDevice": "no_such_device",
    "DeviceOffline": "device_offline",
    "DeviceDraining": "device_draining",
    "DuplicateSession": "duplicate_session",
    "TooManySessions": "too_many_sessions",
    "MessageTooLarge": "message_too_large",
    "SessionLost": "session_lost",
    "SessionClosed": "session_closed",
    "ResumeRefused": "resume_refused",
    "RequestTimeout": "timeout",
    "RemoteError": "remote_error",
    "QuotaExceeded": "quota_exceeded",
    "GraphError": "graph_error",
    "DtypeNotSupported": "dtype_not_supported",
    "TraceError": "trace_error",
    "ProtocolError": "protocol_error",
    "DeviceNotHostable": "device_not_hostable",
    "BackendMissing": "backend_missing",
    "WorkerNameTaken": "worker_name_taken",
    "WrongPort": "wrong_port",
    "NotFound": "not_found",
    "ConfigError": "config_error",
    "ClusterError": "cluster_error",
    "BrokerPassive": "broker_passive",
    "NoActiveBroker": "no_active_broker",
    "ReplyLost": "reply_lost",
}


def all_error_classes() -> list[type[FabricError]]:
    """FabricError and every subclass, found by walking the hierarchy (not the module's map)."""
    found, todo = [], [FabricError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


ALL = [cls for cls in all_error_classes() if cls.__module__ == errors.__name__]


def test_every_error_class_is_known_and_its_code_is_pinned():
    assert {cls.__name__: cls.code for cls in ALL} == STABLE_CODES


def test_codes_are_unique_and_declared_on_each_class():
    codes = [cls.code for cls in ALL]
    assert len(codes) == len(set(codes))
    for cls in ALL:
        # Declared on the class itself, not inherited: an inherited code would make the
        # subclass indistinguishable on the wire.
        assert "code" in vars(cls), cls.__name__


def test_errors_by_code_maps_each_code_to_its_class():
    for cls in ALL:
        assert ERRORS_BY_CODE[cls.code] is cls


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_round_trip_through_the_wire_body(cls):
    original = cls("Something went wrong: do this instead.", session=7, device=2,
                   nested={"a": [1, 2]})
    body = original.to_wire()
    assert body == {"code": cls.code, "message": original.message,
                    "details": {"session": 7, "device": 2, "nested": {"a": [1, 2]}}}
    rebuilt = error_from_wire(body)
    assert type(rebuilt) is cls
    assert rebuilt.code == cls.code
    assert rebuilt.message == original.message
    assert str(rebuilt) == str(original)
    assert rebuilt.details == original.details


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_round_trip_through_encoded_frames(cls):
    original = cls("Through msgpack and back.", reason="r", count=3)
    frames = protocol.encode(protocol.error_message(original, kind=Kind.ERROR, session=9))
    rebuilt = error_from_wire(protocol.decode(frames).body)
    assert type(rebuilt) is cls
    assert rebuilt.details == {"reason": "r", "count": 3}


def test_version_mismatch_carries_both_versions():
    rebuilt = error_from_wire(VersionMismatch("v", client_version=2, server_version=1).to_wire())
    assert isinstance(rebuilt, VersionMismatch)
    assert (rebuilt.client_version, rebuilt.server_version) == (2, 1)
    assert VersionMismatch("no details").client_version is None


def test_no_such_device_carries_the_device_count():
    rebuilt = error_from_wire(NoSuchDevice("d", device=5, device_count=2).to_wire())
    assert isinstance(rebuilt, NoSuchDevice)
    assert rebuilt.device_count == 2
    assert rebuilt.details["device"] == 5
    assert NoSuchDevice("no details").device_count is None


def test_unknown_code_gives_a_generic_error_that_keeps_the_code():
    rebuilt = error_from_wire({"code": "brand_new_code", "message": "From a newer peer.",
                               "details": {"x": 1}})
    assert type(rebuilt) is FabricError
    assert rebuilt.code == "brand_new_code"
    assert rebuilt.message == "From a newer peer."
    assert rebuilt.details == {"x": 1}
    # The code is kept on that instance only; the class's own code is untouched.
    assert FabricError.code == "fabric_error"
    assert FabricError("fresh").code == "fabric_error"


def test_handshake_errors_are_connect_errors():
    handshake_classes = [cls for cls in ALL if issubclass(cls, HandshakeError)]
    assert {cls.__name__ for cls in handshake_classes} == {
        "HandshakeError", "ServerDisconnected", "HandshakeTimeout", "VersionMismatch",
        "AuthenticationError", "NoSuchDevice", "DeviceOffline", "DeviceDraining",
        "DuplicateSession", "TooManySessions", "BrokerPassive"}
    for cls in handshake_classes:
        assert issubclass(cls, ConnectError)
        assert isinstance(error_from_wire(cls("x").to_wire()), ConnectError)


def test_errors_outside_the_handshake_are_not_connect_errors():
    for name in ("SessionLost", "RequestTimeout", "RemoteError", "ProtocolError"):
        assert not issubclass(getattr(errors, name), ConnectError)


@pytest.mark.parametrize("details", [
    {1: "non-string key"},  # msgpack maps may have any keys
    {"message": "collides with the constructor's argument"},
    "not a map",
    None,
])
def test_odd_details_from_a_peer_still_give_the_typed_error(details):
    rebuilt = error_from_wire({"code": "session_lost", "message": "Gone.", "details": details})
    assert type(rebuilt) is errors.SessionLost
    assert rebuilt.message == "Gone."
    assert rebuilt.details == (details if isinstance(details, dict) else {})


def test_missing_message_gives_an_empty_message():
    rebuilt = error_from_wire({"code": "timeout"})
    assert type(rebuilt) is errors.RequestTimeout
    assert (rebuilt.message, rebuilt.details) == ("", {})


def _error_classes() -> list[type]:
    return [value for value in vars(errors).values()
            if isinstance(value, type) and value.__module__ == errors.__name__]


def test_every_error_class_is_reachable_at_the_package_root() -> None:
    import fabric

    for cls in _error_classes():
        assert getattr(fabric, cls.__name__) is cls, cls.__name__
        assert cls.__name__ in fabric.__all__


def test_the_module_opens_with_the_tree_of_its_classes() -> None:
    # Each class appears in the docstring's tree under its own base, and no other name does.
    tree = [line for line in errors.__doc__.splitlines() if line.startswith("    ")]
    depth_and_name = []
    for line in tree:
        name = line.lstrip(" │├└─").split()[0]
        depth_and_name.append(((len(line) - len(line.lstrip(" │├└─"))) // 4, name))
    parents: dict[int, str] = {}
    seen = {}
    for depth, name in depth_and_name:
        parents[depth] = name
        seen[name] = parents.get(depth - 1)
    classes = {cls.__name__: cls for cls in _error_classes()}
    assert set(seen) == set(classes)
    for name, parent in seen.items():
        if parent is not None:
            assert classes[parent] in classes[name].__bases__, (name, parent)
        else:
            assert not issubclass(classes[name], errors.FabricError) or name == "FabricError"
