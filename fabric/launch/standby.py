"""The broker pair a launcher runs on one host (``fabric cluster up --standby``).

Rule: both brokers' state addresses are chosen before either starts (each names the other's
as its ``--peer``), on loopback ports free at that moment; the primary gets ``--primary`` and
the backup ``--backup`` (``fabric.broker.pair``). Everything else about the two processes is
the launcher's.
"""

from __future__ import annotations

import socket


def free_loopback() -> str:
    """A loopback address on a port free now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def pair_addresses() -> tuple[str, str]:
    """The primary's and the backup's state addresses."""
    return free_loopback(), free_loopback()


def pair_args(addresses: tuple[str, str], primary: bool) -> list[str]:
    """``fabric broker``'s options for the primary (or the backup) of the pair whose state
    addresses are ``addresses`` (the primary's, the backup's)."""
    own, peer = addresses if primary else addresses[::-1]
    return ["--pair-address", own, "--peer", peer, "--primary" if primary else "--backup"]


def joined(*addresses: str) -> str:
    """The addresses given (the empty ones left out) as one list: "A,B"."""
    return ",".join(address for address in addresses if address)
