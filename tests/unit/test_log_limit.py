"""What peers can make the broker log: one line per kind per interval, ids only at DEBUG.

Sans I/O on a fake clock: ``RateLimitedLog`` fed occurrences and ``now``, then the registry
fed refused tokens, bad messages and messages from unregistered workers, its log read with
``caplog``. The same attack against real processes is in ``test_floods.py``.
"""

from __future__ import annotations

import logging

import pytest
from rawpeers import frames_of
from test_registry import A, C1, C2, frames, make_registry, open_session, two_workers

from fabric.broker.model import Side
from fabric.core.log_limit import (
    ADDRESS_CHARS,
    DETAIL_CHARS,
    INTERVAL,
    SAMPLE_PEERS,
    LogLine,
    RateLimitedLog,
    peer_label,
    peer_text,
)
from fabric.core.protocol import Kind

WARN = logging.WARNING


def test_the_first_of_a_kind_is_logged_at_once_in_full():
    limit = RateLimitedLog()
    line = limit.note(WARN, "bad message on the frontend", b"\x00\x01\x02", 5.0, "no header")
    label = peer_label(b"\x00\x01\x02")  # (the id itself is never logged)
    assert line == LogLine(WARN, f"bad message on the frontend (peer {label}): no header")
    assert limit.note(logging.INFO, "rejected handshake (unauthorized)", b"p", 5.0) == LogLine(
        logging.INFO, f"rejected handshake (unauthorized) (peer {peer_label(b'p')})")  # apart


def test_repeats_are_counted_and_summed_up_once_the_interval_ends():
    limit = RateLimitedLog()
    assert limit.note(WARN, "kind", b"a", 0.0) is not None
    for i in range(1000):
        assert limit.note(WARN, "kind", b"ab"[i % 2:i % 2 + 1], 1.0 + i / 1000) is None
    assert limit.due(INTERVAL - 0.01) == []  # not yet
    assert limit.due(INTERVAL) == [LogLine(WARN, "kind: 1000 more in the last 10 s "
                                                 f"(peers {peer_label(b'a')}, {peer_label(b'b')})")]
    assert limit.due(INTERVAL + 1) == []  # said once


def test_a_flood_of_many_peers_makes_one_bounded_line_per_interval():
    limit = RateLimitedLog()
    lines: list[LogLine] = []
    for step in range(10_000):  # 10,000 peers, one occurrence each, over 100 s
        now = step / 100
        line = limit.note(WARN, "kind", step.to_bytes(255, "little"), now)
        lines += [line] if line else []
        lines += limit.due(now)
    lines += limit.due(200.0)
    assert len(lines) == 1 + 100 / INTERVAL  # the first, then one per interval
    assert all(len(line.text) < 300 for line in lines)  # a bounded sample of bounded ids
    summary = lines[1].text
    assert summary.startswith("kind: 1000 more in the last 10 s (peers ")
    assert summary.endswith(" and others)") and summary.count(", ") == SAMPLE_PEERS - 1


def test_a_kind_quiet_for_an_interval_is_logged_at_once_again():
    limit = RateLimitedLog()
    assert limit.note(WARN, "kind", b"a", 0.0) is not None
    assert limit.note(WARN, "kind", b"a", 1.0) is None
    assert len(limit.due(INTERVAL)) == 1  # the summary of the one repeat
    assert limit.note(WARN, "kind", b"a", INTERVAL + 1) is None  # still within the next
    assert len(limit.due(2 * INTERVAL)) == 1
    assert limit.due(3 * INTERVAL) == []  # quiet for a whole interval: forgotten
    assert limit.note(WARN, "kind", b"a", 3 * INTERVAL + 1) is not None


def test_a_peers_detail_and_identity_are_bounded():
    line = RateLimitedLog().note(WARN, "kind", b"\xff" * 255, 0.0, "x" * 10_000)
    assert line is not None and line.text.count("x") == DETAIL_CHARS
    assert peer_text(b"\xff" * 255) == peer_label(b"\xff" * 255)
    assert len(peer_text(b"\xff" * 255)) == 16 and "ffff" not in peer_text(b"\xff" * 255)
    assert peer_text("127.0.0.1" + "x" * 1000) == ("127.0.0.1" + "x" * 1000)[:ADDRESS_CHARS]


# -- the registry's log ------------------------------------------------------------------------


def _broker_log(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fabric.broker"]


def test_a_refusal_flood_writes_one_line_per_kind_and_the_tick_sums_it_up(caplog):
    registry = make_registry((A, "a", 1), now=0.0)
    attacks = [
        (registry.from_client, frames_of(Kind.HELLO, {"token": "x", "device": 0}, session=7)),
        (registry.from_client, frames_of(Kind.DEVICES, {"token": "x"})),
        (registry.from_client, frames_of(Kind.ADMIN, {"token": "x", "command": "status",
                                                      "args": {}})),
        (registry.from_client, [b"not a header"]),
        (registry.from_worker, [b"not a header"]),
        (registry.from_worker, frames_of(Kind.REGISTER, {
            "token": "x", "name": "n", "backend": "numpy", "devices": [{}]})),
        (registry.from_worker, frames_of(Kind.OPENED, session=7)),  # unregistered
        (registry.from_client, frames_of(Kind.HELLO, {"token": "x"}, version=99)),
    ]
    with caplog.at_level(logging.DEBUG, "fabric.broker"):
        for round_ in range(200):
            for handle, message in attacks:
                handle(f"peer-{round_}".encode(), message, round_ / 100)
                registry.tick(round_ / 100)
        first = _broker_log(caplog)
        registry.from_worker(A, frames(Kind.HEARTBEAT), INTERVAL)  # (not lost meanwhile)
        registry.tick(INTERVAL)
    assert registry.counters["tokens_refused"] == 4 * 200
    assert sorted(line.split(" (peer ")[0] for line in first) == sorted([
        "rejected handshake (unauthorized)",  # HELLO and DEVICES: one kind
        "refused an admin command (not the admin token)",
        "bad message on the frontend socket", "bad message on the workers socket",
        "refused a worker registration (bad worker token)",
        "message from an unregistered worker", "rejected handshake (version_mismatch)"])
    summaries = _broker_log(caplog)[len(first):]
    assert len(summaries) == len(first)
    peers = ", ".join(peer_label(f"peer-{round_}".encode()) for round_ in range(3))
    assert (f"rejected handshake (unauthorized): 399 more in the last 10 s (peers {peers} "
            "and others)") in summaries


def test_a_normal_session_logs_no_session_or_connection_id_above_debug(caplog):
    registry = two_workers()
    with caplog.at_level(logging.INFO, "fabric.broker"):
        open_session(registry, C1, session=0x5E551011, now=1.0)
        registry.from_client(C1, frames(Kind.CLOSE, 0x5E551011, 2), 2.0)
        open_session(registry, C2, session=0x5E551012, now=3.0)
        registry.unroutable(Side.FRONTEND, C2, 4.0)  # gone without a CLOSE
    text = caplog.text
    assert "1 session(s) dropped: the client disconnected" in text
    for secret in ("5e551011", "5e551012", C1.hex(), C2.hex()):
        assert secret not in text
