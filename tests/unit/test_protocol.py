"""The wire protocol, sans I/O: round trips, validation, and that bad bytes only ever raise
ProtocolError (never an IndexError, struct.error or msgpack exception)."""

from __future__ import annotations

import struct

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fabric.core import protocol
from fabric.core.errors import FabricError, NoSuchDevice, ProtocolError, error_from_wire
from fabric.core.protocol import (
    BODY_SCHEMAS,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_ID,
    PROTOCOL_VERSION,
    Header,
    Kind,
    Message,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# One valid value per schema type; (int, float) gets a float to show floats are accepted.
_SAMPLE_VALUES = {str: "text", int: 3, dict: {"k": 1}, list: [1, "two"], (int, float): 0.25,
                  bytes: b"\x00ticket"}


def valid_body(kind: Kind) -> dict:
    """A body with every required field of ``kind`` (empty for kinds without a schema)."""
    return {name: _SAMPLE_VALUES[expected] for name, expected in BODY_SCHEMAS.get(kind, {}).items()}


def valid_frames(kind: Kind = Kind.HELLO, **body_changes) -> list:
    body = {**valid_body(kind), **body_changes}
    return protocol.encode(Message(kind, 5, 6, body))


def type_ok(value, expected) -> bool:
    """The protocol's type rule, written out independently: bool is never a number."""
    allowed = expected if isinstance(expected, tuple) else (expected,)
    if isinstance(value, bool):
        return bool in allowed
    return isinstance(value, allowed)


# -- round trips ---------------------------------------------------------------------------


def test_header_is_22_bytes_and_starts_with_the_magic():
    packed = Header(Kind.HELLO, session=1, request=2).pack()
    assert HEADER_SIZE == 22 == len(packed)
    assert packed[:2] == MAGIC


def test_every_schema_type_has_a_sample_value():
    # Guards the helpers above: a new schema type must get a sample, not a KeyError at import.
    assert {t for schema in BODY_SCHEMAS.values() for t in schema.values()} <= set(_SAMPLE_VALUES)


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
@pytest.mark.parametrize("buffers", [(), (b"\x00" * 10, b"", bytearray(b"abc"))],
                         ids=["no-buffers", "buffers"])
def test_round_trip_every_kind(kind, buffers):
    message = Message(kind, session=0xDEADBEEF, request=42, body=valid_body(kind),
                      buffers=buffers)
    frames = protocol.encode(message)
    body_frames = 1 if message.body else 0  # an empty body is left out
    assert len(frames) == 1 + body_frames + len(buffers)
    decoded = protocol.decode(frames)
    assert decoded == message
    assert decoded.kind is kind
    assert decoded.version == PROTOCOL_VERSION
    # Buffers are handed on as the very objects that arrived, never copied.
    assert len(decoded.buffers) == len(buffers)
    assert all(got is sent for got, sent in zip(decoded.buffers, frames[1 + body_frames:]))


def test_an_empty_body_is_left_out_and_the_header_says_so():
    buffer = b"\x01" * 8
    frames = protocol.encode(Message(Kind.REPLY, 3, 4, buffers=(buffer,)))
    assert len(frames) == 2 and frames[1] is buffer
    assert protocol.decode_header(frames[0]).flags & protocol.NO_BODY
    decoded = protocol.decode(frames)
    assert decoded.body == {} and decoded.buffers == (buffer,)
    # With a body, the flag is off and the body frame is there.
    frames = protocol.encode(Message(Kind.REPLY, 3, 4, {"ok": True}, (buffer,)))
    assert len(frames) == 3 and not protocol.decode_header(frames[0]).flags & protocol.NO_BODY


def test_a_request_that_carries_a_batch_says_so_in_its_header():
    def flags(kind: Kind, body: dict) -> int:
        return protocol.decode_header(protocol.encode(Message(kind, 3, 4, body))[0]).flags
    assert flags(Kind.REQUEST, {"op": "read", "id": 1, "ops": []}) == protocol.CARRIES_BATCH
    assert flags(Kind.REQUEST, {"op": "read", "id": 1}) == 0
    assert flags(Kind.SUBMIT, {"ops": []}) == 0  # (a SUBMIT is a batch by its kind)


def test_a_lone_header_without_the_no_body_flag_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="a header and a body are needed"):
        protocol.decode([Header(Kind.PING, 1, 2).pack()])


