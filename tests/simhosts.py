"""Simulated hosts for multi-host tests: network namespaces joined by a bridge, each with its
own address and OpenSSH's ``sshd`` listening there, and an ssh config that logs in to them.

Rule: everything ``simulated_hosts`` creates (namespaces, links, the bridge, every process
inside a namespace) is removed when its ``with`` block ends, however it ends; each undo is
registered the moment its thing exists. Only this namespace's bridge address and the hosts'
own addresses are used. The hosts share this machine's filesystem, so a remote command can
run this checkout's own ``.venv/bin/python``.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from polling import poll

SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 10.0  # seconds an sshd may take to listen
STOP_TIMEOUT = 5.0  # seconds a process in a namespace may take to end on SIGTERM


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def missing() -> str | None:
    """Why simulated hosts cannot be made here (what to install or how to run), or None."""
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, sshd): run the tests as root"
    for tool, package in (("ip", "iproute2"), ("ssh", "openssh-client"),
                          ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None:
            return f"{tool} is missing: apt-get install {package}"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} is missing: apt-get install openssh-server"
    probe = f"fabprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"cannot make a network namespace here: {exc.stderr.decode().strip()}"
    _ip("netns", "del", probe)
    return None


@dataclass
class SimulatedHosts:
    """The hosts made: their addresses, namespaces, this side's bridge address, and the ssh
    config (key, known hosts, user) that reaches them."""

    addresses: list[str]
    namespaces: list[str]
    bridge_address: str
    unused_address: str  # on the bridge's network, where no host answers
    ssh_config: Path
    sshd_pids: list[int]
    links: list[str]  # each host's link to the bridge, on this side
    second: SecondNetwork | None = None  # (``second_network=True``)

    def set_link(self, host: int, up: bool) -> None:
        """Take host ``host``'s link to the bridge down (a cut cable), or bring it back up."""
        _ip("link", "set", self.links[host], "up" if up else "down")

    def pids(self, host: int) -> set[int]:
        """Every process in host ``host``'s namespace, its sshd listener excepted."""
        return _namespace_pids(self.namespaces[host]) - {self.sshd_pids[host]}


@dataclass
class SecondNetwork:
    """A second network (its own bridge) that this side and every host join, each by its own
    link, with an IPv4 and an IPv6 address: traffic that uses these addresses can be slowed
    or cut while the first network, and the broker on it, stays up. A member is a host's
    index, or ``THIS_SIDE``."""

    addresses: list[str]  # IPv4, the hosts' in order, then this side's
    addresses6: list[str]  # IPv6
    ends: list[tuple[str | None, str]]  # each member's link: (its namespace, its name)

    def set_up(self, member: int, up: bool) -> None:
        """Cut ``member``'s link (a pulled cable), or join it again."""
        self._ip(member, "link", "set", self.ends[member][1], "up" if up else "down")

    def slow(self, member: int, mbit: int) -> None:
        """What ``member`` sends here leaves at ``mbit`` Mbit/s (``tc``'s token bucket), so
        a large transfer lasts long enough to be cut in its middle."""
        self._tc(member, "replace", "root", "tbf", "rate", f"{mbit}mbit", "burst", "64kb",
                 "latency", "1s", check=True)

    def reset(self) -> None:
        """Every link up, at full speed, with its IPv6 address (a link taken down loses
        it)."""
        for member, (_, end) in enumerate(self.ends):
            self.set_up(member, True)
            self._tc(member, "del", "root", check=False)  # (none there: fine)
            self._ip(member, "-6", "addr", "replace", f"{self.addresses6[member]}/64", "dev",
                     end, "nodad")

    def _ip(self, member: int, *args: str) -> None:
        namespace = self.ends[member][0]
        _ip(*(["-n", namespace] if namespace else []), *args)

    def _tc(self, member: int, *args: str, check: bool) -> None:
        namespace, end = self.ends[member]
        subprocess.run([*(["ip", "netns", "exec", namespace] if namespace else []), "tc",
                        "qdisc", args[0], "dev", end, *args[1:]], check=check,
                       capture_output=True, timeout=10)


THIS_SIDE = -1  # this side's index among a SecondNetwork's members


def _second_network(tag: str, namespaces: list[str], undo: contextlib.ExitStack
                    ) -> SecondNetwork:
    net = random.randrange(256)
    bridge = f"fb{tag}b2"
    _ip("link", "add", bridge, "type", "bridge")
    undo.callback(_ip, "link", "del", bridge)
    _ip("link", "set", bridge, "up")
    members = [*namespaces, None]  # (this side last: THIS_SIDE)
    ends, addresses, addresses6 = [], [], []
    for i, namespace in enumerate(members):
        outside, inside = f"fb{tag}w{i}", f"fb{tag}n{i}"
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        undo.callback(_delete_link, outside)
        _ip("link", "set", outside, "master", bridge, "up")
        where = ["-n", namespace] if namespace else []
        if namespace:
            _ip("link", "set", inside, "netns", namespace)
        address, address6 = f"10.232.{net}.{10 + i}", f"fd25:{net:x}::{10 + i}"
        for command in (["addr", "add", f"{address}/24", "dev", inside],
                        ["-6", "addr", "add", f"{address6}/64", "dev", inside, "nodad"],
                        ["link", "set", inside, "up"]):
            _ip(*where, *command)
        ends.append((namespace, inside))
        addresses.append(address)
        addresses6.append(address6)
    return SecondNetwork(addresses, addresses6, ends)


