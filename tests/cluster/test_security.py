"""Security: refused tokens answered late and counted, CURVE encryption, keys kept private.

End to end against real broker and worker processes: a CURVE cluster (keys from
``generate_keys``, allow-lists on) and a plain one with a longer ``--auth-delay``. A client with
the wrong key, or none, gets ``EncryptionError`` within its timeout while a good session goes
on; a worker with an unknown key never registers; a TCP relay in this process records the
bytes a client, an admin and a worker exchange with the broker, and the tokens (and an
array's bytes) are in that capture without CURVE and absent with it. Sans-I/O tests check
the registry's not-before times and the broker's timer queue.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HEARTBEAT
from polling import wait_for
from rawpeers import RawDealer, frames_of
from tcprelay import TcpRelay

import fabric
from fabric import Admin, CurveClient, CurveServer, EncryptionError, LocalCluster, generate_keys
from fabric.broker.held import HeldSends
from fabric.broker.model import Limits, Send, Side
from fabric.broker.registry import Registry
from fabric.core import protocol
from fabric.core.errors import AuthenticationError, ConfigError, error_from_wire
from fabric.core.protocol import Kind

REPO = Path(__file__).resolve().parents[2]
AUTH_DELAY = 0.5  # the plain cluster's --auth-delay: long enough to tell from a prompt answer
WRONG_TOKEN = "not-a-token-of-this-cluster-5e1d"


def run_cli(*args: str, env: dict[str, str] | None = None,
            timeout: float = 20.0) -> subprocess.CompletedProcess:
    """Run ``python -m fabric ARGS`` to completion (killed and reaped at ``timeout``)."""
    return subprocess.run([sys.executable, "-m", "fabric", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    """A ``fabric keys generate`` directory for the CURVE cluster."""
    directory = tmp_path_factory.mktemp("security") / "keys"
    generate_keys(directory)
    return directory


@pytest.fixture(scope="module")
def stranger(tmp_path_factory) -> Path:
    """Key pairs (and a broker key) that the CURVE cluster has never seen."""
    directory = tmp_path_factory.mktemp("security") / "stranger"
    generate_keys(directory)
    return directory


@pytest.fixture(scope="module")
def curve_cluster(keys):
    """A broker and one worker, every link CURVE-encrypted, logging at debug level."""
    with LocalCluster(workers=1, heartbeat=HEARTBEAT, curve=keys,
                      broker_args=("--log-level", "debug"),
                      worker_args=("--log-level", "debug")) as running:
        yield running


@pytest.fixture(scope="module")
def plain_cluster():
    """A broker and one worker without CURVE, answering refused tokens after AUTH_DELAY."""
    with LocalCluster(workers=1, heartbeat=HEARTBEAT,
                      broker_args=("--log-level", "debug", "--auth-delay", str(AUTH_DELAY)),
                      worker_args=("--log-level", "debug")) as running:
        yield running


def _secrets(cluster: LocalCluster) -> list[str]:
    return [cluster.token, cluster.worker_token, cluster.admin_token, WRONG_TOKEN]


# -- CURVE end to end -----------------------------------------------------------------------


def test_curve_cluster_computes_end_to_end(curve_cluster, keys, tmp_path):
    with curve_cluster.connect(device=0, timeout=5) as session:
        x = session.asarray(np.arange(6.0))
        assert ((x * 2 + 1).sum()).numpy() == 36.0
    # The same keys, named the other ways the API takes them.
    with fabric.connect(curve_cluster.address, token=curve_cluster.token, timeout=5,
                        curve=str(keys)) as session:
        assert session.asarray(np.ones(3)).sum().numpy() == 3.0
    named = {"secret_key_file": str(keys / "client.key_secret"),
             "server_public_key_file": str(keys / "broker.key")}
    assert "worker-0" in [d.worker for d in fabric.devices(
        curve_cluster.address, token=curve_cluster.token, curve=named, timeout=5)]
    path = curve_cluster.write_connection_file(tmp_path / "cluster.json")
    assert json.loads(Path(path).read_text())["curve"] == named
    with fabric.connect(connection_file=path, timeout=5) as session:
        assert session.device.worker == "worker-0"


@pytest.mark.parametrize("case", ["no-curve", "unknown-key", "wrong-broker-key"])
def test_a_client_with_the_wrong_keys_gets_a_clear_error_and_the_good_one_goes_on(
        curve_cluster, keys, stranger, case):
    curve: Any = {
        "no-curve": None,
        "unknown-key": CurveClient.from_files(stranger / "client.key_secret", keys / "broker.key"),
        "wrong-broker-key": CurveClient.from_files(keys / "client.key_secret",
                                                   stranger / "broker.key"),
    }[case]
    timeout = 5.0
    with curve_cluster.connect(device=0, timeout=5) as good:
        x = good.asarray(np.arange(4.0))
        started = time.monotonic()
        with pytest.raises(EncryptionError) as info:
            fabric.connect(curve_cluster.address, token=curve_cluster.token, timeout=timeout,
                           curve=curve)
        took = time.monotonic() - started
        assert took < timeout  # the typed error, not the handshake timeout
        assert isinstance(info.value, fabric.ConnectError)
        message = info.value.message
        assert "CURVE" in message
        assert {"no-curve": "requires CURVE encryption",
                "unknown-key": "refused this connection's CURVE key",
                "wrong-broker-key": "broker public key you gave is likely not its key",
                }[case] in message
        assert curve_cluster.token not in message
        assert ((x + 1).sum()).numpy() == 10.0  # the good session never noticed
    with Admin(curve_cluster.address, token=curve_cluster.admin_token,
               curve=curve_cluster.curve) as admin:
        rejects = admin.status()["rejects"]
    if case == "unknown-key":
        assert rejects["client_key_refused"] >= 1


@pytest.mark.parametrize("case", ["unknown-key", "no-curve"])
def test_a_worker_with_an_unknown_key_cannot_register(curve_cluster, keys, stranger, case):
    curve_args = {"unknown-key": ("--curve-secret-key", str(stranger / "worker.key_secret"),
                                  "--broker-public-key", str(keys / "broker.key")),
                  "no-curve": ()}[case]
    env = {**os.environ, "FABRIC_WORKER_TOKEN": curve_cluster.worker_token}
    done = run_cli("worker", "--broker", curve_cluster.worker_address, "--name", "stranger",
                   "--heartbeat", str(HEARTBEAT), *curve_args, env=env, timeout=15)
    assert done.returncode == 1, done.stderr
    assert {"unknown-key": "refused this connection's CURVE key",
            "no-curve": "requires CURVE encryption"}[case] in done.stderr
    assert "Traceback" not in done.stderr
    assert curve_cluster.worker_token not in done.stdout + done.stderr
    assert "stranger" not in [d.worker for d in curve_cluster.devices()]
    with Admin(curve_cluster.address, token=curve_cluster.admin_token,
               curve=curve_cluster.curve) as admin:
        assert "stranger" not in [w["name"] for w in admin.workers()]
        if case == "unknown-key":
            assert admin.status()["rejects"]["worker_key_refused"] >= 1


# -- what a captured byte stream shows ------------------------------------------------------


def _end(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("encrypted", [True, False], ids=["curve", "plain-control"])
def test_a_captured_byte_stream_holds_no_plaintext_token(curve_cluster, plain_cluster,
                                                         encrypted):
    cluster = curve_cluster if encrypted else plain_cluster
    marker = b"an-array-anyone-on-the-wire-could-read-" * 4
    with TcpRelay(cluster.address) as frontend, TcpRelay(cluster.worker_address) as workers:
        with fabric.connect(frontend.address, token=cluster.token, timeout=5,
                            curve=cluster.curve) as session:
            x = session.asarray(np.frombuffer(marker, dtype=np.uint8))
            assert x.numpy().tobytes() == marker
        with Admin(frontend.address, token=cluster.admin_token, curve=cluster.curve) as admin:
            assert admin.status()["workers"] >= 1
        # A worker registers through the workers' relay, carrying the worker token.
        env = {**os.environ, "FABRIC_WORKER_TOKEN": cluster.worker_token}
        worker = subprocess.Popen(
            [sys.executable, "-m", "fabric", "worker", "--broker", workers.address,
             "--name", "zz-relayed", "--heartbeat", str(HEARTBEAT),  # sorts after worker-0
             *(("--curve", str(cluster.curve_dir)) if encrypted else ())],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def registered() -> bool:
            if "zz-relayed" in [d.worker for d in cluster.devices()]:
                return True
            assert worker.poll() is None, "the relayed worker exited"
            return False
        try:
            wait_for(registered, 15, "the relayed worker to register")
        finally:
            _end(worker)
        client_side, worker_side = frontend.captured(), workers.captured()
    assert len(client_side) > len(marker) and len(worker_side) > 100  # traffic was relayed
    for secret, stream in [(cluster.token.encode(), client_side),
                           (cluster.admin_token.encode(), client_side),
                           (marker, client_side),
                           (cluster.worker_token.encode(), worker_side)]:
        assert (secret in stream) is not encrypted


# -- refused tokens: answered after the delay, counted, never logged ----------------------------


def _timed(dealer: RawDealer, frames: list[bytes]) -> tuple[Any, float, float]:
    """Send ``frames``; the decoded answer, when it came, and how long it took."""
    started = time.monotonic()
    dealer.send(frames)
    reply = dealer.recv_message(timeout=5)
    answered = time.monotonic()
    return reply, answered, answered - started


def test_refused_tokens_are_answered_after_the_delay_and_counted(plain_cluster):
    cluster = plain_cluster
    with Admin(cluster.address, token=cluster.admin_token) as admin:
        before = admin.status()
    with RawDealer(cluster.address, cluster.token) as client, \
            RawDealer(cluster.address, cluster.token) as other, \
            RawDealer(cluster.worker_address, cluster.worker_token) as worker:
        # Connected and greeted first, so that only the broker's answer is timed.
        for dealer in (client, other):
            assert _timed(dealer, frames_of(Kind.PING, request=1))[0].kind == Kind.PONG
        assert _timed(worker, frames_of(Kind.HEARTBEAT))[0].kind == Kind.ERROR  # unregistered
        refused = {
            "hello": (client, frames_of(Kind.HELLO, {"token": WRONG_TOKEN, "device": 0},
                                        session=7, request=2)),
            "devices": (client, frames_of(Kind.DEVICES, {"token": WRONG_TOKEN}, request=3)),
            "admin": (client, frames_of(Kind.ADMIN, {"token": cluster.token,  # not the admin's
                                                     "command": "status", "args": {}},
                                        request=4)),
            "register": (worker, frames_of(Kind.REGISTER, {
                "token": cluster.token, "name": "w", "backend": "numpy", "devices": [{}]})),
        }
        for what, (dealer, frames) in refused.items():
            reply, answered, took = _timed(dealer, frames)
            assert reply.kind == Kind.REJECT, what
            assert isinstance(error_from_wire(reply.body), AuthenticationError), what
            assert took >= AUTH_DELAY, f"{what} answered after {took:.3f} s"
        # While a refusal is held, the broker goes on answering everyone else.
        sent = time.monotonic()  # (before the send: after it, this thread may run late)
        client.send(refused["hello"][1])
        pong, pong_at, _ = _timed(other, frames_of(Kind.PING, request=5))
        reject = client.recv_message(timeout=5)
        rejected_at = time.monotonic()
        assert pong.kind == Kind.PONG and reject.kind == Kind.REJECT
        assert pong_at < sent + AUTH_DELAY <= rejected_at
    with Admin(cluster.address, token=cluster.admin_token) as admin:
        after = admin.status()
    gained = {reason: after["rejects"].get(reason, 0) - before["rejects"].get(reason, 0)
              for reason in ("unauthorized", "admin_unauthorized", "worker_unauthorized")}
    assert gained == {"unauthorized": 3, "admin_unauthorized": 1, "worker_unauthorized": 1}
    assert (after["counters"]["tokens_refused"]
            - before["counters"].get("tokens_refused", 0)) == 5


def test_a_wrong_token_over_curve_is_an_authentication_error(curve_cluster):
    started = time.monotonic()
    with pytest.raises(AuthenticationError):
        fabric.connect(curve_cluster.address, token=WRONG_TOKEN, timeout=5,
                       curve=curve_cluster.curve)
    assert time.monotonic() - started >= Limits().auth_delay  # the broker's default delay


def test_tokens_never_reach_logs_or_admin_output(curve_cluster, plain_cluster, tmp_path):
    for cluster in (curve_cluster, plain_cluster):
        for token in (WRONG_TOKEN, cluster.admin_token, cluster.worker_token):
            with pytest.raises(AuthenticationError):
                fabric.devices(cluster.address, token=token, timeout=5, curve=cluster.curve)
        with pytest.raises(AuthenticationError):
            Admin(cluster.address, token=cluster.token, curve=cluster.curve)
    path = curve_cluster.write_admin_file(tmp_path / "cluster-admin.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
    outputs = []
    for extra in ((), ("--json",)):
        done = run_cli("admin", "--admin-file", path, "status", *extra, env=env)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout + done.stderr)
    assert "unauthorized" in outputs[0]  # the refusals are shown, by reason
    assert json.loads(outputs[1])["rejects"]["admin_unauthorized"] >= 1
    for cluster in (curve_cluster, plain_cluster):
        logs = [cluster.log_tail("broker", 5000), cluster.log_tail("worker-0", 5000)]
        assert "rejected handshake" in logs[0]  # the refusals were logged
        for secret in _secrets(cluster):
            assert not any(secret in text for text in logs + outputs)
    # A wrong token is refused in the ZeroMQ handshake without CURVE, logged by the peer's
    # address alone.
    assert "refused a connection to the clients' socket" in plain_cluster.log_tail("broker", 5000)


# -- session and connection ids: at DEBUG only -------------------------------------------------


@pytest.fixture(scope="module")
def info_cluster():
    """A broker and one worker at the default log level; an idle client is checked on after
    a second (``--lease``), so that one gone without a CLOSE is dropped soon."""
    with LocalCluster(workers=1, heartbeat=HEARTBEAT, broker_args=("--lease", "1")) as running:
        yield running


def _hex_runs(text: str) -> set[str]:
    """Runs of 10 or more hex digits (a libzmq routing id is 10, a session id up to 16)."""
    return set(re.findall(r"[0-9a-f]{10,}", text.replace(socket.gethostname(), "")))


def test_session_and_connection_ids_never_reach_logs_at_the_default_level(info_cluster):
    cluster = info_cluster
    seen: list[dict[str, Any]] = []  # the admin's rows: session ids and client connections
    with Admin(cluster.address, token=cluster.admin_token) as admin:
        with cluster.connect(device=0, timeout=5) as session:  # opened and closed
            assert session.asarray(np.arange(4.0)).sum().numpy() == 6.0
            seen += admin.sessions()
        # Opened, then gone without a CLOSE.
        with RawDealer(cluster.address, cluster.token) as vanishing:
            vanishing.send(frames_of(Kind.HELLO, {"token": cluster.token, "device": 0},
                                     session=0x5EC0DE1D5E55, request=1))
            assert vanishing.recv_message(timeout=5).kind == Kind.WELCOME
            seen += admin.sessions()
        wait_for(lambda: not admin.sessions(), 15, "the vanished client's session to go")
    logs = cluster.log_tail("broker", 5000) + cluster.log_tail("worker-0", 5000)
    assert len({row["id"] for row in seen}) == 2
    for row in seen:
        assert f"{int(row['id'], 16):x}" not in logs and row["client"] not in logs
    assert not _hex_runs(logs), _hex_runs(logs)  # nor the admin's connection, nor any other
    assert "1 session(s) dropped: the client disconnected" in logs  # said, without ids
    assert "admin command sessions" in logs


# -- keys on disk -----------------------------------------------------------------------------


def test_generated_key_files_are_private_and_refused_when_readable(tmp_path):
    written = generate_keys(tmp_path / "keys")
    secrets = [p for name, p in written.items() if name.endswith(".key_secret")]
    assert sorted(p.name for p in secrets) == [
        "broker.key_secret", "client.key_secret", "worker.key_secret"]
    for path in secrets:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not [name for name in os.listdir(tmp_path / "keys") if name.startswith(".")]
    client = CurveClient.from_dir(tmp_path / "keys")  # usable as written
    server = CurveServer.from_dir(tmp_path / "keys")
    assert server.clients == {client.public_key}
    assert len(server.workers) == 1 and server.workers != server.clients
    for keys in (client, server):
        assert repr(keys.secret_key) not in repr(keys) and "secret_key" not in repr(keys)
    with pytest.raises(ConfigError, match="already holds keys"):
        generate_keys(tmp_path / "keys")
    os.chmod(tmp_path / "keys" / "client.key_secret", 0o640)
    with pytest.raises(ConfigError, match="can be read by other users: run chmod 600"):
        CurveClient.from_dir(tmp_path / "keys")
    public_only = tmp_path / "public-only.key_secret"
    public_only.write_bytes((tmp_path / "keys" / "broker.key").read_bytes())
    os.chmod(public_only, 0o600)
    with pytest.raises(ConfigError, match="holds only a public key"):
        CurveClient.from_files(public_only, tmp_path / "keys" / "broker.key")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no public keys"):
        CurveServer.from_files(tmp_path / "keys" / "broker.key_secret",
                               allow_clients=tmp_path / "empty",
                               allow_workers=tmp_path / "keys" / "workers")


def test_the_cli_generates_keys_and_refuses_readable_ones(tmp_path):
    done = run_cli("keys", "generate", str(tmp_path / "keys"))
    assert done.returncode == 0, done.stderr
    assert "broker.key_secret" in done.stdout and "fabric broker --curve" in done.stdout
    again = run_cli("keys", "generate", str(tmp_path / "keys"))
    assert again.returncode == 1 and "already holds keys" in again.stderr
    os.chmod(tmp_path / "keys" / "broker.key_secret", 0o644)
    env = {**os.environ, "FABRIC_TOKEN": "t", "FABRIC_WORKER_TOKEN": "w"}
    broker = run_cli("broker", "--frontend", "tcp://127.0.0.1:*", "--worker-address",
                     "tcp://127.0.0.1:*", "--curve", str(tmp_path / "keys"), env=env)
    assert broker.returncode == 2  # a usage error, before anything is bound
    assert "can be read by other users: run chmod 600" in broker.stderr


# -- sans I/O: the registry's not-before times and the broker's timer queue --------------------


def test_the_registry_delays_every_refused_token_and_nothing_else():
    registry = Registry(client_token="c", worker_token="w", admin_token="a",
                        limits=Limits(auth_delay=0.7), now=0.0)
    bad = {
        "hello": (registry.from_client, frames_of(Kind.HELLO, {"token": "x", "device": 0},
                                                  session=7, request=1)),
        "devices": (registry.from_client, frames_of(Kind.DEVICES, {"token": "x"})),
        "admin": (registry.from_client, frames_of(Kind.ADMIN, {"token": "c", "command": "status",
                                                               "args": {}})),
        "register": (registry.from_worker, frames_of(Kind.REGISTER, {
            "token": "c", "name": "n", "backend": "numpy", "devices": [{}]})),
    }
    for what, (handle, frames) in bad.items():
        sends = handle(b"peer", frames, 10.0)
        assert len(sends) == 1 and sends[0].not_before == pytest.approx(10.7), what
        assert protocol.decode(sends[0].frames).kind == Kind.REJECT
    assert registry.counters["tokens_refused"] == 4
    # Good tokens, and refusals that are not about a token, are answered at once.
    prompt = [
        registry.from_client(b"peer", frames_of(Kind.DEVICES, {"token": "c"}), 11.0),
        registry.from_client(b"peer", frames_of(Kind.HELLO, {"token": "c", "device": 5},
                                                session=8), 11.0),  # no such device
        registry.from_client(b"peer", frames_of(Kind.HELLO, {"token": "x", "device": 0},
                                                version=99), 11.0),  # another version
    ]
    assert all(send.not_before == 0.0 for sends in prompt for send in sends)
    assert registry.counters["tokens_refused"] == 4


def test_held_sends_are_released_in_time_order_and_bounded():
    held = HeldSends(limit=3)
    assert held.next_deadline() == float("inf") and held.due(1e9) == []
    for when, peer in [(2.0, b"b"), (1.0, b"a"), (2.0, b"c")]:
        assert held.hold(Send(Side.FRONTEND, peer, [b"x"], when))
    assert not held.hold(Send(Side.FRONTEND, b"d", [b"x"], 0.5)) and held.dropped == 1
    assert held.next_deadline() == 1.0
    assert held.due(0.9) == []
    assert [s.identity for s in held.due(1.0)] == [b"a"]
    released = held.due(5.0)
    assert [s.identity for s in released] == [b"b", b"c"]  # ties keep their order
    assert all(s.not_before == 0.0 for s in released) and len(held) == 0
