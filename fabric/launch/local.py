"""Start a broker and workers as child processes on this machine, and stop them all.

Rule: every process a ``LocalCluster`` starts is ended by it, on ``stop()``, on leaving the
``with`` block, or at interpreter exit, with SIGTERM first and SIGKILL after a deadline.
Tokens reach the children through their environment, never their command line. While it
``watch``es, a worker that dies is restarted, as a supervisor would
(``fabric.launch.supervision``). With ``standby`` it runs a broker pair
(``fabric.broker.pair``): a primary and a backup, the workers and the connection file naming
both.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from fabric.arrays.html_repr import one_line, table
from fabric.client.admin import Admin
from fabric.client.dashboard import dashboard_address
from fabric.transport.failover import first_active
from fabric.client.session import Session, dial
from fabric.core import cross_memory
from fabric.core.addresses import advertised
from fabric.core.config import new_token, write_admin_file, write_connection_file
from fabric.core.device import Device
from fabric.core.errors import ClusterError, ConnectError
from fabric.core.security import CurveClient
from fabric.transport.connection import list_devices

from fabric.launch.standby import joined, pair_addresses, pair_args
from fabric.launch.supervision import Supervision, ended_how

_PR_SET_PDEATHSIG = 1
# A large frame arrives in a fresh allocation, and faulting its pages in is most of what
# receiving it costs; on a VM whose balloon takes freed pages back (free page reporting),
# each page faults on the host too: 256 MiB uploads ran at 0.3-0.4 GB/s here. So brokers and
# workers keep freed memory for the next large array: one heap (arena_max=1: the ZMQ I/O
# thread's receive buffers too, which a thread's arena would map afresh each time), never
# mmap (mmap_max=0: munmap hands the pages back), trimmed only once more than 1 GiB is free
# at its top. Bulk transfers ran 2-4x faster (bench/run.py W3, up: 0.38-0.57 GB/s before,
# 1.26-1.39 after; down: 0.43-0.65, 0.92-0.96). The price: a process's resident memory stays
# near its high-water mark, less what passes 1 GiB free at the heap's top. These settings are
# the same on every host; ``bulk_malloc_tunables`` adds the one that is not.
BULK_MALLOC_TUNABLES = ("glibc.malloc.arena_max=1", "glibc.malloc.mmap_max=0",
                        "glibc.malloc.trim_threshold=1073741824")
# OpenBLAS's idle threads spin 2**28 cycles (~0.1 s) after each call before they sleep, so a
# loop of small matmuls keeps busy every core a worker's BLAS may use, and the client and broker
# beside it wait for one; at 2**4 cycles they sleep at once (50 small matmuls 10 ms apart on 2
# threads: 0.64-0.92 s of CPU, 0.16-0.39 s so). OpenBLAS reads it once, when it loads.
QUIET_BLAS = {"OPENBLAS_THREAD_TIMEOUT": "4"}
# Set in the environment of a process that re-executed itself with them (only once: some glibc
# cut the variable it read)
BULK_MALLOC_STARTED = "FABRIC_BULK_MALLOC_STARTED"


def _die_with_parent() -> None:
    """In a child before exec: get SIGTERM when the launcher dies, however it dies (Linux)."""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        return  # not Linux: the children notice through heartbeats instead
    if os.getppid() != parent:  # the launcher died before prctl took effect
        os._exit(1)


def bulk_malloc_tunables() -> tuple[str, ...]:
    """``BULK_MALLOC_TUNABLES``, after the heap on transparent huge pages (one fault per
    2 MiB, not per 4 KiB; glibc 2.35+) where this host's memory pays them
    (``fabric.core.cross_memory.huge_pages_pay``), else on 4 KiB pages: in a VM whose balloon
    takes freed huge pages back, a worker's first 256 MiB ``a + b`` faulted its output in at
    0.43 GB/s on huge pages, 3.5-4.2 GB/s on 4 KiB pages, and later ones ran alike (the heap
    keeps them)."""
    return (f"glibc.malloc.hugetlb={int(cross_memory.huge_pages_pay())}",
            *BULK_MALLOC_TUNABLES)


def with_bulk_malloc(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a process that moves large arrays: glibc's malloc set as
    ``bulk_malloc_tunables`` say (freed memory kept for reuse), each setting only where
    ``env``'s GLIBC_TUNABLES does not already choose it."""
    given = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
    chosen = {t.split("=", 1)[0] for t in given}
    added = [t for t in bulk_malloc_tunables() if t.split("=", 1)[0] not in chosen]
    return {**env, "GLIBC_TUNABLES": ":".join(given + added)}