def ipv6_missing() -> str | None:
    """Why IPv6 addresses cannot be given to simulated hosts here, or None."""
    try:
        disabled = Path("/proc/sys/net/ipv6/conf/all/disable_ipv6").read_text().strip()
    except OSError:
        return "this kernel has no IPv6"
    return "IPv6 is disabled here (net.ipv6.conf.all.disable_ipv6)" if disabled != "0" else None


def _namespace_pids(namespace: str) -> set[int]:
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True,
                            text=True, timeout=10).stdout
    return {int(pid) for pid in listed.split()}


def _end_namespace_processes(namespace: str) -> None:
    """SIGTERM to every process in ``namespace`` (each started by these tests), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _namespace_pids(namespace):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        poll(lambda: not _namespace_pids(namespace), STOP_TIMEOUT)


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
                   check=True, capture_output=True, timeout=30)
    return Path(f"{path}.pub").read_text().strip()


def _wait_listening(address: str, sshd: subprocess.Popen, log: Path) -> None:
    def listening() -> bool:
        if sshd.poll() is not None:
            raise RuntimeError(f"sshd exited ({sshd.returncode}): {log.read_text()}")
        with socket.socket() as probe:
            probe.settimeout(0.5)
            return probe.connect_ex((address, 22)) == 0
    if not poll(listening, START_TIMEOUT):
        raise RuntimeError(f"sshd did not listen on {address}:22 in time: {log.read_text()}")


def _sshd_config(work: Path, address: str, host_key: Path) -> Path:
    config = work / f"sshd_config-{address}"
    config.write_text(f"""\
ListenAddress {address}
Port 22
HostKey {host_key}
AuthorizedKeysFile {work / "authorized_keys"}
PidFile none
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
PrintMotd no
LogLevel VERBOSE
""")
    return config


@contextlib.contextmanager
def simulated_hosts(work: Path, count: int,
                    second_network: bool = False) -> Iterator[SimulatedHosts]:
    """``count`` hosts, each a network namespace on a bridge with sshd listening on its own
    address, and with ``second_network`` a second network joining them and this side
    (``SecondNetwork``); keys, configs and logs go in ``work``. Everything is removed on
    leaving."""
    tag = f"{os.getpid() % 1000:03d}{random.randrange(100):02d}"  # names: 15 characters at most
    net = f"10.231.{random.randrange(256)}"
    bridge = f"fb{tag}br"
    user_key = work / "id_ed25519"
    (work / "authorized_keys").write_text(_keygen(user_key) + "\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation folder
    with contextlib.ExitStack() as undo:
        _ip("link", "add", bridge, "type", "bridge")
        undo.callback(_ip, "link", "del", bridge)
        _ip("addr", "add", f"{net}.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        addresses, namespaces, sshd_pids, links, known = [], [], [], [], []
        for i in range(count):
            namespace, address = f"fabhost{tag}-{i}", f"{net}.{10 + i}"
            outside, inside = f"fb{tag}v{i}", f"fb{tag}h{i}"
            _ip("netns", "add", namespace)
            undo.callback(_ip, "netns", "del", namespace)
            undo.callback(_end_namespace_processes, namespace)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            undo.callback(_delete_link, outside)  # (gone with the namespace, unless it failed)
            _ip("link", "set", outside, "master", bridge, "up")
            _ip("link", "set", inside, "netns", namespace)
            for command in (["addr", "add", f"{address}/24", "dev", inside],
                            ["link", "set", inside, "up"], ["link", "set", "lo", "up"]):
                _ip("-n", namespace, *command)
            host_key = work / f"host_key-{address}"
            known.append(f"{address} {_keygen(host_key)}")
            log = work / f"sshd-{address}.log"
            with open(log, "w") as out:
                sshd = subprocess.Popen(["ip", "netns", "exec", namespace, SSHD, "-D", "-e",
                                         "-f", str(_sshd_config(work, address, host_key))],
                                        stdout=out, stderr=subprocess.STDOUT)
            undo.callback(stop_process, sshd)
            _wait_listening(address, sshd, log)
            addresses.append(address)
            namespaces.append(namespace)
            sshd_pids.append(sshd.pid)
            links.append(outside)
        (work / "known_hosts").write_text("\n".join(known) + "\n")
        ssh_config = work / "ssh_config"
        ssh_config.write_text(f"""\
Host *
  User {getpass.getuser()}
  IdentityFile {user_key}
  IdentitiesOnly yes
  IdentityAgent none
  UserKnownHostsFile {work / "known_hosts"}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  LogLevel ERROR
""")
        second = _second_network(tag, namespaces, undo) if second_network else None
        yield SimulatedHosts(addresses, namespaces, f"{net}.1", f"{net}.250", ssh_config,
                             sshd_pids, links, second)


def _delete_link(name: str) -> None:
    subprocess.run(["ip", "link", "del", name], capture_output=True, timeout=10)


def stop_process(proc: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> None:
    """End ``proc`` (SIGTERM, then SIGKILL after ``timeout``) and reap it; one that ended
    already (``_end_namespace_processes`` ends sshd's) is only reaped."""
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