def test_a_left_out_body_is_still_checked_against_its_kinds_schema():
    header = Header(Kind.HELLO, 1, 2, flags=protocol.NO_BODY).pack()
    with pytest.raises(ProtocolError, match="'token'"):
        protocol.decode([header])


@pytest.mark.parametrize("session,request_id", [(0, 0), (MAX_ID, MAX_ID), (1, MAX_ID - 1)])
def test_round_trip_keeps_the_full_64_bit_ids(session, request_id):
    decoded = protocol.decode(protocol.encode(Message(Kind.PING, session, request_id)))
    assert (decoded.session, decoded.request) == (session, request_id)


def test_decode_header_keeps_flags_and_version():
    header = Header(Kind.SUBMIT, session=9, request=8, version=7, flags=0x81)
    assert protocol.decode_header(header.pack()) == header


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, zmq.Frame],
                         ids=["bytes", "bytearray", "memoryview", "zmq.Frame"])
def test_decode_accepts_every_frame_type_the_io_loop_hands_over(wrap):
    frames = protocol.encode(Message(Kind.HELLO, 3, 4, {"token": "t", "device": 1},
                                     buffers=(b"payload",)))
    decoded = protocol.decode([wrap(f) for f in frames])
    assert (decoded.kind, decoded.session, decoded.request) == (Kind.HELLO, 3, 4)
    assert decoded.body == {"token": "t", "device": 1}


def test_extra_body_fields_are_allowed():
    decoded = protocol.decode(valid_frames(Kind.HELLO, client="pid 1", future_field=[1, 2]))
    assert decoded.body["future_field"] == [1, 2]


def test_body_of_another_version_is_not_validated():
    # Another version may lay out its bodies differently; the receiver checks the version
    # (and answers with a VersionMismatch) instead of a misleading field error.
    frames = protocol.encode(Message(Kind.HELLO, 1, 1, {}, version=PROTOCOL_VERSION + 1))
    decoded = protocol.decode(frames)
    assert decoded.version == PROTOCOL_VERSION + 1
    assert decoded.body == {}


def test_error_message_carries_a_typed_error_that_survives_the_wire():
    error = NoSuchDevice("Device 9 does not exist.", device=9, device_count=2)
    message = protocol.error_message(error, kind=Kind.REJECT, session=5, request=6)
    decoded = protocol.decode(protocol.encode(message))
    assert (decoded.kind, decoded.session, decoded.request) == (Kind.REJECT, 5, 6)
    rebuilt = error_from_wire(decoded.body)
    assert type(rebuilt) is NoSuchDevice
    assert rebuilt.details == {"device": 9, "device_count": 2}


# -- specific malformed input --------------------------------------------------------------


def _header(magic=MAGIC, version=PROTOCOL_VERSION, kind=int(Kind.HELLO), flags=0, session=1,
            request=1) -> bytes:
    return HEADER.pack(magic, version, kind, flags, session, request)


@pytest.mark.parametrize("frame", [b"", b"FB", _header()[:-1], _header() + b"\x00"],
                         ids=["empty", "magic-only", "one-short", "one-long"])
def test_wrong_header_size(frame):
    with pytest.raises(ProtocolError, match=rf"{len(frame)} bytes, not {HEADER_SIZE}"):
        protocol.decode_header(frame)
    with pytest.raises(ProtocolError, match="not speaking the fabric protocol"):
        protocol.decode([frame, protocol.pack_body(valid_body(Kind.HELLO))])


def test_wrong_magic():
    with pytest.raises(ProtocolError, match="wrong magic"):
        protocol.decode([_header(magic=b"ZZ"), protocol.pack_body(valid_body(Kind.HELLO))])


