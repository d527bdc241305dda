"""Keeping a local cluster's processes up while it serves (``LocalCluster.watch``).

Rule: a worker that dies is restarted under its name, and with a broker pair (``standby``) a
broker that dies is restarted with its role, at most ``RestartLimit`` times in a window each;
past that it stays down and the others go on serving (for the pair: the watch ends). The watch
blocks until SIGINT or SIGTERM, the (single) broker dies, or nothing is left to serve, and says
which; every death and what is done about it is reported with the end of its log.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import deque
from typing import Any, Callable

from fabric.core.errors import FabricError


class RestartLimit:
    """At most ``count`` restarts in any ``window`` seconds (a supervisor's restart
    intensity), sans I/O: ``allow(now)`` says whether one more may happen now, and counts it."""

    def __init__(self, count: int = 5, window: float = 60.0) -> None:
        self.count = count
        self.window = window
        self._times: deque[float] = deque()

    def allow(self, now: float) -> bool:
        """Whether a restart at ``now`` stays within the limit (if so, it is counted)."""
        while self._times and now - self._times[0] >= self.window:
            self._times.popleft()
        if len(self._times) >= self.count:
            return False
        self._times.append(now)
        return True


def ended_how(returncode: int) -> str:
    """How a child process ended, for a sentence: ``exited with code 1``, or ``was killed by
    SIGKILL (exit code -9)``."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name} (exit code {returncode})"
        except ValueError:
            pass
    return f"exited with code {returncode}"


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)



class Supervision:
    """``LocalCluster``'s watch over its processes (a mixin: the cluster has the processes,
    their names and logs, and starts them)."""

    workers: list[subprocess.Popen]
    broker: subprocess.Popen | None
    standby: bool
    standby_broker: subprocess.Popen | None
    log_tail: Callable[..., str]
    worker_name: Callable[[int], str]
    start_worker: Callable[[int], subprocess.Popen]
    restart_broker: Callable[..., None]
    admin: Callable[..., Any]

    def watch(self, poll: float = 0.2, restarts: int = 5, window: float = 60.0,
              report: Callable[[str], None] = _to_stderr) -> str:
        """Block until SIGINT/SIGTERM, the broker dies or no worker is left; say which.

        A worker that dies is restarted under its name (so its devices keep their indexes),
        at most ``restarts`` times in ``window`` seconds; past that it stays down. Each
        death, and what is done about it, goes to ``report`` with the end of its log; and
        once a restarted worker has registered again, so does that. With ``standby``, a
        broker of the pair that dies is restarted likewise (it comes back passive, the other
        serving meanwhile); both dead at once, or one past its restarts, end the watch."""
        limits = [RestartLimit(restarts, window) for _ in self.workers]
        broker_limits = {name: RestartLimit(restarts, window)
                         for name in ("broker", "standby-broker")}
        down: set[int] = set()
        restarted: dict[int, float] = {}  # not yet registered again: when each restarted

        def tend_workers() -> str | None:
            if self.standby:
                ended = self._tend_pair(broker_limits, report)
                if ended is not None:
                    return ended
            for i, proc in enumerate(self.workers):
                if i in down or proc.poll() is None:
                    continue
                name = self.worker_name(i)
                death = (f"{name} {ended_how(proc.returncode)} "
                         f"({self.log_tail(name, 3, errors_first=True) or 'no log'})")
                if limits[i].allow(time.monotonic()):
                    report(f"{death}: restarting it")
                    self.start_worker(i)
                    restarted[i] = time.monotonic()
                    continue
                down.add(i)
                report(f"{death}: it was restarted {restarts} times in {window:g} s, so it "
                       "stays down; the other workers go on serving")
                if len(down) == len(self.workers):
                    return "every worker stays down after restarting too often"
            if restarted:
                self._report_registered_again(restarted, report)
            return None
        return self._watch_until(tend_workers, poll)

    def _tend_pair(self, limits: dict[str, RestartLimit],
                   report: Callable[[str], None]) -> str | None:
        """Restart a dead broker of the pair (``limits``: each one's, by log name); the
        reason to stop when both are dead or one died too often, else None."""
        dead = [name for name, proc in (("broker", self.broker),
                                        ("standby-broker", self.standby_broker))
                if proc is not None and proc.poll() is not None]
        if len(dead) == 2:
            return "both brokers of the pair ended: " + self.log_tail("broker", 3)
        for name in dead:
            proc = self.broker if name == "broker" else self.standby_broker
            death = (f"the {name.replace('-', ' ')} {ended_how(proc.returncode)} "
                     f"({self.log_tail(name, 3, errors_first=True) or 'no log'})")
            if not limits[name].allow(time.monotonic()):
                return f"{death}, and was restarted too often"
            report(f"{death}: the other broker serves; restarting it")
            self.restart_broker(standby=name == "standby-broker")
        return None

    def _report_registered_again(self, restarted: dict[int, float],
                                 report: Callable[[str], None]) -> None:
        """Report each worker of ``restarted`` (index: when) that registered since, and
        forget it; a broker that does not answer now is asked again at the next look."""
        try:
            with self.admin(timeout=2.0) as admin:
                registered = {row["name"]: row["registered_ago"] for row in admin.workers()}
        except FabricError:
            return
        now = time.monotonic()
        for i, at in list(restarted.items()):
            if registered.get(self.worker_name(i), now - at) < now - at:
                del restarted[i]
                report(f"{self.worker_name(i)} registered again, {now - at:.1f} s after its "
                       "restart")

    def _watch_until(self, check: Callable[[], str | None], poll: float) -> str:
        """Block until SIGINT/SIGTERM, the broker dies, or ``check`` (called every ``poll``
        seconds) says why to stop; say which."""
        stopping: list[str] = []
        previous = {sig: signal.signal(sig, lambda n, _: stopping.append(signal.Signals(n).name))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not stopping:
                if (not self.standby and self.broker is not None
                        and self.broker.poll() is not None):
                    return (f"broker {ended_how(self.broker.returncode)}: "
                            + self.log_tail("broker", 3))
                reason = check()
                if reason is not None:
                    return reason
                time.sleep(poll)
            return f"stopped by {stopping[0]}"
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
