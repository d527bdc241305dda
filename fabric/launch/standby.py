"""The broker pair a launcher runs on one host (``fabric cluster up --standby``).

Rule: both brokers' state addresses are chosen before either starts (each names the other's
as its ``--peer``), on loopback ports free at that moment and below the kernel's ephemeral
range; the primary gets ``--primary`` and the backup ``--backup`` (``fabric.broker.pair``).
Everything else about the two processes is the launcher's.
"""

from __future__ import annotations

import random
import socket

# Where the kernel's ephemeral ports start when /proc does not say (Linux's default)
EPHEMERAL_START = 32768


def free_loopback(taken: str = "") -> str:
    """A loopback address on a port free now (and not the address ``taken``), below the
    ephemeral range: a port chosen there stays free until its broker binds it, where one of
    the range (a probe's bind to port 0) could meanwhile become another socket's, bound to
    ``*`` or connecting out."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            start = int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        start = EPHEMERAL_START
    for port in random.sample(range(10_000, start), min(64, max(start - 10_000, 0))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # (another's: try another)
            if f"tcp://127.0.0.1:{port}" != taken:
                return f"tcp://127.0.0.1:{port}"
    with socket.socket() as probe:  # (a range that leaves none below it)
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def pair_addresses() -> tuple[str, str]:
    """The primary's and the backup's state addresses."""
    primary = free_loopback()
    return primary, free_loopback(taken=primary)


def pair_args(addresses: tuple[str, str], primary: bool) -> list[str]:
    """``fabric broker``'s options for the primary (or the backup) of the pair whose state
    addresses are ``addresses`` (the primary's, the backup's)."""
    own, peer = addresses if primary else addresses[::-1]
    return ["--pair-address", own, "--peer", peer, "--primary" if primary else "--backup"]


def joined(*addresses: str) -> str:
    """The addresses given (the empty ones left out) as one list: "A,B"."""
    return ",".join(address for address in addresses if address)