@pytest.mark.parametrize("kind", [0, 19, 39, 45, 255])
def test_unknown_kind(kind):
    assert kind not in protocol.KNOWN_KINDS
    with pytest.raises(ProtocolError, match=rf"Unknown message kind {kind}\b") as caught:
        protocol.decode([_header(kind=kind), protocol.pack_body({})])
    assert caught.value.details == {"kind": kind}


@pytest.mark.parametrize("count", [0, 1])
def test_too_few_frames(count):
    with pytest.raises(ProtocolError, match=rf"{count} frame\(s\).*header and a body"):
        protocol.decode(valid_frames()[:count])


@pytest.mark.parametrize("body", [b"\xc1", b"\x92\x01", b"\x81\xa1a", b"\x80\x00"],
                         ids=["reserved-byte", "truncated-array", "truncated-map", "extra-data"])
def test_body_not_msgpack(body):
    with pytest.raises(ProtocolError, match="not valid msgpack"):
        protocol.decode([_header(), body])


@pytest.mark.parametrize("value,name", [([1, 2], "list"), ("hello", "str"), (3, "int"),
                                        (None, "NoneType")])
def test_body_not_a_map(value, name):
    with pytest.raises(ProtocolError, match=rf"body is a {name}, not a map"):
        protocol.decode([_header(), msgpack.packb(value)])


@pytest.mark.parametrize("kind,field", [(k, f) for k, s in BODY_SCHEMAS.items() for f in s],
                         ids=lambda v: v.name if isinstance(v, Kind) else v)
def test_missing_required_field(kind, field):
    body = valid_body(kind)
    del body[field]
    with pytest.raises(ProtocolError, match=rf"{kind.name} body field '{field}'") as caught:
        protocol.decode(protocol.encode(Message(kind, body=body)))
    assert caught.value.details == {"field": field}


@pytest.mark.parametrize("kind,field,value", [
    (Kind.HELLO, "device", "0"),
    (Kind.HELLO, "device", 1.0),
    (Kind.HELLO, "device", None),
    (Kind.HELLO, "token", b"bytes-token"),
    (Kind.HELLO, "token", 123),
    (Kind.REGISTER, "devices", {"not": "a list"}),
    (Kind.ERROR, "details", []),
    (Kind.WELCOME, "heartbeat", "1.0"),
])
def test_mistyped_required_field(kind, field, value):
    with pytest.raises(ProtocolError, match=rf"'{field}' is missing or has the wrong type"):
        protocol.decode(valid_frames(kind, **{field: value}))


@pytest.mark.parametrize("kind,field", [
    (Kind.HELLO, "device"), (Kind.OPEN, "device"), (Kind.WELCOME, "device_count"),
    (Kind.WELCOME, "heartbeat"), (Kind.REGISTERED, "heartbeat"),
], ids=lambda v: v.name if isinstance(v, Kind) else v)
@pytest.mark.parametrize("value", [True, False])
def test_bool_is_not_a_number(kind, field, value):
    with pytest.raises(ProtocolError, match=rf"'{field}'"):
        protocol.decode(valid_frames(kind, **{field: value}))


@pytest.mark.parametrize("value", [1, 0.5])
def test_heartbeat_accepts_int_and_float(value):
    assert protocol.decode(valid_frames(Kind.WELCOME, heartbeat=value)).body["heartbeat"] == value


def test_protocol_error_is_a_fabric_error_with_its_wire_code():
    with pytest.raises(FabricError) as caught:
        protocol.decode([b"nonsense", b""])
    assert caught.value.code == "protocol_error"


# -- fuzzing: only ProtocolError ever escapes ----------------------------------------------


def check_decoded(message: Message) -> None:
    """What a successful decode promises."""
    assert isinstance(message, Message)
    assert isinstance(message.kind, Kind)
    assert isinstance(message.body, dict)
    if message.version == PROTOCOL_VERSION:
        for name, expected in BODY_SCHEMAS.get(message.kind, {}).items():
            assert type_ok(message.body.get(name), expected), (message.kind, name)


def decode_or_protocol_error(frames) -> None:
    try:
        message = protocol.decode(frames)
    except ProtocolError:
        return
    check_decoded(message)


