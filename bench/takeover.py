"""Takeover time of a broker pair: from SIGKILL of the active broker to the first answered read
through the other.

    python bench/takeover.py --rounds 20
    python bench/takeover.py --rounds 20 --resume   # the same session, resumed each time

One pair (``LocalCluster(standby=True)``, one worker) serves throughout: each round a client
reads through the active broker, the active broker is SIGKILLed, and the client (through the
connection file, which names both) opens a new session and reads until one read is answered;
the killed broker is then started again with its role, and waits passive for the next round.
Printed: each takeover's seconds, p50 and max, and the max's ratio to the issue's limit (two
pair heartbeats plus one second, on loopback); the read's answer must be right every time.
With ``--resume`` one session stays open throughout: each round times its first read after
the SIGKILL, answered once the other broker has resumed it (``fabric.transport.takeover``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fabric  # noqa: E402
from fabric.client.admin import pair_roles  # noqa: E402

DATA = np.arange(1000.0)
WANT = float((DATA * 2).sum())


def read_once(path: str, timeout: float) -> float:
    """A new session through the connection file, one upload, one op and one read."""
    with fabric.connect(connection_file=path, timeout=timeout) as session:
        return float((session.asarray(DATA) * 2).sum())


def read_resumed(session: fabric.Session, data: fabric.Tensor) -> float:
    """One op and one read on a session that stays open across the takeovers."""
    return float((data * 2).sum())


def active_one(cluster: fabric.LocalCluster) -> str:
    """"primary" or "backup": which broker serves now."""
    for row in pair_roles(cluster.brokers, token=cluster.admin_token):
        if row.get("pair") and row["pair"]["state"] == "active":
            return row["pair"]["role"]
    raise RuntimeError("no broker of the pair is active")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pair-heartbeat", type=float, default=1.0)
    parser.add_argument("--pair-liveness", type=int, default=2)
    parser.add_argument("--heartbeat", type=float, default=1.0, help="workers' and brokers'")
    parser.add_argument("--resume", action="store_true",
                        help="time the first read of a session resumed across the takeover")
    args = parser.parse_args()
    limit = 2 * args.pair_heartbeat + 1.0
    times: list[float] = []
    with tempfile.TemporaryDirectory() as folder, fabric.LocalCluster(
            workers=1, standby=True, heartbeat=args.heartbeat, broker_args=(
                "--pair-heartbeat", str(args.pair_heartbeat),
                "--pair-liveness", str(args.pair_liveness))) as cluster:
        path = cluster.write_connection_file(os.path.join(folder, "cluster.json"))
        session = fabric.connect(connection_file=path, timeout=30) if args.resume else None
        data = session.asarray(DATA) if session is not None else None
        for round_ in range(args.rounds):
            assert (read_once(path, 10) if session is None
                    else read_resumed(session, data)) == WANT
            role = active_one(cluster)
            victim = cluster.broker if role == "primary" else cluster.standby_broker
            killed = time.monotonic()
            victim.send_signal(signal.SIGKILL)
            victim.wait(5)
            while session is None:
                try:
                    answer = read_once(path, 30)
                    break
                except fabric.FabricError:  # (a new session's typed refusals until it serves)
                    continue
            else:
                answer = read_resumed(session, data)  # (the takeover runs inside this read)
            took = time.monotonic() - killed
            assert answer == WANT, answer
            times.append(took)
            print(f"round {round_ + 1}: {role} killed, "
                  f"{'the resumed session' if session else 'a new session'}'s read answered "
                  f"through the other after {took:.2f} s", flush=True)
            cluster.restart_broker(standby=role == "backup")
            time.sleep(2 * args.pair_heartbeat)  # (it hears the active one and goes passive)
        if session is not None:
            session.close()
    p50, worst = statistics.median(times), max(times)
    print(f"takeovers: {len(times)}; p50 {p50:.2f} s, max {worst:.2f} s; limit (2 pair "
          f"heartbeats + 1 s) {limit:.2f} s; max/limit {worst / limit:.2f}")


if __name__ == "__main__":
    main()
