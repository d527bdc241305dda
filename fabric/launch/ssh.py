"""Workers on other hosts, started through OpenSSH's ``ssh`` client: the host list, the
commands run, and ``SSHCluster``, a ``LocalCluster`` whose workers run on those hosts.

Rule: a token never appears on a command line or in an environment. The worker token travels
over the SSH channel's standard input (``fabric worker --worker-token-file -``), which then
stays open for as long as the launcher wants the worker: the remote worker stops once it
closes (``--stop-on-stdin-close``), so a launcher that stops, is killed or loses its SSH
session leaves nothing running. The user's own ssh config, keys and agent apply, and ``ssh``
never prompts (``BatchMode``): a host it cannot log in to fails with ssh's own sentence.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from fabric.core.addresses import advertised
from fabric.core.errors import ConfigError
from fabric.launch.local import (BULK_MALLOC_TUNABLES, QUIET_BLAS, LocalCluster, _die_with_parent,
                                 _end)

# Seconds ssh may take to reach a host (unless --ssh-option ConnectTimeout=N says otherwise):
# an unreachable host is then named by ssh's own error well before the launcher's deadline.
CONNECT_TIMEOUT = 10
HOST_SETTINGS = ("workers", "python")


@dataclass(frozen=True)
class Host:
    """A host to start workers on, as ``[user@]host[:port] [workers=N] [python=PATH]``
    names it; ``workers`` and ``python`` are None where the launcher's defaults apply."""

    address: str
    user: str | None = None
    port: int | None = None
    workers: int | None = None
    python: str | None = None

    @property
    def name(self) -> str:
        """The host as worker names show it: its address, and its port if one is given."""
        return self.address if self.port is None else f"{self.address}:{self.port}"


def parse_host(entry: str) -> Host:
    """One host: ``[user@]host[:port]`` (``[v6-address]:port`` for IPv6), then optional
    ``workers=N`` and ``python=PATH`` settings separated by spaces; ConfigError otherwise."""
    if not entry.split():
        raise ConfigError("An empty host entry: write [user@]host[:port].")
    target, *settings = entry.split()
    user, _, rest = target.rpartition("@")
    if rest.startswith("["):  # [v6]:port
        address, _, after = rest[1:].partition("]")
        port_text = after[1:] if after.startswith(":") else (after or None)
    elif rest.count(":") == 1:
        address, port_text = rest.split(":")
    else:  # a name, an IPv4 address, or a bare IPv6 one
        address, port_text = rest, None
    if not address or address.startswith("-"):
        raise ConfigError(f"{entry!r} names no host: write [user@]host[:port].")
    port = None
    if port_text is not None:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise ConfigError(f"{entry!r}: the port must be a number from 1 to 65535.")
        port = int(port_text)
    given: dict[str, str] = {}
    for setting in settings:
        key, equals, value = setting.partition("=")
        if key not in HOST_SETTINGS or not equals or not value:
            raise ConfigError(f"{entry!r}: {setting!r} is not a host setting; write "
                              "workers=N or python=PATH after the host.")
        given[key] = value
    workers = given.get("workers")
    if workers is not None and not (workers.isdigit() and int(workers) > 0):
        raise ConfigError(f"{entry!r}: workers= takes a whole number of workers, 1 or more.")
    return Host(address, user or None, port, int(workers) if workers else None,
                given.get("python"))


def parse_hosts(text: str) -> list[Host]:
    """Hosts listed one a line (a host file) or separated by commas (``--hosts``); blank
    lines and ``#`` comments are skipped. ConfigError for a bad entry, a host listed twice,
    or none at all."""
    entries = [entry.strip() for line in text.splitlines()
               for entry in line.partition("#")[0].split(",")]
    hosts = [parse_host(entry) for entry in entries if entry]
    if not hosts:
        raise ConfigError("No hosts given: list them as host1,host2 or one a line in the "
                          "host file.")
    names = [host.name for host in hosts]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"{', '.join(twice)} listed more than once: list each host once, "
                          "with workers=N for more than one worker there.")
    return hosts


def ssh_command(host: Host, remote_command: str, *, config: str | None = None,
                options: Sequence[str] = ()) -> list[str]:
    """The ``ssh`` command line that runs ``remote_command`` on ``host``: the user's ssh
    ``config`` file (``-F``) and ``options`` (``-o``) first, so that they win over ours."""
    return ["ssh", "-T", *(["-F", config] if config else []),
            *[word for option in options for word in ("-o", option)],
            "-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT}",
            *(["-p", str(host.port)] if host.port else []),
            *(["-l", host.user] if host.user else []), "--", host.address, remote_command]


def remote_worker_command(python: str, worker_options: Sequence[str]) -> str:
    """The shell command that runs ``fabric worker`` with ``worker_options`` on a host: the
    token comes first on its standard input, and it stops when that input closes."""
    worker = [python, "-m", "fabric", "worker", *worker_options,
              "--worker-token-file", "-", "--stop-on-stdin-close"]
    # (the heap's huge pages are the host's to choose: the worker adds them at its start)
    return shlex.join(["exec", "env", "PYTHONUNBUFFERED=1",
                       "GLIBC_TUNABLES=" + ":".join(BULK_MALLOC_TUNABLES),
                       *(f"{name}={value}" for name, value in QUIET_BLAS.items()), *worker])


