"""A worker's options: the one frozen record a worker is started with (``WorkerOptions``),
and what its options mean where launchers must know it too: sizes and memory budgets
(``--memory-budget``, ``--memory-limit``) and the cores a process may use (``--threads``).

Rule: ``fabric worker`` and a caller of ``fabric.workers.control_io.serve`` build the same
record, and the worker reads nothing else: no module setting, and no environment variable
after the record is made (its defaults read ``FABRIC_COPY_THREADS`` and
``FABRIC_PARALLEL_COPY_BYTES``, and the memory available, as it is made). Parsers and readings
of the host here are shared by the ``fabric worker`` command, the worker process and the
launchers that share a budget or cores among the workers they start.
The default budget is a share of the memory this process may use when it starts: the
machine's MemAvailable, and where the process runs in a memory cgroup (v2 ``memory.max``, or
v1 ``memory.limit_in_bytes``, its ancestors' included) what is left below its limit.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError
from .flow import DEFAULT_HWM, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_RESUME_GRACE
from .parallel_copy import default_min_bytes, default_threads
from .security import CurveClient
from .shm import DEFAULT_POOL_BYTES, IDLE_SECONDS, START_SLOT_BYTES

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 10**3, "kib": 1 << 10, "m": 1 << 20,
          "mb": 10**6, "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30,
          "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}

DEFAULT_MEMORY_BUDGET = "50%"  # of the memory available as the worker starts
# The fewest elements a numexpr device fuses an op on (a tuning knob, no option: unset, the
# device's own bound; 0 fuses every size)
NUMEXPR_MIN_SIZE_ENV = "FABRIC_NUMEXPR_MIN_SIZE"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not Linux)
        return os.cpu_count() or 1


def default_worker_threads(devices: int) -> int:
    """A worker's thread count when it is not told one: its cores shared among its
    ``devices``, at least one."""
    return max(1, usable_cores() // max(devices, 1))


def parse_size(text: str) -> int:
    """Bytes from ``text``: ``1073741824``, ``512MiB``, ``2G`` (binary), ``2GB`` (decimal).
    Raises ValueError, saying what is accepted."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match and _UNITS.get(match.group(2).lower())
    if not match or unit is None:
        raise ValueError(f"{text!r} is not a size: give bytes (1073741824), a size with a unit "
                         "(512MiB, 2G) or a percentage of the memory available (50%).")
    return int(float(match.group(1)) * unit)


def budget_from_option(text: str, available: int | None = None) -> int:
    """The budget ``--memory-budget`` asks for: a size (``parse_size``), or a percentage of
    ``available`` (default: ``available_memory()``). Raises ValueError."""
    if text.strip().endswith("%"):
        try:
            percent = float(text.strip()[:-1])
        except ValueError:
            percent = -1.0
        if not 0 < percent <= 100:
            raise ValueError(f"{text!r} is not a percentage between 0 and 100.")
        return int((available_memory() if available is None else available) * percent / 100)
    budget = parse_size(text)
    if budget <= 0:
        raise ValueError("The memory budget must be more than 0 bytes.")
    return budget


def available_memory(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> int:
    """Bytes this process may still allocate: MemAvailable, or less where a memory cgroup
    (v2 or v1, this process's or an ancestor's) has less left below its limit."""
    meminfo = dict(line.split(":", 1) for line in (proc / "meminfo").read_text().splitlines())
    available = int(meminfo["MemAvailable"].split()[0]) * 1024
    for limit, usage in _cgroup_limits(proc, cgroups):
        available = min(available, max(0, limit - usage))
    return available


def _cgroup_limits(proc: Path, cgroups: Path) -> list[tuple[int, int]]:
    """(limit, usage) of each memory cgroup above this process that has a limit."""
    found = []
    for line in (proc / "self" / "cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: memory.max and memory.current, up to the root
            files, root = ("memory.max", "memory.current"), cgroups
            if not (root / "cgroup.controllers").exists():
                root = cgroups / "unified"
        elif "memory" in controllers.split(","):  # v1
            files, root = ("memory.limit_in_bytes", "memory.usage_in_bytes"), cgroups / "memory"
        else:
            continue
        directory = root / path.lstrip("/")
        while directory != root.parent and directory.is_relative_to(root):
            try:
                limit, usage = ((directory / f).read_text().strip() for f in files)
                if limit.isdigit() and int(limit) < 1 << 60:  # (v1 writes "no limit" as 2^63)
                    found.append((int(limit), int(usage)))
            except OSError:
                pass
            directory = directory.parent
    return found


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs: each field is the ``fabric worker`` option of its name (``fabric
    worker --help`` says what each means), with the same default. ``threads`` None: the
    cores this process may use shared among its devices; ``memory_budget`` None: no
    budget; ``bulk_host`` None: no direct links; ``shared_memory`` False: as
    ``--no-shared-memory``."""

    token: str
    name: str
    backend: str = "numpy"
    devices: int = 1
    threads: int | None = None
    heartbeat: float = 1.0
    liveness: int = 3
    memory_limit: int | None = None
    memory_budget: int | None = field(
        default_factory=lambda: budget_from_option(DEFAULT_MEMORY_BUDGET))
    curve: CurveClient | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    hwm: int = DEFAULT_HWM
    give_up_after: float | None = None
    # Seconds a worker of a pair keeps its sessions after its broker went, for the broker
    # that takes over (``workers.control``); then it drops them.
    resume_grace: float = DEFAULT_RESUME_GRACE
    bulk_host: str | None = "auto"
    shared_memory: bool = True
    shared_memory_limit: int = DEFAULT_POOL_BYTES
    shared_memory_idle: float = IDLE_SECONDS
    start_slot: int = START_SLOT_BYTES  # a device's segment kept for a start slot (0: none)
    copy_threads: int = field(default_factory=default_threads)  # (FABRIC_COPY_THREADS)
    copy_min_bytes: int = field(default_factory=default_min_bytes)
    numexpr_min_size: int | None = field(default_factory=lambda: _environment_count(
        NUMEXPR_MIN_SIZE_ENV))


def _environment_count(name: str) -> int | None:
    """The whole number >= 0 the environment variable ``name`` holds (None: unset);
    ConfigError, saying what to do, for anything else."""
    given = os.environ.get(name)
    if given is None:
        return None
    if not given.strip().isdigit():
        raise ConfigError(f"{name}={given!r} is not a whole number of at least 0: set it to "
                          "one, or unset it for the default.")
    return int(given)
