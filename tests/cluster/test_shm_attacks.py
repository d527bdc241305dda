"""The shared-memory path attacked (issue 41 section 2, findings 1, 7, 8 and 13), by another
local user holding a client token or by an insider, against real processes: a broker and
workers on loopback, the victim a client in this process, the intruder a client process of
its own (``shm_intruder``), run as another Unix user (``nobody``) where it must be one.

What must hold: a session names only segments its own client process made and proved (never
the worker's own, never another process's), and the worker writes only there; a segment's
size is checked against what the transfer needs before it is mapped, and mapping faults
nothing in; upload slots asked for and never used count against --memory-limit and
--memory-budget; a client's old mapping of a device's slot never shows another client's data.
Each refusal is a typed error with a sentence; the worker goes on serving everyone and logs no
traceback. The budget's rule for a device's free shared memory is also checked on its own,
sans I/O. The leak checks of ``test_shm_path`` apply here too.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import fabric
from fabric.core.errors import ProtocolError
from fabric.core.protocol import Kind, Message
from fabric.core.segment_pool import SegmentPool
from fabric.core.shm import SharedMemory, boot_id, held_segments, parse_name
from fabric.workers import device_pool, shared_memory
from fabric.workers.backends.numpy_backend import NumpyDevice
from fabric.workers.executor import Executor
from fabric.workers.memory import MemoryBudget

from conftest import HEARTBEAT
from polling import wait_for
from test_shm_path import (NO_START, ahead_answered,
                           no_segments_left)  # noqa: F401 (an autouse fixture)

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(os.geteuid() != 0, reason="runs a client as another user: "
                                 "needs root")]

NOBODY = 65534
INTRUDER = Path(__file__).resolve().parents[1] / "shm_intruder.py"
MiB = 1 << 20
COUNT = 300_000  # float64s: 2.4 MB, over the 1 MiB threshold


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values).tobytes()).hexdigest()


def intrude(attack: str, args: dict[str, Any], user: int | None = NOBODY) -> subprocess.Popen:
    """The intruder process running ``attack`` (as ``user``; None: this process's user)."""
    return subprocess.Popen([sys.executable, str(INTRUDER), attack,
                             json.dumps({**args, "user": user})],
                            cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def findings(intruder: subprocess.Popen, timeout: float = 90) -> dict[str, Any]:
    """The intruder's last line, once it ended (killed if it did not in ``timeout``)."""
    try:
        out, err = intruder.communicate(timeout=timeout)
    finally:
        if intruder.poll() is None:
            intruder.kill()
            intruder.communicate(timeout=5)
    assert intruder.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def refused(outcome: Any) -> bool:
    """Whether an attack's step was refused with a typed error (a fabric error's name)."""
    return isinstance(outcome, dict) and outcome.get("error") in ("ProtocolError",
                                                                  "QuotaExceeded")


def no_traceback(cluster: fabric.LocalCluster) -> None:
    for worker in range(len(cluster.workers)):
        assert "Traceback" not in cluster.log_tail(f"worker-{worker}", 10_000)
    assert "Traceback" not in cluster.log_tail("broker", 10_000)


def own_segments(pid: int) -> dict[str, int]:
    """The segments process ``pid`` made and holds: name -> bytes."""
    return {name: os.stat(path).st_size for name, path in held_segments(pid).items()
            if parse_name(name).pid == pid}


# -- finding 1 -----------------------------------------------------------------------------


def test_a_session_names_only_segments_its_own_client_made_and_proved():
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster, \
            fabric.connect(cluster.address, token=cluster.token,
                           shared_memory=SharedMemory(cross_memory=False)) as victim:
        rng = np.random.default_rng(41)
        secret, other_secret, counted = rng.random(COUNT), rng.random(COUNT), np.arange(
            COUNT, dtype=np.float64)
        kept = victim.asarray(secret)  # (through this client's pool, copied out)
        victim.sync()
        ahead_answered(victim)
        in_slot = victim.asarray(other_secret)  # into a slot of the worker's own pool
        victim.sync()
        assert victim.slots_ahead.used == 1
        result = victim.asarray(counted).numpy()  # this client's slot, starting with 0.0
        intruder = intrude("others", {
            "address": cluster.address, "token": cluster.token, "names": 16,
            "worker": cluster.workers[0].pid, "victim": os.getpid(), "nbytes": COUNT * 8})
        found = findings(intruder)

        # No probe naming another process's segment was agreed to; an honest one was.
        assert found["agreed"] == [None, None], found["agreed"]
        worker_probes = [answer for name, answer in found["probes"]
                         if type(name) is str and parse_name(name).pid == cluster.workers[0].pid]
        # (no process, init's: a plain no; a pid past any pid is a malformed name: refused)
        assert all(answer.get("shared_memory") is False or refused(answer)
                   for name, answer in found["probes"] if type(name) is int)
        assert worker_probes and all(refused(answer) for answer in worker_probes)
        assert "its client process made" in worker_probes[0]["message"]
        assert found["honest_probe"] == {"shared_memory": True, "reads_memory": False}
        # Nothing of the victim's was read, written or moved into.
        secrets = {digest(secret), digest(other_secret), digest(counted)}
        assert not secrets & {outcome for _, outcome in found["reads"]
                              if isinstance(outcome, str)}
        for step in ("reads", "writes", "sends"):
            assert all(refused(outcome) for _, outcome in found[step]), (step, found[step])
        np.testing.assert_array_equal(kept.numpy(), secret)
        np.testing.assert_array_equal(in_slot.numpy(), other_secret)
        np.testing.assert_array_equal(result, counted)
        assert found["still_served"] == [6.0, 6.0, 6.0]  # the worker served the intruder
        assert victim.arange(4).sum().numpy() == 6  # and everyone else
        no_traceback(cluster)


# -- finding 7 -----------------------------------------------------------------------------


def test_a_segment_is_sized_against_its_transfer_before_it_is_mapped_and_nothing_faulted_in():
    size = 512 * MiB  # sparse: what the worker faults in, it allocates
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT) as cluster:
        found = findings(intrude("sparse", {"address": cluster.address,
                                            "token": cluster.token, "size": size}))
        assert refused(found["probe"]) and "page" in found["probe"]["message"], found["probe"]
        assert found["probe_allocated"] <= MiB
        assert found["honest_probe"] == {"shared_memory": True, "reads_memory": False}
        assert refused(found["small_put"]) and found["small_put_allocated"] <= MiB
        assert refused(found["hole_put"]) and found["hole_put_allocated"] <= MiB
        assert found["still_served"] == 6.0
        no_traceback(cluster)


# -- finding 8 -----------------------------------------------------------------------------


def _ask(session: fabric.Session, nbytes: int, give_back: list[Any] | None = None) -> Any:
    body: dict[str, Any] = {"op": "shm_slot", "nbytes": nbytes}
    if give_back:
        body["give_back"] = give_back
    return session._call(body).body


def test_upload_slots_asked_for_and_never_used_count_against_the_limits():
    limit, budget = 16 * MiB, 40 * MiB
    with fabric.LocalCluster(workers=1, devices_per_worker=2, heartbeat=HEARTBEAT,
                             worker_args=("--memory-limit", str(limit),
                                          "--memory-budget", str(budget), *NO_START)) as cluster:
        worker = cluster.workers[0].pid
        sessions = [fabric.connect(cluster.address, token=cluster.token, device=device,
                                   shared_memory=SharedMemory(threshold=0, cross_memory=False))
                    for device in (0, 0, 1, 1)]
        try:
            for session in sessions:
                session.asarray(np.ones(10)).numpy()  # agreed to shared memory
            # Each session asks for slots of 8 MiB and never uses them.
            answers = [[_ask(session, 8 * MiB) for _ in range(8)] for session in sessions]
            for asked in answers:
                lent = [answer["slot"] for answer in asked if answer["slot"] is not None]
                assert len(lent) * 8 * MiB <= limit, asked
                assert any("--memory-limit" in answer.get("reason", "")
                           or "--memory-budget" in answer.get("reason", "")
                           for answer in asked), asked
            assert sum(own_segments(worker).values()) <= budget
            # Given back at once and asked again in other sizes: the device's free segments
            # count against the budget too (and are closed where it needs the room).
            for session, asked in zip(sessions, answers):
                back = [answer["slot"] for answer in asked if answer["slot"] is not None]
                lent = []
                for size in range(3, 40, 3):
                    slot = _ask(session, size * MiB, back)["slot"]
                    back = [slot] if slot is not None else []
                    lent += [size] if slot is not None else []
                    assert sum(own_segments(worker).values()) <= budget
                assert lent == [3, 6, 9, 12]  # (a slot of 15 MiB takes a segment of 16: past
                # the session's limit with the 2 MiB one it was lent ahead of its first upload)
        finally:
            for session in sessions:
                session.close()
        with fabric.connect(cluster.address, token=cluster.token,
                            shared_memory=SharedMemory(cross_memory=False)) as session:
            # (and uploads go on)
            a = np.random.default_rng(8).random(COUNT)
            for _ in range(3):
                np.testing.assert_array_equal(session.asarray(a).numpy(), a)
                ahead_answered(session)
            assert session.slots_ahead.used >= 1
        no_traceback(cluster)


def test_the_devices_free_shared_memory_counts_against_the_budget_and_yields_to_an_op(
        monkeypatch):
    # Sans I/O: a worker's executor whose client is this process (the worker takes itself
    # for another), with a budget of 24 MiB.
    monkeypatch.setattr(shared_memory, "_worker_pid", lambda: 1)
    executor = Executor(NumpyDevice(0), budget=MemoryBudget(24 * MiB))
    client = SegmentPool(lambda _session: 0)
    probe = client.probe_segment(5)
    try:
        executor.handle(Message(Kind.OPEN, 7, 1, {"device": 0}))
        call = lambda **body: _answer(executor, Message(Kind.REQUEST, 7, 2, body)).body
        with pytest.raises(ProtocolError, match="has not agreed"):
            call(op="shm_slot", nbytes=1)
        assert call(op="shm_probe", boot=boot_id(), segment=probe.name, token=5) == {
            "shared_memory": True, "reads_memory": False}
        lent = call(op="shm_slot", nbytes=8 * MiB)["slot"]
        assert executor.allowance.held == 8 * MiB  # offered: the session's
        assert call(op="shm_slot", nbytes=MiB, give_back=[lent])["slot"] is not None
        assert executor.allowance.held == 10 * MiB  # given back: free, the device's
        data = np.ones(20 * MiB // 8)
        executor.handle(Message(Kind.SUBMIT, 7, 0, {"ops": [
            ["put", 1, [], {"dtype": "<f8", "shape": [data.size], "buffer": 0}]]},
            (data.tobytes(),)))
        assert 1 in executor.sessions[7].tensors  # admitted: the free segment made room
        assert not executor.slots.free and executor.allowance.held == 22 * MiB
        executor.handle(Message(Kind.CLOSE, 7, 3))
        assert executor.allowance.held == 2 * MiB  # (the offered slot went back: free)
    finally:
        probe.close()
        client.close()
        if executor.slots is not None:
            executor.slots.close()


def _answer(executor: Executor, message: Message) -> Message:
    """The answer to ``message``: at once, or for a slot the device's pool makes, once it is
    made."""
    replies = executor.handle(message)
    if not replies:
        replies = wait_for(lambda: device_pool.made(executor) or None, 10, "the slot made")
    return replies[0]


def resident_in_mappings(owner: int) -> dict[str, int]:
    """Process ``owner``'s segments that this process maps: name -> bytes resident."""
    found: dict[str, int] = {}
    name = None
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's first line
                path = fields[5] if len(fields) >= 6 else ""
                name = path[len("/memfd:"):] if path.startswith("/memfd:fabric-") else None
                if name is not None and parse_name(name).pid != owner:
                    name = None
            elif name is not None and fields[0] == "Rss:":
                found[name] = found.get(name, 0) + int(fields[1]) * 1024
    return found


def test_a_device_segment_it_closed_keeps_no_memory_in_a_clients_old_mapping():
    # A client keeps its mappings of the device's slots (fabric's own does, to reuse them);
    # once the device closed a free one, its memory is the system's again all the same.
    with fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                             worker_args=("--shared-memory-idle", "0.5", *NO_START)) as cluster, \
            fabric.connect(cluster.address, token=cluster.token,
                           shared_memory=SharedMemory(cross_memory=False,
                                                      start_slot=0)) as session:
        worker = cluster.workers[0].pid
        a = np.random.default_rng(13).random(4 * MiB // 8)
        kept = []
        for _ in range(3):  # the second and third into slots the device lent
            kept.append(session.asarray(a))
            session.sync()
            ahead_answered(session)
        assert session.slots_ahead.used == 2
        ahead = {entry.ref.name for entry in session.slots_ahead.arrived}  # (mapped as it
        # came, lent to the next upload: not closed)
        mapped = {name: size for name, size in resident_in_mappings(worker).items()
                  if name not in ahead}
        assert len(mapped) >= 2 and sum(mapped.values()) >= 8 * MiB
        del kept
        session.sync()  # the tensors are freed; their slots close once idle (but the one
        # lent ahead for the next upload)
        wait_for(lambda: not mapped.keys() & own_segments(worker).keys(), 20,
                 "the device's idle slots to close", interval=0.1)
        assert not mapped.keys() & own_segments(worker).keys()
        still = resident_in_mappings(worker)
        assert mapped.keys() <= still.keys()  # this client maps them still
        assert sum(still[name] for name in mapped) == 0  # but they hold nothing any more
        np.testing.assert_array_equal(session.asarray(a).numpy(), a)  # and uploads go on


# -- finding 13 ----------------------------------------------------------------------------


@pytest.fixture
def two_tokens(tmp_path: Path):
    """A cluster of one worker whose broker takes two client tokens: the cluster's own (the
    spy's) and ``victim_token``."""
    tokens = tmp_path / "client-tokens"
    cluster = fabric.LocalCluster(workers=1, heartbeat=HEARTBEAT,
                                  broker_args=("--token-file", str(tokens)))
    cluster.victim_token = "victim-token-4113"
    tokens.write_text(f"{cluster.token}\n{cluster.victim_token}\n")
    tokens.chmod(0o600)
    with cluster as running:
        yield running


def test_an_old_mapping_of_a_device_slot_never_shows_another_clients_upload(two_tokens):
    spy = intrude("spy", {"address": two_tokens.address, "token": two_tokens.token,
                          "seed": 5, "count": COUNT}, user=None)
    try:
        ready = json.loads(spy.stdout.readline())
        assert ready["ready"] == 1 and ready["mapped"] >= 1, ready  # it mapped a device slot
        spied = np.random.default_rng(5).random(COUNT)
        secret = np.random.default_rng(6).random(COUNT)
        with fabric.connect(two_tokens.address, token=two_tokens.victim_token,
                            shared_memory=SharedMemory(cross_memory=False)) as victim:
            kept = [victim.asarray(secret)]
            victim.sync()
            ahead_answered(victim)
            buffer = victim.upload_buffer((COUNT,))  # a slot the device lends: never the
            # spy's old bytes
            assert not np.array_equal(buffer, spied) and not np.array_equal(buffer, spied * 2)
            buffer[...] = secret
            kept.append(victim.asarray(buffer))
            for _ in range(2):
                kept.append(victim.asarray(secret))
                victim.sync()
                ahead_answered(victim)
            assert victim.slots_ahead.used >= 2
            spy.stdin.write("go\n")
            spy.stdin.flush()
            seen = findings(spy)
            assert digest(secret) not in seen["digests"]
            for tensor in kept:
                np.testing.assert_array_equal(tensor.numpy(), secret)
        no_traceback(two_tokens)
    finally:
        if spy.poll() is None:
            spy.kill()
            spy.communicate(timeout=5)
