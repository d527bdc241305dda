"""Soak of a broker pair: clients stream ops and reads while the active broker is SIGKILLed
every ``--every`` seconds and started again as the new standby; nothing wrong, hung or left.

    python bench/soak_takeover.py --seconds 600 --every 30

One pair (``LocalCluster(standby=True)``, two workers) serves throughout. Two client threads,
each with its own sessions (every socket stays in one thread), keep one session open as long
as it lasts, resumed across each takeover (``fabric.transport.takeover``), and check every
result against numpy: one runs chains of ops on one device and reads them, now and then
uploading and reading an array large enough for shared memory; the other runs a sharded
computation on a mesh of both devices. A session that is lost anyway (a typed ``SessionLost``)
is counted and replaced. The killer alternates the pair: it SIGKILLs whichever broker is
active, then starts it again with its role, and it comes back passive.

Reported: reads done and ops run, takeovers survived, each takeover's pause (the chain
client's longest wait between two answered reads after its SIGKILL: p50, max), typed
failures by class, wrong results (must be 0), calls longer than their deadline plus the
takeover bound (hangs, must be 0), and what is left at the end (must be 0): sessions on the
devices, segments that a cluster process holds of a process that is gone or of this client
once its sessions closed, and processes of the cluster (killed ones included) still running
after it stopped.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from bench.soak import Tally  # noqa: E402
from bench.takeover import active_one  # noqa: E402
from fabric.core.shm import held_segments, parse_name  # noqa: E402
from fabric.transport.takeover import TAKEOVER_LIMIT  # noqa: E402

CALL_TIMEOUT = 10.0
HANG_SLACK = 2.0
SHM_ELEMENTS = 1 << 18  # 2 MiB of float64: over the 1 MiB shared-memory threshold
SETTLE = "3"  # the new broker's wait for the workers of its table (seconds)


class Pauses:
    """Each takeover's pause, as one client sees it: the longest wait between two answered
    calls from its SIGKILL to the next takeover (a call takes milliseconds otherwise)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_answer = time.monotonic()
        self.seconds: list[float] = []  # one for each takeover so far

    def killed(self) -> None:
        with self.lock:
            self.seconds.append(0.0)

    def answered(self) -> None:
        with self.lock:
            now = time.monotonic()
            if self.seconds:
                self.seconds[-1] = max(self.seconds[-1], now - self.last_answer)
            self.last_answer = now


def chain_loop(path: str, stop: threading.Event, tally: Tally, pauses: Pauses,
               seed: int) -> None:
    """Chains of ops on device 0 and their reads, through one session kept open."""
    rng = random.Random(seed)
    session = None
    while not stop.is_set():
        started = time.monotonic()
        try:
            if session is None:
                session = fabric.connect(connection_file=path, device=0, timeout=CALL_TIMEOUT)
            n = SHM_ELEMENTS if rng.random() < 0.1 else rng.randint(1, 2000)
            steps = rng.randint(1, 100)
            base = np.arange(n, dtype=np.float64)
            x = session.asarray(base)
            for k in range(steps):
                x = x * 1.0 + k
            tally.ran(2 * steps)
            started = time.monotonic()
            got = x.numpy()
            tally.timed(started)
            pauses.answered()
            if not np.array_equal(got, base + steps * (steps - 1) / 2):
                tally.wrong_result(f"chain n={n} steps={steps}")
        except fabric.FabricError as exc:
            tally.timed(started)
            tally.typed_failure(exc)
            session = close_quietly(session)
        except Exception as exc:  # anything untyped is a defect: count it as wrong
            tally.wrong_result(f"{type(exc).__name__}: {exc}")
            session = close_quietly(session)
    close_quietly(session)


def mesh_loop(path: str, stop: threading.Event, tally: Tally, seed: int) -> None:
    """A sharded computation on a mesh of every device, read back, through one session."""
    rng = random.Random(seed)
    parent = None
    while not stop.is_set():
        started = time.monotonic()
        try:
            if parent is None:
                parent = fabric.connect(connection_file=path, timeout=CALL_TIMEOUT)
                mesh = parent.mesh()
            start = np.linspace(-1.0, 1.0, rng.randint(2, 4000))
            steps = rng.randint(1, 30)
            x, want = mesh.asarray(start, axis=0), start
            for _ in range(steps):
                x, want = np.tanh(x) + 1, np.tanh(want) + 1
            tally.ran(2 * steps)
            started = time.monotonic()
            got = x.numpy()
            tally.timed(started)
            if not np.allclose(got, want, rtol=1e-12, atol=0):
                tally.wrong_result(f"mesh n={start.size} steps={steps}")
        except fabric.FabricError as exc:
            tally.timed(started)
            tally.typed_failure(exc)
            parent = close_quietly(parent)
        except Exception as exc:
            tally.wrong_result(f"{type(exc).__name__}: {exc}")
            parent = close_quietly(parent)
    close_quietly(parent)


def close_quietly(session: fabric.Session | None) -> None:
    """Close ``session`` (a lost one may refuse to say goodbye); always None."""
    if session is not None:
        try:
            session.close()
        except fabric.FabricError:
            pass
    return None


