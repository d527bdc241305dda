"""Workers in Slurm jobs (issue 24 section 3), against a real single-node Slurm that
``tests/simslurm.py`` configures and starts for this module: ``fabric cluster slurm`` as the
operator's guide (docs/operations.md) writes it, ended by ``scancel`` and by Ctrl-C, a job
Slurm refuses, and the guide's own batch script running ``fabric worker --admin-file``; and
the usage errors, which need no Slurm.

The guide's commands name a real cluster (two nodes, ``login1.example.org``, ``/shared``);
they run here as written but for those names, which ``_here`` replaces with this node, this
machine's loopback and a temporary folder. Skipped, naming the packages, without Slurm or
root.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from polling import wait_for
from simslurm import Slurm, single_node_slurm, unavailable

import fabric

pytestmark = pytest.mark.timeout(180)

OPERATIONS_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
FABRIC = str(Path(sys.executable).parent / "fabric")  # the venv's, as .venv/bin/fabric is
HOST = socket.gethostname()
WAIT = 60.0  # seconds for a launcher to write its files, or to end


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with single_node_slurm(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def _slurm_blocks() -> list[str]:
    """The operator's guide's Slurm commands (docs/operations.md): the launcher, the cluster for your own script, the script."""
    section = OPERATIONS_GUIDE.read_text().split("### Slurm\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)\n```", section, re.S)


def _here(text: str, shared: Path) -> str:
    """A README command for this single-node Slurm: this node, loopback, a scratch folder."""
    for there, here in [("--nodes 2 --workers-per-node 4", "--nodes 1 --workers-per-node 2"),
                        ("--nodes=2 --ntasks-per-node=4", "--nodes=1 --ntasks-per-node=2"),
                        ("--partition gpu", "--partition fabric"), ("4:00:00", "10:00"),
                        ("login1.example.org", "127.0.0.1"),
                        ("tcp://0.0.0.0:5555", "'tcp://127.0.0.1:*'"),
                        ("tcp://0.0.0.0:5556", "'tcp://127.0.0.1:*'"),
                        ("/shared/fabric/.venv/bin/fabric", FABRIC),
                        ("/shared/fabric", str(shared))]:
        text = text.replace(there, here)
    text = re.sub(r"(?m)^\.venv/bin/fabric", FABRIC, text)
    assert "example.org" not in text and "/shared/fabric" not in text, text  # (one missed)
    return text


def _launch(slurm: Slurm, command: str, tmp_path: Path) -> subprocess.Popen:
    """Run a README command as a user's shell would, with this Slurm's SLURM_CONF."""
    env = {k: v for k, v in slurm.env.items() if not k.startswith("FABRIC_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    return subprocess.Popen(["bash", "-c", f"exec {command}"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _wait_for_file(path: Path, launcher: subprocess.Popen) -> None:
    def written() -> bool:
        if path.exists():
            return True
        assert launcher.poll() is None, launcher.communicate()
        return False
    wait_for(written, WAIT, f"{path} to be written", interval=0.2)


def _ended(launcher: subprocess.Popen) -> tuple[int, str]:
    try:
        _, err = launcher.communicate(timeout=WAIT)
    except subprocess.TimeoutExpired:
        launcher.kill()
        launcher.communicate()
        raise
    return launcher.returncode, err


def _computes_on_every_device(connection_file: Path, count: int) -> list[str]:
    """Each device's worker name, after checking one computation there against numpy."""
    names = []
    for device in range(count):
        with fabric.connect(connection_file=str(connection_file), device=device,
                            timeout=10) as session:
            values = np.arange(12.0).reshape(3, 4) + device
            result = (session.asarray(values) * 2 + 1).sum(axis=0).numpy()
            np.testing.assert_array_equal(result, (values * 2 + 1).sum(axis=0))
            names.append(session.device.worker)
    return names


