"""Addresses as others see them: a host name that does not resolve, and the address to hand
out for a broker bound to every interface.

Rule: a name is looked up only once a connection has failed (libzmq retries an unresolvable
name as it retries a closed port, and says nothing more), so a working address never pays
for it. A wildcard bind address is never handed to anyone to connect to.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from fabric.core.errors import ConfigError


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


def advertised(address: str, host: str | None) -> str:
    """``address`` as others connect to it: on ``host`` (with the same port) when one is
    given. A wildcard bind address (``0.0.0.0``, ``::``, ``*``) is never one to connect to,
    so without ``host`` it is refused (ConfigError), never handed out."""
    scheme, _, rest = address.partition("://")
    bound, _, port = rest.rpartition(":")
    if scheme != "tcp":
        return address
    if host is not None:
        return f"tcp://{host}:{port}"
    if bound.strip("[]") in ("0.0.0.0", "::", "*"):
        raise ConfigError(f"{address} listens on every interface: it is not an address to "
                          "connect to. Give the host name or address that clients and "
                          "workers reach the broker by (--advertise HOST).")
    return address


def only_this_host(address: str) -> bool:
    """Whether ``address`` can be reached from this machine alone: ``ipc://``, ``inproc://``,
    or tcp:// on a loopback address or ``localhost``."""
    if not address.startswith("tcp://"):
        return True
    host = _host(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:  # a host name others may resolve, a wildcard, or malformed
        return False


_WILDCARDS = ("0.0.0.0", "::", "*", "")


def advertise_host(text: str) -> str:
    """``text`` as ``--advertise`` takes it: a host name or address that others reach this
    machine by, with no scheme and no port (the ports are the bound ones). ConfigError, with
    a sentence, for a URL, a port, or an address that binds every interface."""
    example = "give a host name or address, say node1.example.org or 10.0.0.1"
    if "://" in text:
        raise ConfigError(f"--advertise {text!r} is a URL: {example}; the ports are the "
                          "ones --frontend and --worker-address bind.")
    bare = text.strip("[]")
    if ":" in bare and not _is_ipv6(bare):
        raise ConfigError(f"--advertise {text!r} has a port: {example}; the ports are the "
                          "ones --frontend and --worker-address bind.")
    if bare in _WILDCARDS:
        raise ConfigError(f"--advertise {text!r} binds every interface; it is no address to "
                          f"connect to: {example}.")
    return f"[{bare}]" if _is_ipv6(bare) else text


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def check_endpoint(address: str) -> str:
    """``address`` if ZeroMQ can connect to it (``tcp://HOST:PORT``, ``ipc://PATH``,
    ``inproc://NAME``); else ConfigError, with a sentence saying what an address looks like."""
    scheme, sep, rest = address.partition("://")
    host, _, port = rest.rpartition(":")
    fine = sep and (scheme in ("ipc", "inproc") and rest or scheme == "tcp" and host
                    and "://" not in rest and port.isdigit() and 0 < int(port) < 65536)
    if not fine:
        raise ConfigError(f"{address!r} is not an address to connect to: give "
                          "tcp://HOST:PORT (say tcp://10.0.0.1:5556), or ipc://PATH.")
    return address


def check_endpoints(addresses: str) -> str:
    """``addresses``, one address or several separated by commas (a broker pair's), if
    ZeroMQ can connect to each; else ConfigError naming the one it cannot."""
    for address in addresses.split(","):
        check_endpoint(address)
    return addresses
