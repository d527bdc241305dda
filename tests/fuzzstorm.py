"""The protocol storm: hypothesis strategies for hostile frames, raw peers that send them to
a broker, and the stored corpus the CI replays.

Rule: the storm attacks the broker, not the cluster around it. Every message is what a raw
zmq peer could send, valid or mutated (flipped, cut, extended bytes; frames dropped,
doubled, added; header fields and bodies replaced), from three peers: ``frontend`` (a
client), ``stranger`` (an unregistered worker) and ``worker`` (a worker registered as
``zz-fuzz-worker``, whose device sorts after the real ones). ``defang`` only keeps the storm
from using real credentials for what would legitimately change the cluster (an admin
``shutdown``, a worker registering under a real worker's name, ops run in a session the
storm opened); everything else reaches the broker as generated.

Regenerate the corpus (deterministic for a given hypothesis version) with::

    .venv/bin/python tests/fuzzstorm.py --write

which writes ``tests/corpus/storm.jsonl``: one JSON line per message, ``{"peer": ...,
"frames": [hex, ...]}``, after a first line that says where it came from.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import msgpack
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# (as a script, too: the helpers, the test modules it borrows from, the repository)
_TESTS = Path(__file__).resolve().parent
sys.path[:0] = [str(_TESTS), str(_TESTS / "unit"), str(_TESTS / "cluster"), str(_TESTS.parent)]

from rawpeers import RawDealer, frames_of  # noqa: E402
from test_bad_input import WORKERS_GARBAGE, FRONTEND_GARBAGE  # noqa: E402
from test_protocol import (  # noqa: E402
    BYTE_MUTATIONS,
    mutate_bytes,
    mutated_messages,
    plausible_messages,
)

from fabric.core import protocol  # noqa: E402
from fabric.core.errors import ProtocolError, WrongPort  # noqa: E402
from fabric.core.protocol import (  # noqa: E402
    DATA_KINDS,
    HEADER,
    MAX_ID,
    PROTOCOL_VERSION,
    Header,
    Kind,
)

CORPUS = Path(__file__).resolve().parent / "corpus" / "storm.jsonl"
PEERS = ("frontend", "stranger", "worker")
# The storm cluster's tokens (fixed, so that stored messages carry valid ones too).
CLIENT_TOKEN = "storm-client-token"
WORKER_TOKEN = "storm-worker-token"
ADMIN_TOKEN = "storm-admin-token"
FUZZ_WORKER = "zz-fuzz-worker"
HELLO_SESSIONS = (0xF00D, 0xF00E, 0xF00F)  # sessions the storm may really open
OTHER_SESSIONS = (0, 1, 0xBAD, MAX_ID)
READ_ONLY_ADMIN = frozenset({"ping", "status", "workers", "devices", "sessions"})

CLIENT_KINDS = [Kind.HELLO, Kind.DEVICES, Kind.CLOSE, Kind.PING, Kind.ADMIN, Kind.SUBMIT,
                Kind.REQUEST]
WORKER_KINDS = [Kind.REGISTER, Kind.HEARTBEAT, Kind.OPENED, Kind.CLOSED, Kind.ERROR,
                Kind.REJECT, Kind.REPLY, Kind.TRANSFER, Kind.PONG]

_tokens = st.sampled_from([CLIENT_TOKEN, WORKER_TOKEN, ADMIN_TOKEN, "", "wrong"])
_sessions = st.sampled_from(HELLO_SESSIONS + OTHER_SESSIONS) | st.integers(0, MAX_ID)
_small = st.integers(-2, 4)
_junk = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() \
    | st.text(max_size=6) | st.binary(max_size=6) | st.lists(st.integers(-9, 2**32), max_size=3)


def _body(kind: Kind) -> st.SearchStrategy[dict[str, Any]]:
    """A body a real peer would send with ``kind`` (tokens valid or not)."""
    error = st.fixed_dictionaries({
        "code": st.sampled_from(["session_lost", "protocol_error", "remote_error", "x"]),
        "message": st.text(max_size=10), "details": st.just({})})
    bodies: dict[Kind, st.SearchStrategy[dict[str, Any]]] = {
        Kind.HELLO: st.fixed_dictionaries({"token": _tokens, "device": _small}, optional={
            "client": st.text(max_size=6), "max_message_bytes": st.integers(-1, 2**40)}),
        Kind.DEVICES: st.fixed_dictionaries({"token": _tokens}),
        Kind.ADMIN: st.fixed_dictionaries({
            "token": _tokens, "command": st.sampled_from([*sorted(READ_ONLY_ADMIN), "close-session",
                                                          "drain", "shutdown", "nope"]),
            "args": st.dictionaries(st.sampled_from(["session", "worker", "x"]), _junk,
                                    max_size=2)}),
        Kind.SUBMIT: st.fixed_dictionaries({"ops": st.lists(  # ops, and ids freed among them
            st.lists(_junk, max_size=4) | st.integers(0, 9), max_size=3)}),
        Kind.REQUEST: st.fixed_dictionaries({"op": st.sampled_from(["sync", "read", "stats",
                                                                    "await", "nope"]),
                                             "id": _small}),
        Kind.REGISTER: st.fixed_dictionaries({
            "token": _tokens, "name": st.sampled_from([FUZZ_WORKER, "zz-fuzz-2"]),
            "backend": st.sampled_from(["numpy", "x"]),
            "devices": st.lists(st.just({}), max_size=3)}),
        Kind.ERROR: error, Kind.REJECT: error,
        Kind.REPLY: st.fixed_dictionaries({}, optional={"ok": st.booleans(), "dtype": _junk}),
        Kind.TRANSFER: st.fixed_dictionaries({"id": _small}, optional={
            "dtype": st.sampled_from(["<f8", "|u1", "x"]),
            "shape": st.lists(st.integers(-1, 4), max_size=2)}),
    }
    return bodies.get(kind, st.dictionaries(st.text(max_size=5), _junk, max_size=3))


@st.composite
def valid_messages(draw: st.DrawFn, kinds: list[Kind]) -> list[bytes]:
    """A well-formed message of one of ``kinds`` (mostly) or any kind, with a real body."""
    kind = draw(st.sampled_from(kinds) | st.sampled_from(list(Kind)))
    body = draw(_body(kind))
    buffers = draw(st.lists(st.binary(max_size=16), max_size=2)) \
        if kind in (Kind.SUBMIT, Kind.REPLY, Kind.TRANSFER) else []
    header = Header(kind, draw(_sessions), draw(st.integers(0, 1000))).pack()
    return [header, protocol.pack_body(body), *buffers]


@st.composite
def mutated(draw: st.DrawFn, message: st.SearchStrategy[list[bytes]]) -> list[bytes]:
    """``message`` with up to three mutations of its bytes, frames or header fields."""
    frames = [bytearray(f) for f in draw(message)]
    for _ in range(draw(st.integers(0, 3))):
        operation = draw(st.sampled_from(
            ["flip", "truncate", "extend", "delete", "drop", "double", "add", "header",
             "body"]))
        index = draw(st.integers(0, max(len(frames) - 1, 0)))
        target = frames[index] if frames else bytearray()
        if operation in BYTE_MUTATIONS:
            mutate_bytes(draw, target, operation)
        elif operation == "drop" and frames:
            del frames[index]
        elif operation == "double" and frames:
            frames.insert(index, bytearray(target))
        elif operation == "add":
            frames.insert(index, bytearray(draw(st.binary(max_size=24))))
        elif operation == "header" and frames and len(frames[0]) == HEADER.size:
            magic, version, kind, flags, session, request = HEADER.unpack(bytes(frames[0]))
            field = draw(st.sampled_from(["version", "kind", "flags", "ids"]))
            if field == "version":
                version = draw(st.sampled_from([0, PROTOCOL_VERSION + 1, 65535]))
            elif field == "kind":
                kind = draw(st.integers(0, 255))
            elif field == "flags":
                flags = draw(st.integers(0, 255))
            else:
                session, request = draw(_sessions), draw(st.integers(0, MAX_ID))
            frames[0] = bytearray(HEADER.pack(magic, version, kind, flags, session, request))
        elif operation == "body" and len(frames) > 1:
            frames[1] = bytearray(msgpack.packb(draw(_junk), use_bin_type=True))
    return [bytes(f) for f in frames]


def storm_messages() -> st.SearchStrategy[tuple[str, list[bytes]]]:
    """(peer, frames): what each peer sends, valid or mutated, plus the protocol tests'
    plausible and mutated messages and plain garbage."""
    frontend = valid_messages(CLIENT_KINDS)
    worker = valid_messages(WORKER_KINDS)
    anything = (plausible_messages() | mutated_messages()
                | st.lists(st.binary(max_size=30), max_size=4))
    return st.one_of(
        st.tuples(st.just("frontend"), frontend | mutated(frontend) | anything),
        st.tuples(st.just("stranger"), worker | mutated(worker) | anything),
        st.tuples(st.just("worker"), worker | mutated(worker) | anything),
    )


# -- keeping the storm off what it must not change -----------------------------------------


def defang(peer: str, frames: list[bytes]) -> list[bytes]:
    """The message, unless valid credentials would make it change the cluster for real:
    then the same message with a wrong token, or aimed at a session no one has."""
    try:
        header = protocol.decode_header(frames[0]) if frames else None
    except ProtocolError:
        return frames
    if header is None or header.version != PROTOCOL_VERSION:
        return frames
    if header.kind in (Kind.SUBMIT, Kind.REQUEST) and header.session in HELLO_SESSIONS:
        return [Header(header.kind, 0xBAD, header.request, header.version,
                       header.flags).pack(), *frames[1:]]  # not into a session it opened
    if header.kind not in (Kind.ADMIN, Kind.REGISTER):
        return frames
    try:
        body = protocol.decode(frames).body
    except ProtocolError:
        return frames
    if header.kind == Kind.ADMIN and body.get("command") in READ_ONLY_ADMIN:
        return frames
    if header.kind == Kind.REGISTER and str(body.get("name")).startswith("zz-fuzz"):
        return frames
    return [frames[0], protocol.pack_body({**body, "token": "wrong"}), *frames[2:]]


# -- the corpus --------------------------------------------------------------------------------


def seeds() -> list[tuple[str, list[bytes]]]:
    """Hand-made garbage from the bad-input tests, and one valid message of each kind."""
    found = [("frontend", frames) for _, frames in FRONTEND_GARBAGE]
    found += [("stranger", frames) for _, frames in WORKERS_GARBAGE]
    found += [("frontend", frames_of(Kind.HELLO, {"token": CLIENT_TOKEN, "device": d},
                                     session=HELLO_SESSIONS[d], request=d + 1))
              for d in range(3)]
    found += [("frontend", frames_of(Kind.CLOSE, session=HELLO_SESSIONS[0], request=7)),
              ("worker", frames_of(Kind.OPENED, session=HELLO_SESSIONS[2], request=3)),
              ("frontend", frames_of(Kind.ADMIN, {"token": ADMIN_TOKEN, "command": "status",
                                                  "args": {}}, request=8))]
    return found


def load_corpus(path: Path = CORPUS) -> list[tuple[str, list[bytes]]]:
    """The stored storm, in order."""
    messages = []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "peer" in entry:
            messages.append((entry["peer"], [bytes.fromhex(f) for f in entry["frames"]]))
    return messages


def write_corpus(path: Path = CORPUS, batches: int = 150) -> int:
    """Write the seeds and ``batches`` derandomized hypothesis batches; how many messages."""
    drawn: list[tuple[str, list[bytes]]] = []

    @settings(max_examples=batches, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(storm_messages(), min_size=5, max_size=30))
    def collect(batch: list[tuple[str, list[bytes]]]) -> None:
        drawn.extend(batch)

    collect()
    messages = seeds() + drawn
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(json.dumps({"about": "fabric broker protocol storm corpus; regenerate with "
                                     ".venv/bin/python tests/fuzzstorm.py --write"}) + "\n")
        for peer, frames in messages:
            f.write(json.dumps({"peer": peer, "frames": [bytes(x).hex() for x in frames]})
                    + "\n")
    return len(messages)


# -- the peers -----------------------------------------------------------------------------------


class StormPeers:
    """The three raw peers, used by one thread; ``send`` defangs and sends, ``drain`` reads
    every answer that has come (checking it decodes), ``settle`` drains until quiet."""

    def __init__(self, frontend: str, worker_address: str) -> None:
        # (a client token on the workers' socket passes the handshake: only REGISTER with
        # the worker token makes a worker)
        self.peers = {"frontend": RawDealer(frontend, CLIENT_TOKEN),
                      "stranger": RawDealer(worker_address, CLIENT_TOKEN),
                      "worker": RawDealer(worker_address, WORKER_TOKEN)}
        self.sent: dict[str, int] = dict.fromkeys(PEERS, 0)
        self.malformed: dict[str, int] = dict.fromkeys(PEERS, 0)  # no readable header
        self.answers: dict[str, int] = dict.fromkeys(PEERS, 0)
        self.protocol_errors: dict[str, int] = dict.fromkeys(PEERS, 0)  # answers saying so
        self.peers["worker"].send(frames_of(Kind.REGISTER, {
            "token": WORKER_TOKEN, "name": FUZZ_WORKER, "backend": "numpy", "devices": [{}]}))

    def close(self) -> None:
        for peer in self.peers.values():
            peer.close()

    def __enter__(self) -> "StormPeers":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def send(self, messages: Iterable[tuple[str, list[bytes]]]) -> None:
        for peer, frames in messages:
            frames = defang(peer, frames)
            if not frames:
                frames = [b""]  # ZeroMQ sends no empty message: an empty frame instead
            try:
                protocol.decode_header(frames[0])
                readable = len(frames) >= 2
            except ProtocolError:
                readable = False
            self.malformed[peer] += not readable
            self.sent[peer] += 1
            self.peers[peer].send(frames)
            self.drain()

    def drain(self) -> None:
        for name, peer in self.peers.items():
            while peer.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                frames = peer.socket.recv_multipart()
                self.answers[name] += 1
                header = protocol.decode_header(frames[0])  # whatever comes has a header
                if header.kind in DATA_KINDS:
                    continue  # forwarded from the storm's own worker as it sent it
                answer = protocol.decode(frames)  # the broker's own: valid
                # (a worker's kind on the clients' port is a protocol error answered as
                # WrongPort, which names the right port)
                if answer.kind in (Kind.ERROR, Kind.REJECT) \
                        and answer.body["code"] in (ProtocolError.code, WrongPort.code):
                    self.protocol_errors[name] += 1

    def settle(self, quiet: float = 0.5, limit: float = 10.0) -> None:
        """Drain until nothing has come for ``quiet`` seconds (at most ``limit``)."""
        deadline = time.monotonic() + limit
        last = time.monotonic()
        seen = sum(self.answers.values())
        while time.monotonic() - last < quiet and time.monotonic() < deadline:
            time.sleep(0.02)
            self.drain()
            if sum(self.answers.values()) != seen:
                seen, last = sum(self.answers.values()), time.monotonic()


def batches(messages: list[tuple[str, list[bytes]]], size: int = 50,
            ) -> Iterator[list[tuple[str, list[bytes]]]]:
    """The messages in slices of ``size``."""
    for start in range(0, len(messages), size):
        yield messages[start:start + size]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {sys.argv[0]} --write   (rewrites {CORPUS})")
    print(f"wrote {write_corpus()} messages to {CORPUS}")
