"""Prometheus metrics: a real broker with --metrics, scraped over HTTP and read with
prometheus_client's own parser; the figures and families also sans I/O."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fabric import LocalCluster
from fabric.broker.metrics import families, figures, parse_address
from fabric.core import protocol
from fabric.core.errors import AuthenticationError
from fabric.core.protocol import Kind, Message
from conftest import HEARTBEAT
from rawpeers import RawDealer, frames_of
from test_admin_commands import busy_registry

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    """Every sample at ``url``, by name and labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


class Fenced:
    """Scrapes that show everything the broker did before them: each ends with an admin
    command and waits for the snapshot that counts it (the loop handles messages in order,
    so a snapshot taken after that command includes what came before it)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.commands = 0  # admin commands sent so far (opening an Admin sends a ping)

    def __call__(self) -> Samples:
        with self.cluster.admin():
            self.commands += 1
        while True:  # bounded by the test's timeout
            samples = scrape(self.cluster.metrics_url)
            if value(samples, "fabric_broker_events_total", event="admin_commands") == \
                    self.commands:
                return samples
            time.sleep(0.05)


@pytest.fixture(scope="module")
def metered():
    with LocalCluster(workers=1, heartbeat=HEARTBEAT,
                      broker_args=("--metrics", "127.0.0.1:0")) as running:
        yield running


def test_counters_move_by_exactly_the_workload(metered):
    fenced = Fenced(metered)
    device = {"device": "0", "worker": "worker-0"}
    before = fenced()
    with RawDealer(metered.address, "not-the-token") as stranger:  # refused in the handshake
        stranger.send(frames_of(Kind.DEVICES, {"token": "not-the-token"}))
        while value(scrape(metered.metrics_url), "fabric_tokens_refused_total") == \
                value(before, "fabric_tokens_refused_total"):
            time.sleep(0.05)
    sent = received = 0
    syncs, submits = 4, 3
    with RawDealer(metered.address, metered.token) as client:
        client.send_message(Message(Kind.HELLO, session=77, request=1,
                                    body={"token": metered.token, "device": 0}))
        assert client.recv_message(5).kind is Kind.WELCOME
        during = fenced()
        assert value(during, "fabric_sessions", state="open") == \
            value(before, "fabric_sessions", state="open") + 1
        assert value(during, "fabric_device_sessions", **device) == \
            value(before, "fabric_device_sessions", **device) + 1
        for request in range(2, 2 + submits):
            message = protocol.encode(Message(Kind.SUBMIT, 77, request, {"ops": []}))
            client.send(message)
            sent += sum(map(len, message))
        for request in range(10, 10 + syncs):
            message = protocol.encode(Message(Kind.REQUEST, 77, request, {"op": "sync"}))
            client.send(message)
            sent += sum(map(len, message))
            reply = client.recv(5)
            assert protocol.decode(reply).kind is Kind.REPLY
            received += sum(map(len, reply))
        client.send_message(Message(Kind.CLOSE, 77, 99))
        assert client.recv_message(5).kind is Kind.CLOSED
    after = fenced()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("fabric_sessions_opened_total") == 1
    assert moved("fabric_sessions_ended_total") == 1
    assert moved("fabric_routed_messages_total", **device, direction="to_device") == \
        submits + syncs
    assert moved("fabric_routed_bytes_total", **device, direction="to_device") == sent
    assert moved("fabric_routed_messages_total", **device, direction="to_client") == syncs
    assert moved("fabric_routed_bytes_total", **device, direction="to_client") == received
    assert moved("fabric_device_submits_total", **device) == submits
    assert moved("fabric_tokens_refused_total") == 1
    assert moved("fabric_refusals_total", reason=AuthenticationError.code) == 1
    assert value(after, "fabric_sessions", state="open") == \
        value(before, "fabric_sessions", state="open")
    assert value(after, "fabric_workers", state="ready") == 1
    assert value(after, "fabric_devices", state="online") == 1


def http_error_code(answer: bytes) -> int:
    """The status an HTTP server answered with: from its status line, or, where it answered
    a request without a version as HTTP/0.9 (no status line), from its error page."""
    if answer.startswith(b"HTTP/1."):
        return int(answer.split()[1])
    return int(re.search(rb"Error code: (\d+)", answer).group(1))


def test_bad_http_requests_get_http_errors_and_the_broker_keeps_serving(metered):
    host, port = urlsplit(metered.metrics_url).hostname, urlsplit(metered.metrics_url).port
    for garbage in (b"GARBAGE\r\n\r\n", b"GET /metrics HTTP/9.9\r\n\r\n",
                    b"NOT A REQUEST AT ALL\r\n\r\n", b"GET /" + b"x" * 70000 + b" HTTP/1.1\r\n",
                    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" * 8 + b"\r\n\r\n"):
        with socket.create_connection((host, port), timeout=5) as raw:
            raw.sendall(garbage)
            answer = b"".join(iter(lambda: raw.recv(65536), b""))  # until it closes
        assert 400 <= http_error_code(answer) < 600, answer[:200]
    with socket.create_connection((host, port), timeout=5):
        pass  # connected and gone without a word
    assert metered.broker.poll() is None, metered.log_tail("broker", 20)
    with metered.connect() as session:
        assert session.asarray([1.0, 2.0]).sum().numpy() == 3.0
    assert value(scrape(metered.metrics_url), "fabric_workers", state="ready") == 1


def test_the_endpoint_binds_only_where_told(metered):
    port = urlsplit(metered.metrics_url).port
    assert urlsplit(metered.metrics_url).hostname == "127.0.0.1"
    with pytest.raises(ConnectionRefusedError):  # another loopback address of this host
        socket.create_connection(("127.0.0.2", port), timeout=5).close()


def test_without_the_option_nothing_is_served():
    with LocalCluster(workers=1, heartbeat=HEARTBEAT) as running:
        assert running.metrics_url is None
        assert "metrics" not in running.log_tail("broker", 50).lower()


@pytest.mark.parametrize("address", ["nowhere", "127.0.0.1:99999", "::1:9464", "host:port"])
def test_a_bad_metrics_address_is_a_usage_error(address):
    done = subprocess.run([sys.executable, "-m", "fabric", "broker", "--metrics", address,
                           "--token", "t", "--worker-token", "w",
                           "--frontend", "tcp://127.0.0.1:*", "--worker-address",
                           "tcp://127.0.0.1:*"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "HOST:PORT" in done.stderr


def test_addresses_parse_to_host_and_port():
    assert parse_address("9464") == ("127.0.0.1", 9464)
    assert parse_address("0.0.0.0:9464") == ("0.0.0.0", 9464)
    assert parse_address("[::1]:0") == ("::1", 0)
    assert parse_address("localhost:80") == ("localhost", 80)


def test_families_show_devices_and_states_and_never_a_session_id():
    registry = busy_registry()  # sessions 7 and 8, with traffic
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in families(figures(registry, 3.0, held=2)) for s in family.samples}
    labels = {key for (_, labelled) in samples for key, _ in labelled}
    assert labels <= {"device", "worker", "direction", "state", "reason", "event"}
    assert not {value for (_, labelled) in samples for key, value in labelled
                if key != "device"} & {"7", "8", f"{7:#018x}", f"{8:#018x}"}
    assert samples["fabric_held_answers", frozenset()] == 2
    assert samples["fabric_uptime_seconds", frozenset()] == 3.0 - registry.started
    assert sum(v for (name, _), v in samples.items() if name == "fabric_sessions") == \
        len(registry.sessions)
    submits = sum(v for (name, _), v in samples.items()
                  if name == "fabric_device_submits_total")
    assert submits == sum(s.submits for s in registry.sessions.values())