@FUZZ
@given(st.lists(st.binary(max_size=40), max_size=5))
def test_fuzz_decode_arbitrary_frames(frames):
    decode_or_protocol_error(frames)


@FUZZ
@given(st.binary(max_size=40))
def test_fuzz_decode_header_arbitrary_bytes(data):
    try:
        header = protocol.decode_header(data)
    except ProtocolError:
        return
    assert len(data) == HEADER_SIZE and data[:2] == MAGIC
    assert isinstance(header.kind, Kind)


_FIELD_NAMES = sorted({name for schema in BODY_SCHEMAS.values() for name in schema})
_scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
            | st.text(max_size=8) | st.binary(max_size=8))
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(_FIELD_NAMES) | st.text(max_size=4), inner, max_size=4),
    max_leaves=10,
)


@st.composite
def plausible_messages(draw):
    """A well-formed header (mostly this version, any kind byte) and an arbitrary msgpack
    body that often uses the schema's field names with values of any type."""
    header = HEADER.pack(
        MAGIC,
        draw(st.sampled_from([PROTOCOL_VERSION] * 4 + [0, 2, 65535])),
        draw(st.sampled_from(sorted(protocol.KNOWN_KINDS)) | st.integers(0, 255)),
        draw(st.integers(0, 255)),
        draw(st.integers(0, MAX_ID)),
        draw(st.integers(0, MAX_ID)),
    )
    body = draw(st.dictionaries(st.sampled_from(_FIELD_NAMES), _values, max_size=6) | _values)
    buffers = draw(st.lists(st.binary(max_size=8), max_size=2))
    return [header, msgpack.packb(body, use_bin_type=True), *buffers]


@FUZZ
@given(plausible_messages())
def test_fuzz_decode_plausible_messages(frames):
    decode_or_protocol_error(frames)


@FUZZ
@given(st.sampled_from(sorted(BODY_SCHEMAS)), st.data())
def test_fuzz_decode_valid_bodies_with_one_field_of_any_type(kind, data):
    body = valid_body(kind)
    # Booleans get their own weight: bool is an int subclass, the classic type trap.
    body[data.draw(st.sampled_from(sorted(body)))] = data.draw(st.booleans() | _values)
    decode_or_protocol_error(protocol.encode(Message(kind, 1, 1, body)))


@st.composite
def mutated_messages(draw):
    """A valid message with its header and/or body flipped, truncated, extended or cut."""
    kind = draw(st.sampled_from(list(Kind)))
    frames = [bytearray(f) for f in valid_frames(kind)]
    for _ in range(draw(st.integers(1, 3))):
        mutate_bytes(draw, frames[draw(st.integers(0, len(frames) - 1))],
                     draw(st.sampled_from(BYTE_MUTATIONS)))
    return [bytes(f) for f in frames]


BYTE_MUTATIONS = ["flip", "truncate", "extend", "delete"]


def mutate_bytes(draw, target: bytearray, operation: str) -> None:
    """Apply one of BYTE_MUTATIONS to ``target`` in place (the fuzz tests share these)."""
    if operation == "flip" and target:
        target[draw(st.integers(0, len(target) - 1))] ^= draw(st.integers(1, 255))
    elif operation == "truncate":
        del target[draw(st.integers(0, len(target))):]
    elif operation == "extend":
        target += draw(st.binary(min_size=1, max_size=8))
    elif operation == "delete" and target:
        del target[draw(st.integers(0, len(target) - 1))]


@FUZZ
@given(mutated_messages())
def test_fuzz_decode_mutated_valid_messages(frames):
    decode_or_protocol_error(frames)


def test_encode_refuses_ids_beyond_64_bits():
    # The header struct is unsigned 64-bit: the biggest id encodes, one more is refused
    # by struct at encode time (the sender's bug), never silently truncated.
    protocol.encode(Message(Kind.PING, MAX_ID, MAX_ID))
    with pytest.raises(struct.error):
        protocol.encode(Message(Kind.PING, MAX_ID + 1))
