"""End-to-end: sessions open and close against real broker and worker processes."""

from __future__ import annotations

import pytest

import fabric


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
