"""``fabric top``: a live terminal view of a cluster, drawn with rich from ``fabric.client.top``.

Rule: a thin shell: it finds the broker and the admin token as ``fabric admin`` does (its
options and ``open_admin``), takes a snapshot every interval, and draws ``fabric.client.top.view``
of the last two; failures end as ``fabric admin``'s do, with its exit codes.
"""

from __future__ import annotations

import json
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

import click

from fabric.cli.admin_commands import (ADMIN_EXIT_CODES, admin_target_options, duration_text,
                                       open_admin, size_text)
from fabric.cli.options import with_options
from fabric.client.top import snapshot, view

_STOP_CHECK = 0.05  # seconds between looks at whether Ctrl-C came, while a frame is waited for

if TYPE_CHECKING:  # rich is imported when drawing: every other fabric command starts without it
    from rich.console import Group
    from rich.table import Table

Column = tuple[str, Callable[[dict[str, Any]], Any]]


def _rate(row: dict[str, Any], count: str) -> str:
    value = row[f"{count}_per_s"]
    if value is None:  # a device its worker has not reported yet
        return "-"
    return f"{size_text(value)}/s" if count.endswith("bytes") else f"{value:,.1f}/s"


def _table(title: str, rows: list[dict[str, Any]], columns: list[Column], empty: str) -> Table:
    from rich import box
    from rich.table import Table

    # (no rules between columns, nor edges: most tables fit in 80 columns; ``_tables`` wraps)
    table = Table(title=title, title_justify="left", expand=False, box=box.SIMPLE_HEAD,
                  show_edge=False, pad_edge=False, collapse_padding=True)
    for name, _ in columns:
        table.add_column(name, no_wrap=True,
                         justify="left" if name in ("WORKER", "ID", "STATE") else "right")
    for row in rows:
        table.add_row(*(str(get(row)) for _, get in columns))
    if not rows:
        table.caption = empty
    return table


def _tables(title: str, rows: list[dict[str, Any]], columns: list[Column], empty: str,
            width: int) -> list[Table]:
    """The table, or where it is wider than ``width`` columns of text, the tables it wraps
    into: each with the first column (the rows' key) and as many of the next as fit."""
    from rich.console import Console

    measure = Console(width=1 << 16).measure  # (a table's natural width, whatever the screen)
    parts = [columns[:1]]
    for column in columns[1:]:
        wider = [*parts[-1], column]
        if len(parts[-1]) > 1 and measure(_table(title, rows, wider, empty)).maximum > width:
            parts.append([columns[0], column])
        else:
            parts[-1] = wider
    return [_table(title if i == 0 else "", rows, part, empty) for i, part in enumerate(parts)]


def render(frame: dict[str, Any], width: int) -> Group:
    """One frame of the view, as rich renderables ``width`` columns wide at most (a table
    wider wraps into several)."""
    from rich.console import Group
    from rich.text import Text

    broker = frame["broker"]
    queues = broker["queues"]
    header = Text.assemble(
        ("fabric top ", "bold"), f"{frame['address']}  up {duration_text(broker['uptime'])}  ",
        f"workers {broker['workers']}  devices {broker['devices_online']}/"
        f"{broker['devices_total']} online  sessions {broker['sessions']} "
        f"({broker['sessions_ended']} ended)  rejects {broker['rejects']}\n",
        ("broker ", "bold"), f"{_rate(broker, 'messages')} messages  "
        f"{_rate(broker, 'bytes')}  {_rate(broker, 'submits')} submits"
        f"  parked {queues['parked_messages']}"
        + ("  CLIENTS PAUSED" if queues["frontend_paused"] else ""))
    workers = _tables("workers", frame["workers"], [
        ("WORKER", lambda r: r["name"]), ("BACKEND", lambda r: r["backend"]),
        ("DEVICES", lambda r: len(r["devices"])), ("SESSIONS", lambda r: r["sessions"]),
        ("STATE", lambda r: "draining" if r["draining"] else "serving"),
        ("SEEN", lambda r: duration_text(r["last_seen_ago"])),
        ("SUBMITS", lambda r: _rate(r, "submits")), ("BYTES", lambda r: _rate(r, "bytes")),
        ("LINKS OUT", lambda r: _rate(r, "link_sent_bytes")),
        ("LINKS IN", lambda r: _rate(r, "link_received_bytes"))],
        "no workers are connected", width)
    devices = _tables("devices", frame["devices"], [
        ("INDEX", lambda r: r["index"]), ("WORKER", lambda r: r["worker"]),
        ("STATE", lambda r: ("draining" if r["draining"] else "online") if r["online"]
         else "offline"),
        ("SESSIONS", lambda r: r["sessions"]),
        ("MEMORY", lambda r: "-" if r["resident_bytes"] is None
         else size_text(r["resident_bytes"])),
        ("OPS", lambda r: _rate(r, "ops")), ("SUBMITS", lambda r: _rate(r, "submits")),
        ("MESSAGES", lambda r: _rate(r, "messages")), ("BYTES", lambda r: _rate(r, "bytes")),
        ("SHM IN", lambda r: _rate(r, "shm_in_bytes")),
        ("SHM OUT", lambda r: _rate(r, "shm_out_bytes"))],
        "no devices have registered", width)
    sessions = _tables("sessions", frame["sessions"], [
        ("ID", lambda r: r["id"]), ("DEVICE", lambda r: r["device"]),
        ("STATE", lambda r: r["state"]), ("AGE", lambda r: duration_text(r["created_ago"])),
        ("IDLE", lambda r: duration_text(r["last_seen_ago"])),
        ("SUBMITS", lambda r: r["submits"]), ("BYTES", lambda r: size_text(r["bytes"])),
        ("RATE", lambda r: _rate(r, "submits"))],
        "no sessions are open", width)
    return Group(header, *workers, *devices, *sessions)