def budget_share(memory_budget: str, workers: int) -> str:
    """One of a host's ``workers``' share of ``memory_budget`` (a size, or a percentage of
    what that host has available), as ``fabric worker --memory-budget`` takes it there."""
    from fabric.core.worker_options import budget_from_option  # (checks the option; ValueError)

    budget = budget_from_option(memory_budget)
    if memory_budget.strip().endswith("%"):
        return f"{float(memory_budget.strip()[:-1]) / workers:g}%"
    return str(max(1, budget // workers))


class SSHCluster(LocalCluster):
    """A broker here and workers on other ``hosts``, started over SSH; a context manager.

    Each host runs ``workers_per_host`` workers (or its own ``workers=N``) with
    ``remote_python`` (or its own ``python=PATH``), which must have this fabric release
    installed. ``ssh_config`` (``ssh -F``) and ``ssh_options`` (``ssh -o``) are handed to
    every ``ssh``. The broker's address for workers must be one the hosts reach: bind it to
    every interface and name this host with ``advertise``, or bind it to this host's address.
    Worker ``k`` of a host registers as ``worker-k@HOST``; its log (ssh's lines and the
    remote worker's) is kept here, in ``log_dir``. ``memory_budget`` is shared evenly among
    the workers of each host (a percentage: of what that host has available). Other options
    are ``LocalCluster``'s.
    """

    def __init__(self, hosts: Sequence[Host], *, workers_per_host: int = 1,
                 remote_python: str = "python3", ssh_config: str | None = None,
                 ssh_options: Sequence[str] = (), memory_budget: str = "50%",
                 **options: Any) -> None:
        if shutil.which("ssh") is None:
            raise ConfigError("ssh is not installed here: install OpenSSH's client "
                              "(apt-get install openssh-client), which starts the workers.")
        self.hosts = list(hosts)
        counts = {host.name: host.workers or workers_per_host for host in self.hosts}
        self._slots = [(host, k) for host in self.hosts for k in range(counts[host.name])]
        super().__init__(len(self._slots), memory_budget=memory_budget, **options)
        self.remote_python = remote_python
        self.ssh_config = os.path.abspath(ssh_config) if ssh_config else None
        self.ssh_options = tuple(ssh_options)
        self._budget_shares = {name: budget_share(memory_budget, count)
                               for name, count in counts.items()}

    def worker_name(self, index: int) -> str:
        """``worker-K@HOST``: the K-th worker of its host."""
        host, k = self._slots[index]
        return f"worker-{k}@{host.name}"

    def host_of(self, index: int) -> Host:
        """The host worker ``index`` runs on."""
        return self._slots[index][0]

    def worker_command(self, index: int) -> list[str]:
        """The ``ssh`` command line that starts worker ``index`` on its host."""
        host = self.host_of(index)
        options = ["--broker", advertised(self.worker_address, self.advertise),
                   *self.worker_options(index),
                   # (after the local share worker_options gave: the last one counts)
                   "--memory-budget", self._budget_shares[host.name]]
        return ssh_command(host, remote_worker_command(host.python or self.remote_python,
                                                       options),
                           config=self.ssh_config, options=self.ssh_options)

    def start_worker(self, index: int) -> subprocess.Popen:
        """Start (or restart) worker ``index`` on its host over SSH, and hand it the worker
        token on the channel's standard input, which stays open until ``stop``."""
        if index < len(self.workers):
            _hang_up(self.workers[index])
        # ssh gets this environment without fabric's tokens, which it could forward (SendEnv).
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
        with self._log(self.worker_name(index)) as log:
            # A session of its own: the terminal's Ctrl-C reaches the launcher, which stops
            # the remote workers in order, and not ssh, which would only cut them off.
            proc = subprocess.Popen(self.worker_command(index), stdin=subprocess.PIPE,
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, preexec_fn=_die_with_parent)
        try:
            proc.stdin.write(self.worker_token.encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            pass  # ssh has already failed; its log says why, and wait_for_devices reports it
        if index < len(self.workers):
            self.workers[index] = proc
        else:
            self.workers.append(proc)
        return proc

    def start_workers(self, report: Callable[[str], None] | None = None) -> None:
        """Start every host's workers at once and wait for all their devices (indexes go in
        the order they register, and stay with each worker's name after that)."""
        for index in range(len(self._slots)):
            self.start_worker(index)
        devices = self.wait_for_devices(len(self._slots) * self.devices_per_worker)
        if report is not None:
            for index in range(len(self._slots)):
                name = self.worker_name(index)
                indexes = [d.index for d in devices if d.worker == name]
                report(f"{name} registered: device(s) {', '.join(map(str, indexes))}")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop every remote worker, then the broker: each worker's standard input is closed
        (it stops, and its last lines reach its log), then whatever is left gets SIGTERM."""
        for proc in self.workers:
            _close_stdin(proc)
        deadline = time.monotonic() + timeout
        for proc in self.workers:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass  # ended below, with the broker
        super().stop(timeout)


def _close_stdin(proc: subprocess.Popen) -> None:
    if proc.stdin is not None and not proc.stdin.closed:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass  # ssh is gone already


def _hang_up(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """End one remote worker: close its standard input, then end its ssh if it lingers."""
    _close_stdin(proc)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    _end(proc)