def server_environment(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a broker or worker: ``with_bulk_malloc``'s, and OpenBLAS's idle threads
    asleep at once (``QUIET_BLAS``) where ``env`` does not set them otherwise."""
    return {**QUIET_BLAS, **with_bulk_malloc(env)}


def start_with_server_environment() -> None:
    """Make this process (``fabric broker``, ``fabric worker`` started by hand) run with
    ``server_environment``'s settings: where it lacks one, replace the process with itself
    (same pid, arguments and open files) with the setting added. glibc reads its tunables
    only at start (one of them, hugetlb, has no ``mallopt`` to set it later), OpenBLAS its
    setting when numpy loads it."""
    env = server_environment(os.environ)
    if env != os.environ and BULK_MALLOC_STARTED not in os.environ:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]],
                  {**env, BULK_MALLOC_STARTED: "1"})


def _read_line(proc: subprocess.Popen, deadline: float) -> str:
    # The broker prints one JSON line when bound; wait for it without blocking forever.
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or proc.poll() is not None:
            return ""
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                return ""
            line += chunk
    return line.decode()


def _end(proc: subprocess.Popen, timeout: float = 5.0) -> None:
    """End and reap one child: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# A log line that tells why a process failed: logging's error levels, a traceback's last line.
_ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|^\w+(\.\w+)*(Error|Exception): ")


_LAUNCHERS = os.path.dirname(os.path.abspath(__file__))
_DEFAULT_WORKER_ADDRESS = "tcp://127.0.0.1:*"


def _deprecated(message: str) -> None:
    """A DeprecationWarning at the first caller outside the launchers (a subclass's
    ``__init__`` passes its keywords on), so that it names the user's own line."""
    level, frame = 3, sys._getframe(2)
    while frame is not None and os.path.dirname(
            os.path.abspath(frame.f_code.co_filename)) == _LAUNCHERS:
        level, frame = level + 1, frame.f_back
    warnings.warn(message, DeprecationWarning, stacklevel=level)


class LocalCluster(Supervision):
    """A broker and ``workers`` worker processes on loopback; a context manager.

    With ``curve`` (a directory written by ``fabric keys generate``) every link is
    CURVE-encrypted and the broker accepts only that directory's client and worker keys.
    The children log to ``log_dir`` (made if missing, appended to, kept), or else to a
    temporary folder removed when the cluster is left. ``memory_budget`` (a size or a
    percentage of the memory available now, as ``fabric worker --memory-budget`` takes it) is
    shared evenly among the workers, so together they are never promised more than the
    machine has; ValueError when it is not one. ``advertise`` is the host the connection and
    admin files name (with the bound ports), for a broker bound to a wildcard address.

    ``backend`` is the workers' device backend (numpy, numexpr, jax); ``frontend`` the
    broker's address for clients and ``worker_address`` its address for workers (port ``*``:
    a free one; ``address`` and ``worker_address`` hold the bound ones once started).
    ``backend_address``, the old name of ``worker_address``, still works for this release,
    with a DeprecationWarning.

    ``standby``: a second broker on loopback, the backup of a pair whose primary is the first
    (``standby_broker``, at ``standby_address`` and ``standby_worker_address`` once started);
    the workers serve the active one, and clients and the connection file know both.
    """

    def __init__(self, workers: int = 2, *, backend: str = "numpy", devices_per_worker: int = 1,
                 heartbeat: float = 1.0, liveness: int = 3, start_timeout: float = 30.0,
                 frontend: str = "tcp://127.0.0.1:*",
                 worker_address: str = _DEFAULT_WORKER_ADDRESS,
                 broker_args: tuple[str, ...] = (), worker_args: tuple[str, ...] = (),
                 curve: str | os.PathLike[str] | None = None,
                 log_dir: str | os.PathLike[str] | None = None,
                 memory_budget: str = "50%", advertise: str | None = None,
                 backend_address: str | None = None, standby: bool = False) -> None:
        from fabric.core.worker_options import budget_from_option  # (measured once, here)

        if backend_address is not None:
            if worker_address != _DEFAULT_WORKER_ADDRESS:
                raise TypeError("Give worker_address alone: backend_address is its old name.")
            _deprecated("LocalCluster(backend_address=...) is deprecated and goes in the next "
                        "release: use worker_address=..., the broker's address for workers.")
            worker_address = backend_address

        self.n_workers = workers
        # CURVE: a ``fabric keys generate`` directory; broker, workers and clients use its keys.
        self.curve_dir = os.path.abspath(curve) if curve is not None else None
        self.curve = CurveClient.from_dir(self.curve_dir) if self.curve_dir else None
        self._curve_args = ("--curve", self.curve_dir) if self.curve_dir else ()
        self.frontend = frontend
        self.backend = backend
        self.devices_per_worker = devices_per_worker
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.start_timeout = start_timeout
        self.broker_args = broker_args
        self.advertise = advertise  # the host the files name, for a broker bound to every one
        # Each worker's share of the budget first: a --memory-budget in worker_args wins.
        share = max(1, budget_from_option(memory_budget) // max(workers, 1))
        self.worker_args = ("--memory-budget", str(share), *worker_args)
        self.token, self.worker_token, self.admin_token = new_token(), new_token(), new_token()
        self.broker: subprocess.Popen | None = None
        self.standby = standby
        self.standby_broker: subprocess.Popen | None = None  # the pair's backup
        self.standby_address = self.standby_worker_address = ""
        # The pair's state addresses (primary's, backup's): each names the other's.
        self._pair_addresses = pair_addresses() if standby else ("", "")
        self.workers: list[subprocess.Popen] = []
        self.address = ""
        self.worker_address = worker_address
        self.metrics_url: str | None = None  # the broker's /metrics, with --metrics in broker_args
        # Where write_connection_file and write_admin_file wrote, once they have.
        self.connection_file: str | None = None
        self.admin_file: str | None = None
        # Where the children's logs are: ``log_dir``, kept, or a folder removed on leaving.
        self._temporary_logs = (tempfile.TemporaryDirectory(prefix="fabric-cluster-")
                                if log_dir is None else None)
        self.log_dir = (self._temporary_logs.name if self._temporary_logs is not None
                        else os.path.abspath(log_dir))
        os.makedirs(self.log_dir, exist_ok=True)

    @property
    def backend_address(self) -> str:
        """Deprecated: the old name of ``worker_address`` (read-only), for this release."""
        _deprecated("LocalCluster.backend_address is deprecated and goes in the next release: "
                    "use worker_address, the broker's address for workers.")
        return self.worker_address

    # -- processes --------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        return {**server_environment(os.environ), "FABRIC_TOKEN": self.token,
                "FABRIC_WORKER_TOKEN": self.worker_token, "FABRIC_ADMIN_TOKEN": self.admin_token,
                "PYTHONUNBUFFERED": "1"}

    def _log(self, name: str) -> Any:
        # Appended to, so a restarted process's log follows its predecessor's.
        return open(os.path.join(self.log_dir, f"{name}.log"), "ab")

    def log_tail(self, name: str, lines: int = 10, errors_first: bool = False) -> str:
        """The last lines a child process logged (``broker`` or ``worker-N``); with
        ``errors_first``, its last error lines (``ERROR``, ``CRITICAL``, a traceback's)
        where it logged any."""
        try:
            with open(os.path.join(self.log_dir, f"{name}.log"), "rb") as f:
                logged = f.read().decode(errors="replace").splitlines()
        except OSError:
            return ""
        errors = [line for line in logged if _ERROR_LINE.search(line)] if errors_first else []
        return "\n".join((errors or logged)[-lines:])

    def start_broker(self, frontend: str | None = None,
                     worker_address: str | None = None) -> None:
        """Start the broker (on ``frontend`` and ``worker_address``, by default the cluster's)
        and learn its bound addresses; with ``standby``, the backup too, the first time."""
        self.broker, ready = self._start_broker_process(
            "broker", frontend or self.frontend, worker_address or self.worker_address,
            pair_args(self._pair_addresses, primary=True) if self.standby else [])
        self.address, self.worker_address = ready["frontend"], ready["workers"]
        self.metrics_url = ready.get("metrics")
        if self.standby and self.standby_broker is None:
            self.standby_broker, ready = self._start_broker_process(
                "standby-broker", "tcp://127.0.0.1:*", "tcp://127.0.0.1:*",
                pair_args(self._pair_addresses, primary=False))
            self.standby_address, self.standby_worker_address = (ready["frontend"],
                                                                 ready["workers"])

    def _start_broker_process(self, name: str, frontend: str, worker_address: str,
                              extra: list[str]) -> tuple[subprocess.Popen, dict[str, Any]]:
        """A broker process and the bound addresses it printed; ClusterError if it failed."""
        with self._log(name) as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fabric", "broker", "--frontend", frontend,
                 "--worker-address", worker_address, "--heartbeat", str(self.heartbeat),
                 "--liveness", str(self.liveness), *self._curve_args, *extra,
                 *self.broker_args],
                stdout=subprocess.PIPE, stderr=log, env=self._env(),
                preexec_fn=_die_with_parent)
        line = _read_line(proc, time.monotonic() + self.start_timeout)
        if not line:
            _end(proc)
            said = self.log_tail(name, 1).removeprefix("Error: ")  # (click's, once)
            raise ClusterError(f"The {name.replace('-', ' ')} did not start: {said}")
        return proc, json.loads(line)

    @property
    def brokers(self) -> str:
        """The clients' address of the broker, or of both brokers of a pair ("A,B")."""
        return joined(self.address, self.standby_address)

    def restart_broker(self, timeout: float = 5.0, standby: bool = False) -> None:
        """Stop the broker (with ``standby``, the pair's backup) and start it again on the
        same addresses with the same tokens (and its role in the pair).

        Its sessions are lost; the workers notice and register again by themselves.
        """
        if standby:
            if self.standby_broker is not None:
                _end(self.standby_broker, timeout)
            self.standby_broker, _ = self._start_broker_process(
                "standby-broker", self.standby_address, self.standby_worker_address,
                pair_args(self._pair_addresses, primary=False))
            return
        if self.broker is not None:
            _end(self.broker, timeout)
        self.start_broker(self.address, self.worker_address)

    def start_worker(self, index: int) -> subprocess.Popen:
        """Start (or restart) worker ``index``; it registers as ``worker_name(index)``.

        A previous process for ``index`` is ended (and reaped) first.
        """
        if index < len(self.workers):
            _end(self.workers[index])
        with self._log(self.worker_name(index)) as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "fabric", "worker", "--broker",
                 joined(self.worker_address, self.standby_worker_address),
                 "--threads", str(self.threads_per_worker()), *self.worker_options(index)],
                stdout=log, stderr=subprocess.STDOUT, env=self._env(),
                preexec_fn=_die_with_parent)
        if index < len(self.workers):
            self.workers[index] = proc
        else:
            self.workers.append(proc)
        return proc

    def threads_per_worker(self) -> int:
        """``--threads`` for a worker on this host (a ``--threads`` in worker_args wins): the
        cores this process may run on shared among all the devices of the cluster's workers,
        at least one. None is kept back for the client and broker: they wait while the devices
        compute, and OpenBLAS's threads sleep between calls (``QUIET_BLAS``), so a loop of
        small ops leaves them cores."""
        from fabric.core.worker_options import usable_cores

        return max(1, usable_cores() // max(self.n_workers * self.devices_per_worker, 1))

    def worker_name(self, index: int) -> str:
        """The name worker ``index`` registers under (and its log file's)."""
        return f"worker-{index}"

    def worker_options(self, index: int) -> list[str]:
        """``fabric worker``'s options for worker ``index``, all but ``--broker``."""
        return ["--name", self.worker_name(index), *self.shared_worker_options()]

    def shared_worker_options(self) -> list[str]:
        """``fabric worker``'s options that every worker of this cluster gets."""
        return ["--backend", self.backend, "--devices", str(self.devices_per_worker),
                "--heartbeat", str(self.heartbeat), "--liveness", str(self.liveness),
                *self._curve_args, *self.worker_args]

    def start_workers(self, report: Callable[[str], None] | None = None) -> None:
        """Start every worker and wait for its devices; ``report`` gets a line for each."""
        # One at a time: the broker numbers devices in registration order, so worker-i's
        # devices come after those of every worker before it.
        for i in range(self.n_workers):
            self.start_worker(i)
            devices = self.wait_for_devices((i + 1) * self.devices_per_worker)
            if report is not None:
                indexes = [d.index for d in devices if d.worker == self.worker_name(i)]
                report(f"{self.worker_name(i)} registered ({i + 1} of {self.n_workers}): "
                       f"device(s) {', '.join(map(str, indexes))}")

    def wait_for_devices(self, count: int, timeout: float | None = None) -> list[Device]:
        """Wait until the broker lists ``count`` devices; name the worker that failed."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        found: list[Device] = []
        while time.monotonic() < deadline:
            for i, proc in enumerate(self.workers):
                if proc.poll() is not None:
                    raise ClusterError(f"{self.worker_name(i)} {ended_how(proc.returncode)}:\n"
                                       + self.log_tail(self.worker_name(i)))
            try:
                found = self._list_devices(2.0)
            except ConnectError:
                found = []
            if len(found) == count:
                return found
            time.sleep(0.05)
        registered = {d.worker for d in found}
        missing = [self.worker_name(i) for i in range(len(self.workers))
                   if self.worker_name(i) not in registered]
        raise ClusterError(f"{', '.join(missing) or 'a worker'} did not register in time:\n"
                           + "\n".join(self.log_tail(m) for m in missing))

    def start(self, report: Callable[[str], None] | None = None) -> "LocalCluster":
        """Start the broker and every worker, and wait until all devices are registered;
        ``report`` gets a line as the broker starts and as each worker registers."""
        atexit.register(self.stop)
        try:
            self.start_broker()
            if report is not None:
                report(f"broker at {self.address}; starting {self.n_workers} worker(s)")
            self.start_workers(report)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """End every child process: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        procs = [p for p in [*self.workers, self.broker, self.standby_broker] if p is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in procs:
            _end(proc, max(0.0, deadline - time.monotonic()))
        atexit.unregister(self.stop)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *_: Any) -> None:
        self.stop()
        if self._temporary_logs is not None:
            self._temporary_logs.cleanup()

    def _fields(self) -> list[tuple[str, Any]]:
        """What the cluster object knows of its processes (``fabric.arrays.html_repr``),
        asking no one; no token."""
        running = self.broker is not None and self.broker.poll() is None
        alive = sum(worker.poll() is None for worker in self.workers)
        fields: list[tuple[str, Any]] = [
            ("address", self.address or "not started"),
            ("state", "running" if running else "stopped"),
            ("workers", f"{alive} of {self.n_workers} running"),
            ("devices", f"{self.n_workers * self.devices_per_worker} {self.backend} "
                        f"({self.devices_per_worker} per worker)")]
        if self.metrics_url:
            fields += [("metrics", self.metrics_url),
                       ("dashboard", dashboard_address(self.metrics_url))]
        return fields

    def __repr__(self) -> str:
        return one_line("LocalCluster", self._fields())

    def _repr_html_(self) -> str:
        """The notebook's view: address, state, workers, devices and their backend."""
        return table("LocalCluster", self._fields())

    # -- use --------------------------------------------------------------------------------

    def connect(self, device: int = 0, timeout: float = 10.0) -> Session:
        """Open a session on ``device`` of this cluster (through its active broker)."""
        brokers = self.brokers.split(",")
        return first_active(brokers, timeout, lambda address, left: dial(
            address, self.token, device, timeout, self.curve, hello_timeout=left,
            brokers=brokers))

    def devices(self) -> list[Device]:
        """Every device registered with this cluster's (active) broker."""
        return self._list_devices(10.0)

    def _list_devices(self, timeout: float) -> list[Device]:
        return first_active(self.brokers.split(","), timeout, lambda address, left: list_devices(
            address, self.token, left, self.curve))

    def admin(self, timeout: float = 5.0) -> Admin:
        """The broker's admin commands, with this cluster's admin token."""
        return Admin(self.address, token=self.admin_token, timeout=timeout, curve=self.curve)

    def _client_curve(self) -> dict[str, str] | None:
        # The client pair: clients use it, and so does fabric admin (it connects as a client).
        if not self.curve_dir:
            return None
        return {"secret_key_file": os.path.join(self.curve_dir, "client.key_secret"),
                "server_public_key_file": os.path.join(self.curve_dir, "broker.key")}

    def connection_info(self) -> dict[str, Any]:
        """What a connection file holds, for clients: the address, the client token and the
        client's CURVE key files (if any)."""
        info = {"address": advertised(self.address, self.advertise), "token": self.token,
                "curve": self._client_curve()}
        if self.standby_address:  # (``address`` alone still names the primary)
            info["brokers"] = [advertised(address, self.advertise)
                               for address in (self.address, self.standby_address)]
        return info

    def admin_info(self) -> dict[str, Any]:
        """What an admin file holds, for operators: both addresses (``address`` for clients,
        ``worker_address`` for workers), the admin and worker tokens, the CURVE key files
        ``fabric admin`` connects with and the broker's /metrics URL (these two if any)."""
        info = {"address": advertised(self.address, self.advertise),
                # (a pair's: both, "A,B", which fabric worker --admin-file serves as a pair)
                "worker_address": joined(*(advertised(address, self.advertise) for address in
                                           (self.worker_address, self.standby_worker_address)
                                           if address)),
                "admin_token": self.admin_token, "worker_token": self.worker_token,
                "curve": self._client_curve(), "metrics": self._advertised_metrics()}
        if self.standby_address:  # (``fabric admin`` shows each broker of the pair)
            info["brokers"] = [advertised(address, self.advertise)
                               for address in (self.address, self.standby_address)]
        return info

    def _advertised_metrics(self) -> str | None:
        """The /metrics URL as others reach it: on the advertised host where the broker
        serves it on every interface."""
        if not self.metrics_url:
            return None
        url = urlsplit(self.metrics_url)
        if self.advertise and url.hostname in ("0.0.0.0", "::"):
            host = f"[{self.advertise}]" if ":" in self.advertise else self.advertise
            return url._replace(netloc=f"{host}:{url.port}").geturl()
        return self.metrics_url

    def write_connection_file(self, path: str | os.PathLike[str]) -> str:
        """Write the connection file to hand to users (mode 0600; no admin or worker token);
        returns its path, also kept as ``connection_file``."""
        self.connection_file = str(write_connection_file(path, self.connection_info()))
        return self.connection_file

    def write_admin_file(self, path: str | os.PathLike[str]) -> str:
        """Write the admin file for operators only (mode 0600; the admin and worker tokens);
        returns its path, also kept as ``admin_file``."""
        self.admin_file = str(write_admin_file(path, self.admin_info()))
        return self.admin_file

_embedded: LocalCluster | None = None
_embedded_sessions = 0
_embedded_lock = threading.Lock()


def embedded_session(device: int, timeout: float) -> Session:
    """A session on the embedded local cluster, started on first use (one worker per core).

    The cluster stops when its last session closes, or at interpreter exit. Its backend is
    numpy unless FABRIC_BACKEND says otherwise.
    """
    global _embedded, _embedded_sessions
    with _embedded_lock:
        if _embedded is None:
            _embedded = LocalCluster(workers=os.cpu_count() or 1,
                                     backend=os.environ.get("FABRIC_BACKEND", "numpy")).start()
        cluster = _embedded
        _embedded_sessions += 1
    try:
        session = cluster.connect(device=device, timeout=timeout)
    except BaseException:
        _release_embedded()
        raise
    session.on_close = _release_embedded
    return session


def _release_embedded() -> None:
    global _embedded, _embedded_sessions
    with _embedded_lock:
        _embedded_sessions -= 1
        if _embedded_sessions == 0 and _embedded is not None:
            cluster, _embedded = _embedded, None
            cluster.__exit__()
