"""Addresses as users give them (sans I/O): what --advertise and a worker's --broker take."""

from __future__ import annotations

import pytest

from fabric.core.addresses import advertise_host, check_endpoint
from fabric.core.errors import ConfigError


@pytest.mark.parametrize("given, taken", [
    ("node1.example.org", "node1.example.org"), ("10.0.0.1", "10.0.0.1"),
    ("fe80::1", "[fe80::1]"), ("[fe80::1]", "[fe80::1]"), ("localhost", "localhost")])
def test_advertise_takes_a_host(given, taken):
    assert advertise_host(given) == taken


@pytest.mark.parametrize("given, why", [
    ("tcp://10.0.0.1:5555", "is a URL"), ("10.0.0.1:5555", "has a port"),
    ("node1:5555", "has a port"), ("0.0.0.0", "binds every interface"),
    ("::", "binds every interface"), ("*", "binds every interface"), ("", "binds every")])
def test_advertise_refuses_what_is_no_host_with_a_sentence(given, why):
    with pytest.raises(ConfigError, match=why) as refused:
        advertise_host(given)
    assert "give a host name or address" in refused.value.message


@pytest.mark.parametrize("address", [
    "tcp://127.0.0.1:5556", "tcp://node1:1", "tcp://[::1]:5556", "ipc:///tmp/fabric.sock",
    "inproc://x"])
def test_a_worker_connects_to_an_endpoint(address):
    assert check_endpoint(address) == address


@pytest.mark.parametrize("address", [
    "tcp://tcp://10.0.0.1:5555:5556", "10.0.0.1:5556", "tcp://10.0.0.1", "tcp://:5556",
    "tcp://10.0.0.1:0", "tcp://10.0.0.1:99999", "tcp://h:port", "ipc://", "udp://h:1"])
def test_a_worker_refuses_what_is_no_endpoint(address):
    with pytest.raises(ConfigError, match="give tcp://HOST:PORT"):
        check_endpoint(address)