def take_over(cluster: fabric.LocalCluster, processes: list[subprocess.Popen]) -> str:
    """SIGKILL the active broker and start it again with its role; the role killed."""
    role = active_one(cluster)
    victim = cluster.broker if role == "primary" else cluster.standby_broker
    victim.send_signal(signal.SIGKILL)
    victim.wait(5)
    cluster.restart_broker(standby=role == "backup")
    processes.append(cluster.broker if role == "primary" else cluster.standby_broker)
    return role


def sessions_left(cluster: fabric.LocalCluster, devices: int, wait: float) -> int:
    """Sessions still open on the devices besides the checker's own, once those lost with
    a takeover have had ``wait`` seconds to end (a pair's worker keeps them for its grace)."""
    deadline = time.monotonic() + wait
    while True:
        left = 0
        for device in range(devices):
            with cluster.connect(device=device, timeout=CALL_TIMEOUT) as checker:
                left += checker.stats()["device_sessions"] - 1
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


def segments_left(cluster_pids: list[int]) -> list[str]:
    """Segments a cluster process holds whose owner is gone, or is this process (whose
    sessions are all closed): what nobody will give back."""
    mine, alive = os.getpid(), set(cluster_pids)
    left = []
    for pid in cluster_pids:
        for name in held_segments(pid):
            owner = parse_name(name).pid
            if owner == mine or owner not in alive:
                left.append(f"{pid} holds {name}")
    return left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between takeovers")
    parser.add_argument("--pair-heartbeat", type=float, default=0.5)
    parser.add_argument("--pair-liveness", type=int, default=2)
    args = parser.parse_args()
    tally = Tally(hang_after=CALL_TIMEOUT + TAKEOVER_LIMIT + HANG_SLACK)
    pauses, stop = Pauses(), threading.Event()
    workers, takeovers, killed_roles = 2, 0, []
    with tempfile.TemporaryDirectory() as folder:
        cluster = fabric.LocalCluster(
            workers=workers, standby=True, heartbeat=0.5, log_dir=os.path.join(folder, "logs"),
            broker_args=("--pair-heartbeat", str(args.pair_heartbeat),
                         "--pair-liveness", str(args.pair_liveness), "--settle", SETTLE))
        with cluster:
            processes = [cluster.broker, cluster.standby_broker, *cluster.workers]
            path = cluster.write_connection_file(os.path.join(folder, "cluster.json"))
            threads = [
                threading.Thread(target=chain_loop, args=(path, stop, tally, pauses, 1)),
                threading.Thread(target=mesh_loop, args=(path, stop, tally, 2))]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + args.seconds
            while True:
                time.sleep(min(args.every, max(0.0, deadline - time.monotonic())))
                if time.monotonic() >= deadline:
                    break
                pauses.killed()
                killed_roles.append(take_over(cluster, processes))
                takeovers += 1
                print(f"takeover {takeovers}: the {killed_roles[-1]} killed; calls so far "
                      f"{tally.calls}", flush=True)
            stop.set()
            for thread in threads:
                thread.join(CALL_TIMEOUT + TAKEOVER_LIMIT + HANG_SLACK)
            stuck = sum(thread.is_alive() for thread in threads)
            gc.collect()  # (read views hold their slots until collected)
            left = sessions_left(cluster, workers, wait=40.0)
            pids = [p.pid for p in (cluster.broker, cluster.standby_broker, *cluster.workers)]
            segments = segments_left(pids)
            own_segments = len(held_segments(os.getpid()))
        running = [p.pid for p in processes if p.poll() is None]
    print(f"soak with takeovers: {args.seconds:g} s, a takeover every {args.every:g} s, "
          f"pair heartbeat {args.pair_heartbeat:g} s x {args.pair_liveness}, "
          f"{workers} workers, 2 clients (a chain of ops on one device, a mesh of both)")
    print(f"  takeovers survived: {takeovers} (primary killed {killed_roles.count('primary')}, "
          f"backup killed {killed_roles.count('backup')})")
    if pauses.seconds:
        print(f"  each takeover's pause (the chain client's longest wait between answers): p50 "
              f"{statistics.median(pauses.seconds):.2f} s, max {max(pauses.seconds):.2f} s "
              f"(over {len(pauses.seconds)})")
    print(f"  reads done: {tally.calls}, ops run: {tally.ops}; "
          f"the longest call {tally.longest:.2f} s")
    print(f"  typed failures: {dict(tally.typed) or 0}")
    print(f"  wrong results: {len(tally.wrong)} {tally.wrong[:5]}")
    print(f"  calls past their deadline and the takeover bound: {tally.hangs}; "
          f"client threads stuck: {stuck}")
    print(f"  sessions left on the devices: {left}")
    print(f"  segments left: {len(segments)} {segments[:5]}; held by this client: "
          f"{own_segments}")
    print(f"  cluster processes still running after it stopped: {len(running)} {running}")
    ok = not (tally.wrong or tally.hangs or stuck or left or segments or own_segments
              or running)
    print("soak with takeovers: PASS" if ok else "soak with takeovers: FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