@click.command(epilog=ADMIN_EXIT_CODES)
@with_options(admin_target_options)
@click.option("--once", is_flag=True, help="Print one frame (rates over one interval) and "
              "exit, for scripts.")
@click.option("--json", "as_json", is_flag=True, help="With --once: print the frame's data "
              "as JSON instead.")
@click.option("--interval", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Seconds between frames (and over which rates are taken).")
def top(once: bool, as_json: bool, interval: float, **options: Any) -> None:
    """A live view of a cluster's workers, devices, sessions and broker rates, refreshed every
    interval until Ctrl-C. Needs the admin token; finds the broker as fabric admin does.

    Rates are differences of two snapshots over the interval. SUBMITS counts batches of
    ops (the broker never decodes the ops); a device's MEMORY (what its sessions hold), OPS
    and SHM IN/OUT (bytes through shared memory with clients on its host), and a worker's
    LINKS OUT/IN (bytes over direct links), are what the worker reports in its heartbeats
    ("-" until it has): they go past the broker, whose BYTES do not count them. Tables
    wider than the terminal wrap, their first column repeated. Written to a file or a pipe,
    each frame follows the last.
    """
    from rich.console import Console
    from rich.live import Live

    if as_json and not once:
        raise click.UsageError("--json prints one frame: give --once with it.")
    console = Console()
    with open_admin(options, "fabric top") as admin:
        if once:
            frame = next(_frames(admin, interval, []))
            if as_json:
                click.echo(json.dumps(frame, indent=2))
            else:
                console.print(render(frame, console.width))
            return
        # Ctrl-C ends the view between frames: its handler only says so, as an exception
        # raised where Python cannot pass it on (a __del__ it happens to run in) would be
        # lost, and the view would go on (seen in CI: a view not ended 30 s after SIGINT)
        stopped: list[int] = []
        previous = signal.signal(signal.SIGINT, lambda signum, _: stopped.append(signum))
        try:
            frames = _frames(admin, interval, stopped)
            if not console.is_terminal:  # (a live view would draw nothing there)
                for frame in frames:
                    console.print(render(frame, console.width), "")
                    console.file.flush()
                return
            with Live(console=console, auto_refresh=False) as live:
                for frame in frames:
                    live.update(render(frame, console.width), refresh=True)
        finally:
            signal.signal(signal.SIGINT, previous)


def _frames(admin: Any, interval: float, stopped: list[int]) -> Iterator[dict[str, Any]]:
    """The view's frames, one an ``interval`` (the first after one: a rate needs two
    snapshots), until ``stopped`` holds a signal."""
    after = snapshot(admin)
    while True:
        due = after["at"] + interval
        while not stopped and time.monotonic() < due:  # (a signal ends the wait early)
            time.sleep(min(_STOP_CHECK, max(0.0, due - time.monotonic())))
        if stopped:
            return
        before, after = after, snapshot(admin)
        yield view(before, after)
