"""The slots unnamed workers claim on a host (``fabric.core.host_slot``) attacked by another local
user without any token (issue 41 section 2, finding 11): with every name it can take held, an
unnamed worker still starts as ``HOST/0`` and, killed and restarted, comes back under the same
name and device index; a folder another user could write is never used for the claims. End to
end with a real broker, real ``fabric worker`` processes and an intruder process run as
another Unix user (``nobody``); the folder rule is also checked on its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import HEARTBEAT

from fabric import LocalCluster
from fabric.core.host_slot import FOLDER_ENV, claim_slot, private, slot_folder
from test_default_identity import HOST, _end, _registered, _start_unnamed_workers

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(os.geteuid() != 0, reason="runs a process as another user: "
                                 "needs root")]

NOBODY = 65534
# The intruder: as another user, it holds every abstract Unix socket name that a worker's
# slot had (the claims before), and tries to make or lock the claims' files in their folder;
# it says what it holds, then waits for the end of its standard input.
SQUATTER = """
import hashlib, json, os, socket, sys
broker, folder, slots = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.setgroups([]); os.setgid(65534); os.setuid(65534)
scope = hashlib.sha256(broker.encode()).hexdigest()[:24]
held, files = [], []
for slot in range(slots):
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\\0fabric-worker-slot-{scope}-{slot}")
        claim.listen()
        held.append(claim)
    except OSError:
        claim.close()
    try:
        files.append(os.open(os.path.join(folder, f"{scope}-{slot}"), os.O_RDWR | os.O_CREAT))
    except OSError:
        pass
print(json.dumps({"sockets": len(held), "files": len(files)}), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def broker():
    """A broker with no workers of its own."""
    with LocalCluster(workers=0, heartbeat=HEARTBEAT) as running:
        yield running


def squat(broker_address: str, folder: Path, slots: int) -> tuple[subprocess.Popen, dict]:
    squatter = subprocess.Popen([sys.executable, "-c", SQUATTER, broker_address, str(folder),
                                 str(slots)], cwd="/", stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    return squatter, json.loads(squatter.stdout.readline())


def test_another_user_holds_no_slot_of_an_unnamed_worker(broker):
    squatter, holds = squat(broker.worker_address, slot_folder(), 16)
    try:
        assert holds == {"sockets": 16, "files": 0}  # (the names it could take, it took)
        named = []
        for _ in range(2):  # started, killed, started again as a supervisor would
            worker = _start_unnamed_workers(broker, 1)
            try:
                rows = _registered(broker, worker)
                named.append(sorted((row["worker"], row["index"]) for row in rows))
                if len(named) == 2:
                    with broker.connect(device=0, timeout=5) as session:
                        assert (session.arange(4) * 3).numpy().tolist() == [0, 3, 6, 9]
            finally:
                _end(worker, signal.SIGKILL if len(named) == 1 else signal.SIGTERM)
        assert named == [[(f"{HOST}/0", 0)], [(f"{HOST}/0", 0)]]
    finally:
        squatter.stdin.close()
        squatter.wait(timeout=10)
        squatter.stdout.close()
    scope = hashlib.sha256(broker.worker_address.encode()).hexdigest()[:24]
    assert not list(slot_folder().glob(f"{scope}-*"))  # (the worker that ended removed it)


@pytest.fixture
def shared_tmp():
    """A folder every user may write into, sticky (as /tmp is), removed at the end."""
    folder = Path(tempfile.mkdtemp(prefix="fabric-slots-"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def test_a_slot_folder_another_user_made_is_refused_with_a_sentence(broker, shared_tmp):
    squatted = shared_tmp / "slots"
    squatter, holds = squat(broker.worker_address, squatted, 0)  # (makes nothing yet)
    try:
        subprocess.run([sys.executable, "-c", "import os; os.setgid(65534); os.setuid(65534);"
                        f"os.mkdir({str(squatted)!r}, 0o777); os.chmod({str(squatted)!r}, 0o777)"],
                       check=True, cwd="/")
        worker = subprocess.run(
            [sys.executable, "-m", "fabric", "worker", "--broker", broker.worker_address],
            env={**os.environ, "FABRIC_WORKER_TOKEN": broker.worker_token,
                 FOLDER_ENV: str(squatted)}, capture_output=True, text=True, timeout=30)
        assert worker.returncode == 1
        assert f"{FOLDER_ENV}={squatted} cannot hold worker slots" in worker.stderr
        assert "--name" in worker.stderr and "Traceback" not in worker.stderr
    finally:
        squatter.stdin.close()
        squatter.wait(timeout=10)
        squatter.stdout.close()


def test_a_folder_is_private_when_no_other_user_may_write_or_replace_it(shared_tmp):
    assert private(shared_tmp / "mine" / "slots") is None  # made, for this user alone
    assert (shared_tmp / "mine").stat().st_mode & 0o777 == 0o700
    held = claim_slot("tcp://127.0.0.1:1", folder=shared_tmp / "mine" / "slots")
    held.close()
    open_to_all = shared_tmp / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    assert "other users may write into it" in private(open_to_all)
    assert "other users may write into" in private(open_to_all / "below")
    theirs = shared_tmp / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    assert f"belongs to user {NOBODY}" in private(theirs)
    link = shared_tmp / "link"
    link.symlink_to(shared_tmp / "mine")
    assert "not a folder" in private(link)
