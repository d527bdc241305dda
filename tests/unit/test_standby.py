"""The addresses a launcher gives a broker pair on one host (``fabric.launch.standby``)."""

from __future__ import annotations

import socket

from fabric.launch.standby import pair_addresses, pair_args


def port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_the_pair_gets_two_free_ports_below_the_ephemeral_range():
    start = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    for _ in range(20):
        primary, backup = pair_addresses()
        assert primary != backup
        for address in (primary, backup):
            assert address.startswith("tcp://127.0.0.1:") and port(address) < start
            with socket.socket() as bound:  # (free: it binds)
                bound.bind(("127.0.0.1", port(address)))


def test_each_broker_names_its_own_address_and_its_peers():
    assert pair_args(("tcp://a:1", "tcp://b:2"), primary=True) == [
        "--pair-address", "tcp://a:1", "--peer", "tcp://b:2", "--primary"]
    assert pair_args(("tcp://a:1", "tcp://b:2"), primary=False) == [
        "--pair-address", "tcp://b:2", "--peer", "tcp://a:1", "--backup"]