def _workers_running(worker_address: str) -> list[int]:
    """Processes whose command line names this broker address (its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and worker_address.encode() in (
                    entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _start_the_readme_launcher(slurm: Slurm, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    connection_file = tmp_path / "cluster.json"
    launcher = _launch(slurm, _here(_slurm_blocks()[0], tmp_path)
                       + f" --frontend 'tcp://127.0.0.1:*' --worker-address 'tcp://127.0.0.1:*'"
                       f" --connection-file {connection_file} --heartbeat 0.2", tmp_path)
    _wait_for_file(connection_file, launcher)
    return launcher, connection_file


def test_cluster_slurm_runs_workers_in_a_job_and_a_scancel_ends_everything(slurm, tmp_path):
    launcher, connection_file = _start_the_readme_launcher(slurm, tmp_path)
    try:
        [job] = slurm.active_jobs()
        admin_file = tmp_path / "cluster-admin.json"
        worker_address = json.loads(admin_file.read_text())["worker_address"]
        # Two tasks on the one node: its name and slots 0 and 1, one device each.
        assert sorted(_computes_on_every_device(connection_file, 2)) == [f"{HOST}/0",
                                                                         f"{HOST}/1"]
        assert len(_workers_running(worker_address)) >= 2
        slurm.run("scancel", job)
        code, err = _ended(launcher)
    finally:
        _killed_if_running(launcher)
    assert code == 0, err
    assert f"stopped by scancel of Slurm job {job}" in err
    assert not connection_file.exists() and not admin_file.exists()
    assert slurm.active_jobs() == []
    assert _workers_running(worker_address) == []
    # Slurm's output for the job, every worker's log, is kept in the log folder.
    [job_log] = tmp_path.glob(f"cluster-logs-*/slurm-{job}.log")
    assert f"worker {HOST}/0" in job_log.read_text()


def _killed_if_running(launcher: subprocess.Popen) -> None:
    if launcher.poll() is None:  # (a failed test's launcher: ended here, whatever it does)
        launcher.kill()
        launcher.communicate()


def test_ctrl_c_cancels_the_job_and_stops_the_broker(slurm, tmp_path):
    launcher, connection_file = _start_the_readme_launcher(slurm, tmp_path)
    try:
        worker_address = json.loads(
            (tmp_path / "cluster-admin.json").read_text())["worker_address"]
        launcher.send_signal(signal.SIGINT)
        code, err = _ended(launcher)
    finally:
        _killed_if_running(launcher)
    assert code == 0, err
    assert "stopped by SIGINT" in err
    assert not connection_file.exists()
    assert slurm.active_jobs() == []  # cancelled, and its tasks ended
    assert _workers_running(worker_address) == []


def test_a_job_slurm_refuses_is_reported_and_nothing_is_left(slurm, tmp_path):
    connection_file = tmp_path / "cluster.json"
    launcher = _launch(slurm, f"{FABRIC} cluster slurm --nodes 1 --partition nosuch "
                       f"--frontend 'tcp://127.0.0.1:*' --worker-address 'tcp://127.0.0.1:*' "
                       f"--connection-file {connection_file}", tmp_path)
    code, err = _ended(launcher)
    assert code == 1
    assert "sbatch refused the job" in err and "partition" in err.lower()
    assert not connection_file.exists()
    assert slurm.active_jobs() == []


def test_the_readme_batch_script_runs_workers_that_read_the_shared_admin_file(slurm, tmp_path):
    _, cluster_up, script = _slurm_blocks()
    shared = tmp_path / "shared"
    shared.mkdir()
    cluster = _launch(slurm, _here(cluster_up, shared) + " --heartbeat 0.2", tmp_path)
    try:
        _wait_for_file(shared / "cluster.json", cluster)
        batch = tmp_path / "fabric-workers.sbatch"
        batch.write_text(_here(script, shared) + "\n")
        job = slurm.run("sbatch", "--parsable", "--output", str(tmp_path / "job.log"),
                        str(batch)).strip()
        wait_for(lambda: len(fabric.devices(connection_file=str(shared / "cluster.json"),
                                            timeout=5)) >= 2,
                 WAIT, "the job's 2 devices", interval=0.2,
                 detail=(tmp_path / "job.log").read_text)
        assert sorted(_computes_on_every_device(shared / "cluster.json", 2)) == [
            f"{HOST}/0", f"{HOST}/1"]
        slurm.run("scancel", job)
        wait_for(lambda: not slurm.active_jobs(), WAIT, "the job to end after scancel",
                 interval=0.2)
    finally:
        cluster.send_signal(signal.SIGINT)
        code, err = _ended(cluster)
    assert code == 0, err


def test_usage_errors_say_what_to_give(tmp_path):
    def slurm_command(*args: str, path: str = os.environ["PATH"]) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
        return subprocess.run([sys.executable, "-m", "fabric", "cluster", "slurm", *args,
                               "--connection-file", str(tmp_path / "c.json")],
                              env={**env, "PATH": path}, capture_output=True, text=True,
                              timeout=30)
    # The nodes must reach the broker, which binds every interface: by which name?
    unnamed = slurm_command("--nodes", "1")
    assert unnamed.returncode == 2 and "--advertise" in unnamed.stderr
    no_nodes = slurm_command("--advertise", "head")
    assert no_nodes.returncode == 2 and "--nodes" in no_nodes.stderr
    no_slurm = slurm_command("--nodes", "1", "--advertise", "head",
                             path=str(tmp_path / "nothing-here"))
    assert no_slurm.returncode == 2 and "apt-get install slurm-client" in no_slurm.stderr
    assert not (tmp_path / "c.json").exists()


def test_a_worker_admin_file_without_what_it_needs_says_what_to_give(tmp_path):
    def worker(admin_file: Path) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_")}
        return subprocess.run([sys.executable, "-m", "fabric", "worker", "--admin-file",
                               str(admin_file)], env=env, capture_output=True, text=True,
                              timeout=30)
    older = tmp_path / "older-admin.json"  # an admin file that names no worker address
    older.write_text(json.dumps({"address": "tcp://127.0.0.1:1", "worker_token": "t"}))
    older.chmod(0o600)
    done = worker(older)
    assert done.returncode == 1 and "names no worker address: give --broker" in done.stderr
    tokenless = tmp_path / "cluster.json"  # a client's connection file: no worker token
    tokenless.write_text(json.dumps({"address": "tcp://127.0.0.1:1", "token": "c"}))
    tokenless.chmod(0o600)
    done = worker(tokenless)
    assert done.returncode == 2 and "No worker token given" in done.stderr
