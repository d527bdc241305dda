"""What an address that answers nothing says about itself: a host name that does not resolve.

Rule: looked up only once a connection has failed (libzmq retries an unresolvable name as
it retries a closed port, and says nothing more), so a working address never pays for it.
"""

from __future__ import annotations

import socket
from urllib.parse import urlsplit


def _host(address: str) -> str | None:
    """The host name of a ``tcp://[source;]host:port`` address, if it has one."""
    if not address.startswith("tcp://"):
        return None
    try:
        host = urlsplit("tcp://" + address[6:].rpartition(";")[2]).hostname
    except ValueError:  # (malformed: libzmq refuses it at connect)
        return None
    return host if host and host != "*" else None


def host_not_resolving(address: str) -> str | None:
    """The sentence that says ``address``'s host name does not resolve, or None when it
    does (or is an IP address, or the address is not tcp://)."""
    host = _host(address)
    if host is None:
        return None
    try:
        socket.getaddrinfo(host, None)
    except socket.gaierror:
        return (f"The host name {host!r} in {address} does not resolve: check its spelling "
                "(and this machine's DNS).")
    return None
