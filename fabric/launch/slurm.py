"""Workers in a Slurm job: ``SlurmCluster``, a ``LocalCluster`` whose broker runs here and
whose workers run as the tasks of one job that ``sbatch`` submits, each ``fabric worker``
under ``srun``, connecting back.

Rule: Slurm owns the workers, the launcher only the job: it submits it, waits until every
task's worker has registered (however long the job waits in the queue, then
``start_timeout`` once it runs), and ends it with ``scancel``, whose SIGTERM each worker
takes as its cue to stop. A job that ends by itself (``scancel`` by someone else, its time
limit, every worker gone) ends the launcher's watch. A token never appears on a command line:
the worker token travels in the job's environment (Slurm keeps that with the job, as it keeps
every job's), which ``sbatch`` hands on to the tasks. Workers carry no ``--name``: each takes
its node's name and the lowest slot free there (``fabric.core.host_slot``), so the tasks of one
node are ``NODE/0``, ``NODE/1``...; and each gives up ``GIVE_UP_AFTER`` seconds after the
broker falls silent, so a launcher that is killed does not leave the job running until its
time limit.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

from fabric.core.addresses import advertised
from fabric.core.device import Device
from fabric.core.errors import ClusterError, ConfigError, ConnectError
from fabric.launch.local import BULK_MALLOC_TUNABLES, QUIET_BLAS, LocalCluster
from fabric.launch.supervision import _to_stderr
from fabric.launch.ssh import budget_share
from fabric.transport.connection import list_devices

GIVE_UP_AFTER = 60.0  # seconds a worker waits for a silent broker before it exits
SLURM_COMMAND_TIMEOUT = 30.0  # seconds sbatch, squeue or scancel may take to answer
CANCEL_TIMEOUT = 60.0  # seconds the job's tasks get to end after scancel
STATE_POLL = 2.0  # seconds between two looks at the job's state (squeue asks slurmctld)


class SlurmCluster(LocalCluster):
    """A broker here and ``nodes * workers_per_node`` workers in one Slurm job; a context
    manager.

    ``partition`` and ``time_limit`` are ``sbatch``'s ``--partition`` and ``--time``;
    ``sbatch_options`` more of its options (``--account=A``, ``--gres=gpu:1``), each one word.
    ``python`` is the interpreter the tasks run (this one by default: on a shared filesystem
    the nodes find it). The broker's address for workers must be one the nodes reach: bind it
    to every interface and name this host with ``advertise``, or bind it to this host's
    address. ``memory_budget`` is shared evenly among the workers of each node (a percentage:
    of what that node has available). Slurm's own output for the job is ``slurm-JOB.log`` in
    ``log_dir``. Other options are ``LocalCluster``'s.
    """

    def __init__(self, nodes: int, *, workers_per_node: int = 1, partition: str | None = None,
                 time_limit: str | None = None, sbatch_options: Sequence[str] = (),
                 python: str = sys.executable, memory_budget: str = "50%",
                 **options: Any) -> None:
        missing = [tool for tool in ("sbatch", "squeue", "scancel") if shutil.which(tool) is None]
        if missing:
            raise ConfigError(f"{', '.join(missing)} not found: install Slurm's client "
                              "commands (apt-get install slurm-client) where you submit jobs.")
        if nodes < 1 or workers_per_node < 1:
            raise ConfigError("A Slurm job needs 1 node or more and 1 worker per node or more.")
        super().__init__(nodes * workers_per_node, memory_budget=memory_budget, **options)
        self.nodes = nodes
        self.workers_per_node = workers_per_node
        self.partition = partition
        self.time_limit = time_limit
        self.sbatch_options = tuple(sbatch_options)
        self.python = python
        self._budget_share = budget_share(memory_budget, workers_per_node)
        self.job: str | None = None  # the job id, once submitted

    def batch_script(self) -> str:
        """The job's script: every task runs one ``fabric worker`` under ``srun``."""
        worker = [self.python, "-m", "fabric", "worker",
                  "--broker", advertised(self.worker_address, self.advertise),
                  *self.shared_worker_options(), "--memory-budget", self._budget_share,
                  "--give-up-after", f"{GIVE_UP_AFTER:g}"]
        return ("#!/bin/sh\n"
                "# fabric cluster slurm: one fabric worker per task, each connecting back.\n"
                f"exec srun {shlex.join(worker)}\n")

    def sbatch_command(self) -> list[str]:
        """The ``sbatch`` command line (the script comes on its standard input)."""
        return ["sbatch", "--parsable", "--job-name", "fabric-workers",
                "--nodes", str(self.nodes), "--ntasks-per-node", str(self.workers_per_node),
                *(["--partition", self.partition] if self.partition else []),
                *(["--time", self.time_limit] if self.time_limit else []),
                "--output", os.path.join(self.log_dir, "slurm-%j.log"),
                "--export", "ALL", *self.sbatch_options]

    def _job_env(self) -> dict[str, str]:
        # The tasks' environment: this one, the worker token (and no other), bulk malloc and
        # quiet BLAS threads (the heap's huge pages are each node's to choose: a worker adds
        # them at its start).
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
        return {**QUIET_BLAS, **env, "FABRIC_WORKER_TOKEN": self.worker_token, "PYTHONUNBUFFERED": "1",
                "GLIBC_TUNABLES": ":".join(BULK_MALLOC_TUNABLES)}

    def job_log_tail(self, lines: int = 10) -> str:
        """The last lines of Slurm's output for the job (its workers' logs)."""
        return self.log_tail(f"slurm-{self.job}", lines) if self.job else ""

    def job_state(self) -> tuple[str, bool]:
        """The job's state (PENDING, RUNNING, CANCELLED...; ``GONE`` when Slurm no longer
        knows it), and whether any of its processes may still run."""
        def states(*more: str) -> str:
            listed = subprocess.run(["squeue", "--noheader", "--jobs", self.job,
                                     "--format", "%T", *more], capture_output=True, text=True,
                                    timeout=SLURM_COMMAND_TIMEOUT)
            return listed.stdout.strip() if listed.returncode == 0 else ""
        active = states()  # (pending, running or completing)
        return (active or states("--states", "all") or "GONE"), bool(active)

    def start_workers(self, report: Callable[[str], None] | None = None) -> None:
        """Submit the job and wait until every one of its workers has registered: however
        long the job waits in the queue, then ``start_timeout`` seconds once it runs."""
        submitted = subprocess.run(self.sbatch_command(), input=self.batch_script(),
                                   capture_output=True, text=True, env=self._job_env(),
                                   timeout=SLURM_COMMAND_TIMEOUT)
        if submitted.returncode != 0:
            raise ClusterError("sbatch refused the job: " + " ".join(
                (submitted.stderr or submitted.stdout).split()))
        self.job = submitted.stdout.strip().split(";")[0]
        if report is not None:
            report(f"Slurm job {self.job} submitted: {self.nodes} node(s) x "
                   f"{self.workers_per_node} worker(s)")
        expected = self.n_workers * self.devices_per_worker
        running_since: float | None = None
        said, next_look = "", 0.0
        while len(devices := self._registered()) < expected:
            time.sleep(0.2)
            if time.monotonic() < next_look:
                continue
            next_look = time.monotonic() + STATE_POLL
            state, _ = self.job_state()
            if state not in ("PENDING", "RUNNING", "CONFIGURING"):
                raise ClusterError(f"Slurm job {self.job} ended ({state}) before its workers "
                                   f"registered:\n{self.job_log_tail()}")
            if report is not None and state != said:
                report(f"Slurm job {self.job} {state.lower()}")
                said = state
            if state == "RUNNING":
                running_since = running_since or time.monotonic()
                if time.monotonic() - running_since > self.start_timeout:
                    raise ClusterError(
                        f"{len(devices)} of {expected} device(s) registered within "
                        f"{self.start_timeout:g} s of Slurm job {self.job} starting:\n"
                        + self.job_log_tail())
        if report is not None:
            for worker in sorted({d.worker for d in devices}):
                indexes = [d.index for d in devices if d.worker == worker]
                report(f"{worker} registered: device(s) {', '.join(map(str, indexes))}")

    def _registered(self) -> list[Device]:
        try:
            return list_devices(self.address, self.token, 2.0, self.curve)
        except ConnectError:
            return []

    def watch(self, poll: float = 0.5, restarts: int = 0, window: float = 60.0,
              report: Callable[[str], None] = _to_stderr) -> str:
        """Block until SIGINT/SIGTERM, the broker dies or the job ends; say which. Workers
        are Slurm's: the launcher restarts none (``restarts`` and ``window`` are unused)."""
        next_look = 0.0

        def job_ended() -> str | None:
            nonlocal next_look
            if time.monotonic() < next_look:
                return None
            next_look = time.monotonic() + STATE_POLL
            state, active = self.job_state()
            if active:
                return None
            if state == "CANCELLED":
                return f"stopped by scancel of Slurm job {self.job}"
            return f"Slurm job {self.job} ended ({state}): {self.job_log_tail(3)}"
        return self._watch_until(job_ended, poll)

    def stop(self, timeout: float = 5.0) -> None:
        """End the job (``scancel``: each worker gets SIGTERM and stops), wait for its tasks
        to end (``CANCEL_TIMEOUT``), then stop the broker."""
        if self.job is not None:
            subprocess.run(["scancel", self.job], capture_output=True,
                           timeout=SLURM_COMMAND_TIMEOUT)
            deadline = time.monotonic() + CANCEL_TIMEOUT
            while self.job_state()[1] and time.monotonic() < deadline:
                time.sleep(0.2)
        super().stop(timeout)
