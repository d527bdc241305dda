"""A real single-node Slurm for tests: ``munged``, ``slurmctld`` and ``slurmd`` (Debian's
``munge``, ``slurmctld``, ``slurmd`` and ``slurm-client``), configured in a temporary folder
and started for a ``with`` block.

Rule: everything ``single_node_slurm`` starts is ended when its block ends, however it ends
(each undo registered the moment its process exists), and nothing outside its folder is
touched: its own munge key and socket, its own slurm.conf (one node, ``fabnode``, at
127.0.0.1, on free ports), its own state and spool folders. Clients find it through
``SLURM_CONF``, which ``Slurm.env`` sets. The daemons run as root, as jobs then do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from polling import poll
from simhosts import stop_process

PACKAGES = "munge slurmctld slurmd slurm-client"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo")
NODE = "fabnode"
START_TIMEOUT = 30.0  # seconds for the node to come up idle
STOP_TIMEOUT = 10.0


def unavailable() -> str | None:
    """Why a Slurm cannot run here (a reason naming what to install), or None."""
    missing = [tool for tool in DAEMONS if shutil.which(tool) is None]
    if missing:
        return (f"Slurm tests need {', '.join(missing)}: install Debian's {PACKAGES} "
                f"(apt-get install {PACKAGES}; .ci/run does, as root)")
    if os.geteuid() != 0:
        return "Slurm tests need root (slurmd runs the jobs' tasks): run the tests as root"
    return None


@dataclass
class Slurm:
    """A running single-node Slurm: ``env`` reaches it (``SLURM_CONF``)."""

    folder: Path
    env: dict[str, str]

    def run(self, *command: str) -> str:
        """A Slurm client command's output (it must succeed)."""
        return subprocess.run(command, env=self.env, capture_output=True, text=True,
                              check=True, timeout=30).stdout

    def active_jobs(self) -> list[str]:
        """Jobs pending, running or completing (any of their processes may still run)."""
        return self.run("squeue", "--noheader", "--format", "%i").split()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _slurm_conf(folder: Path, munge_socket: Path) -> str:
    ctld_port, slurmd_port = _free_port(), _free_port()
    return f"""\
ClusterName=fabrictest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
NodeName={NODE} NodeAddr=127.0.0.1 NodeHostname={socket.gethostname()} CPUs=8 RealMemory=1000
PartitionName=fabric Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def single_node_slurm(folder: Path) -> Iterator[Slurm]:
    """Configure and start a Slurm of one node in ``folder``; stop it when the block ends."""
    with contextlib.ExitStack() as undo:
        for sub in ("state", "spool"):
            (folder / sub).mkdir(parents=True)
        key, munge_socket = folder / "munge.key", folder / "munge.sock"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        conf = folder / "slurm.conf"
        conf.write_text(_slurm_conf(folder, munge_socket))
        env = {**os.environ, "SLURM_CONF": str(conf)}
        daemons = [
            # --force: the folder is under /tmp, which munged finds too widely writable.
            ["munged", "--foreground", "--force", f"--key-file={key}",
             f"--socket={munge_socket}", f"--pid-file={folder}/munged.pid",
             f"--log-file={folder}/munged.log", f"--seed-file={folder}/munge.seed"],
            ["slurmctld", "-D", "-f", str(conf)],
            ["slurmd", "-D", "-N", NODE, "-f", str(conf)]]
        for command in daemons:
            with open(folder / f"{command[0]}.out", "ab") as out:
                proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
            undo.callback(stop_process, proc, STOP_TIMEOUT)
            if command[0] == "munged":
                _wait_for(munge_socket.exists, "munged made no socket", folder)
        slurm = Slurm(folder, env)
        _wait_for(lambda: _node_state(slurm) == "idle", "the Slurm node did not come up idle",
                  folder)
        yield slurm


def _node_state(slurm: Slurm) -> str:
    listed = subprocess.run(["sinfo", "--noheader", "--format", "%T"], env=slurm.env,
                            capture_output=True, text=True, timeout=30)
    return listed.stdout.strip()


def _wait_for(ready, what: str, folder: Path) -> None:
    if not poll(ready, START_TIMEOUT, 0.2):
        logs = "\n".join(f"{path.name}: {path.read_text()[-500:]}"
                         for path in sorted(folder.glob("*.out")))
        raise RuntimeError(f"{what} within {START_TIMEOUT:g} s:\n{logs}")
