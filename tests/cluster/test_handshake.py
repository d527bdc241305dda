"""End-to-end: sessions open and close against real broker and worker processes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from conftest import HEARTBEAT

import fabric
from fabric import Admin, LocalCluster
from fabric.cli.main import main
from fabric.core.config import resolve_secret


def test_devices_lists_every_device_of_every_worker(cluster):
    devices = fabric.devices(cluster.address, token=cluster.token)
    assert [d.index for d in devices] == [0, 1]
    assert [d.worker for d in devices] == ["worker-0", "worker-1"]
    assert all(d.backend == "numpy" and "version" in d.settings for d in devices)


@pytest.mark.parametrize("device", [0, 1])
def test_connect_opens_a_session_on_the_device(cluster, device):
    with fabric.connect(cluster.address, token=cluster.token, device=device,
                        timeout=5.0) as session:
        assert session.device.index == device
        assert session.device.worker == f"worker-{device}"
        assert session.device_count == 2
        session.sync()
    assert session.closed


def test_token_from_environment(cluster, monkeypatch):
    monkeypatch.setenv("FABRIC_TOKEN", cluster.token)
    with fabric.connect(cluster.address, device=0) as session:
        assert session.device.index == 0


class PaddedTokens(LocalCluster):
    """A cluster whose broker reads its tokens with a trailing newline and whose workers read
    them with spaces around, as an `echo` or a pasted line leaves them."""
    padding = "{}\n"

    def _env(self) -> dict[str, str]:
        env = super()._env()
        return {**env, **{name: self.padding.format(env[name]) for name in
                          ("FABRIC_TOKEN", "FABRIC_WORKER_TOKEN", "FABRIC_ADMIN_TOKEN")}}

    def start_worker(self, index: int):
        self.padding = " {} "
        return super().start_worker(index)


def test_tokens_with_surrounding_whitespace_serve_on_every_path(monkeypatch):
    with PaddedTokens(workers=1, heartbeat=HEARTBEAT) as padded:  # the worker registers
        with fabric.connect(padded.address, token=f" {padded.token}\n", timeout=5) as session:
            session.sync()
        monkeypatch.setenv("FABRIC_TOKEN", f"{padded.token}\n")
        assert [d.worker for d in fabric.devices(padded.address, timeout=5)] == ["worker-0"]
        monkeypatch.setenv("FABRIC_ADMIN_TOKEN", f"{padded.admin_token}\n")
        with Admin(padded.address, timeout=5) as admin:
            assert [row["name"] for row in admin.workers()] == ["worker-0"]


def test_secrets_from_the_environment_or_an_option_lose_their_surrounding_whitespace(
        monkeypatch):
    monkeypatch.setenv("FABRIC_WORKER_TOKEN", " w-token\n")
    assert resolve_secret(None, None, "FABRIC_WORKER_TOKEN") == "w-token"
    monkeypatch.setenv("FABRIC_WORKER_TOKEN", " \n")  # only whitespace: as if unset
    assert resolve_secret("a-token\n", None, "FABRIC_WORKER_TOKEN") == "a-token"
    assert resolve_secret(None, None, "FABRIC_WORKER_TOKEN") is None


@pytest.mark.parametrize("command", [["broker"], ["worker"], ["admin"]])
def test_token_help_says_surrounding_whitespace_is_ignored(command):
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "Whitespace around a token (a trailing newline or space) is ignored" in " ".join(
        result.output.split())
