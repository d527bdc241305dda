"""``fabric admin``: the broker's admin commands, each one call of ``fabric.Admin``, printed as
a table or as JSON.

Rule: a thin shell: the options name the broker and the token, ``fabric.Admin`` does the rest,
and every failure ends with one line on stderr and a documented exit code.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Callable, Iterator

import click

from fabric.cli.options import token_options, with_options
from fabric.core.config import resolve_secret
from fabric.core.errors import (
    AuthenticationError,
    ConfigError,
    ConnectError,
    EncryptionError,
    FabricError,
    RequestTimeout,
    SessionLost,
    VersionMismatch,
)

ADMIN_EXIT_CODES = """\b
Exit codes:
  0  done
  1  refused or not found: not the admin token or CURVE key, no such session or worker
  2  usage: bad arguments, no address or admin token (a client's connection file
     holds none), unusable file
  3  cannot reach the broker: nothing listening, not a fabric broker, no answer
"""
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON (for scripts) instead of a table.")


def admin_exit_code(error: FabricError) -> int:
    """The documented exit code for an error from ``fabric.Admin``."""
    if isinstance(error, ConfigError):
        return 2
    if isinstance(error, (AuthenticationError, EncryptionError, VersionMismatch)):  # refused
        return 1
    if isinstance(error, (ConnectError, RequestTimeout, SessionLost)):
        return 3
    return 1


@contextlib.contextmanager
def open_admin(options: dict[str, Any], command: str = "fabric admin") -> Iterator[Any]:
    """A ``fabric.Admin`` opened from ``admin_target_options``' values; a FabricError inside
    ends the command with one line on stderr and its documented exit code."""
    from fabric.client.admin import ADMIN_TOKEN_ENV, Admin

    try:
        token = resolve_secret(options["token"], options["token_file"], ADMIN_TOKEN_ENV)
        with Admin(options["address"], token=token, admin_file=options["admin_file"],
                   connection_file=options["connection_file"], timeout=options["timeout"],
                   curve=options["curve"]) as admin:
            yield admin
    except FabricError as exc:
        click.echo(f"{command}: {' '.join(str(exc).splitlines())}", err=True)
        sys.exit(admin_exit_code(exc))


def _admin_call(options: dict[str, Any], call: Callable[[Any], Any], as_json: bool,
                render: Callable[[Any, str], None]) -> None:
    """Open a ``fabric.Admin`` from the group's options, make one call, print its result."""
    with open_admin(options) as admin:
        result = call(admin)
        address = admin.address
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        render(result, address)


def duration_text(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def size_text(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, Callable[[dict], Any]]],
           empty: str) -> None:
    if not rows:
        click.echo(empty)
        return
    cells = [[title for title, _ in columns]]
    cells += [[str(get(row)) for _, get in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())


_TRAFFIC = [("MESSAGES", lambda r: r["messages"]), ("BYTES", lambda r: size_text(r["bytes"])),
            ("SUBMITS", lambda r: r["submits"]), ("ERRORS", lambda r: r["errors"])]


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items())) or "none"


def _print_status(status: dict[str, Any], address: str) -> None:
    traffic, rates = status["traffic"], status["rates"]
    draining = status["workers_draining"]
    lines = [
        ("server", f"{status['server']} (protocol {status['protocol_version']})"),
        ("address", address),
        ("uptime", duration_text(status["uptime"])),
        ("workers", f"{status['workers']}"
                    + (f" ({len(draining)} draining: {', '.join(draining)})" if draining else "")),
        ("devices", f"{status['devices_online']} online of {status['devices_total']}"),
        ("sessions", f"{status['sessions']} ({_counts(status['sessions_by_state'])}), "
                     f"{status['sessions_ended']} ended"),
        ("traffic", f"{traffic['messages']} messages, {size_text(traffic['bytes'])}, "
                    f"{traffic['submits']} submits, {traffic['errors']} errors"),
        ("rates", f"{rates['messages_per_s']:.1f} messages/s, "
                  f"{size_text(rates['bytes_per_s'])}/s since start"),
        ("rejects", _counts(status["rejects"])),
        ("protocol errors", _counts(status["protocol_errors"])),
    ]
    queues = status.get("queues")
    if queues:  # flow control: messages waiting for peers that are not reading
        lines.append(("queues", f"{queues['parked_messages']} message(s) waiting for "
                                f"{queues['peers_waiting']} peer(s)"
                                + (", clients paused" if queues["frontend_paused"] else "")))
    pair = status.get("pair")
    if pair:  # one broker of a pair (fabric broker --peer)
        lines.append(("pair", pair_text(pair)))
    for name, value in lines:
        click.echo(f"{name + ':':<17}{value}")


def pair_text(pair: dict[str, Any]) -> str:
    """A pair broker's role and state in words (``status``'s and ``ping``'s ``pair``)."""
    peer = pair["peer_state"]
    heard = (f"peer {peer}, heard {pair['peer_silent_for']:.1f} s ago" if peer
             else "peer never heard")
    return (f"{pair['role']}, {pair['state']} for {duration_text(pair['in_state_for'])} "
            f"(term {pair['term']}, {pair['takeovers']} takeover(s); {heard})")


def _lost_when(row: dict[str, Any]) -> str:
    if row["lost_ago"] is None:
        return "before the broker started"
    return f"{row['lost_at']} ({duration_text(row['lost_ago'])} ago)"


def _print_workers(workers: list[dict[str, Any]], address: str) -> None:
    lost = [row for row in workers if not row["online"]]
    _table([row for row in workers if row["online"]], [
        ("NAME", lambda r: r["name"]), ("HOST", lambda r: r["host"] or "-"),
        ("ADDRESS", lambda r: r["address"] or "-"), ("BACKEND", lambda r: r["backend"]),
        # (a count and the indexes apart: under one column, device 0 read as "no devices")
        ("DEVICES", lambda r: len(r["devices"])),
        ("INDEXES", lambda r: ",".join(map(str, r["devices"])) or "-"),
        ("SESSIONS", lambda r: r["sessions"]),
        ("DRAINING", lambda r: "yes" if r["draining"] else "no"),
        ("REGISTERED", lambda r: duration_text(r["registered_ago"]) + " ago"),
        ("LAST SEEN", lambda r: duration_text(r["last_seen_ago"]) + " ago"), *_TRAFFIC],
        f"no workers are connected to {address}")
    if lost:
        click.echo("\nlost workers (offline; their device indexes are kept for them):")
        _table(lost, [
            ("NAME", lambda r: r["name"]), ("HOST", lambda r: r["host"] or "-"),
            ("ADDRESS", lambda r: r["address"] or "-"),
            ("INDEXES", lambda r: ",".join(map(str, r["devices"]))),
            ("LAST HEARD (UTC)", _lost_when)], "")


def _print_devices(devices: list[dict[str, Any]], address: str) -> None:
    _table(devices, [
        ("INDEX", lambda r: r["index"]), ("WORKER", lambda r: r["worker"]),
        ("LOCAL", lambda r: r["local"]), ("BACKEND", lambda r: r["backend"] or "-"),
        ("ONLINE", lambda r: "yes" if r["online"] else "no"),
        ("DRAINING", lambda r: "yes" if r["draining"] else "no"),
        ("SESSIONS", lambda r: r["sessions"]), *_TRAFFIC],
        f"no devices have registered with {address}")


def _print_sessions(sessions: list[dict[str, Any]], address: str) -> None:
    _table(sessions, [
        ("ID", lambda r: r["id"]), ("CLIENT", lambda r: r["client"]),
        ("DEVICE", lambda r: r["device"]), ("WORKER", lambda r: r["worker"]),
        ("STATE", lambda r: r["state"]), ("AGE", lambda r: duration_text(r["created_ago"])),
        ("IDLE", lambda r: duration_text(r["last_seen_ago"])), *_TRAFFIC],
        f"no sessions are open on {address}")


# Where the broker is and the admin token: ``fabric admin``'s options, and ``fabric top``'s.
admin_target_options = [
    click.option("--address", default=None, metavar="ADDRESS",
                 help="The broker's frontend, like tcp://host:5555 [default: the admin "
                      "file's]."),
    click.option("--admin-file", type=click.Path(dir_okay=False), default=None,
                 help="The admin file fabric cluster up wrote for operators [default: "
                      "$FABRIC_ADMIN_FILE, else $FABRIC_CONNECTION_FILE, else "
                      "~/.config/fabric/cluster-admin.json if it exists]."),
    click.option("--connection-file", type=click.Path(dir_okay=False), default=None,
                 help="Instead of --admin-file: an older file that holds every token, or a "
                      "client's connection file for its address and keys (it holds no admin "
                      "token: give that with --token-file or $FABRIC_ADMIN_TOKEN)."),
    token_options("", "FABRIC_ADMIN_TOKEN", "admin token"),
    click.option("--timeout", type=float, default=5.0, show_default=True,
                 help="Seconds to wait for the broker's answer."),
    click.option("--curve", type=click.Path(file_okay=False), default=None, metavar="KEYDIR",
                 help="Encrypt with CURVE using KEYDIR/client.key_secret and KEYDIR/broker.key "
                      "[default: the admin file's keys, if any]."),
]


@click.group(epilog=ADMIN_EXIT_CODES)
@with_options(admin_target_options)
@click.pass_context
def admin(ctx: click.Context, address: str | None, admin_file: str | None,
          connection_file: str | None, token: str | None, token_file: str | None,
          timeout: float, curve: str | None) -> None:
    """Inspect and steer a running broker with the admin token (a client token is refused).

    The address and token come from the options, else from the admin file fabric cluster up
    wrote; the token from --token-file, $FABRIC_ADMIN_TOKEN or --token comes first. Tokens are
    never printed.
    """
    ctx.obj = {"address": address, "admin_file": admin_file, "connection_file": connection_file,
               "token": token, "token_file": token_file, "timeout": timeout, "curve": curve}


def _report_command(name: str, short_help: str, help_text: str,
                    printer: Callable[[Any, str], None],
                    arguments: dict[str, Any] | None = None) -> None:
    """Register ``fabric admin NAME``: one read-only call of fabric.Admin (with
    ``arguments``), as a table or JSON."""
    @admin.command(name, epilog=ADMIN_EXIT_CODES, short_help=short_help, help=help_text)
    @json_option
    @click.pass_obj
    def report(options: dict[str, Any], as_json: bool) -> None:
        _admin_call(options, lambda a: getattr(a, name)(**(arguments or {})), as_json,
                    printer)


for _report in [
    ("status", "Broker summary.",
     "Broker identity, uptime, workers, devices, sessions, traffic rates, rejections.",
     _print_status),
    ("workers", "List workers.",
     "Each connected worker: host, address as the broker sees it, backend, devices, "
     "sessions, draining, ages and traffic; then each lost one (offline, its device indexes "
     "kept): host, address, indexes and when it was last heard from. With --json, one list: "
     "online true or false, lost_ago (s) and lost_at (UTC) for the lost.", _print_workers,
     {"lost": True}),
    ("devices", "List devices.",
     "Each device, online or not: worker, backend, sessions and traffic.", _print_devices),
    ("sessions", "List sessions.",
     "Each session: id, client, device, state, ages and traffic.\n\nSUBMITS counts op "
     "batches: the broker never decodes the ops themselves.", _print_sessions),
]:
    _report_command(*_report)


def _session_argument(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from fabric.client.admin import parse_session_id

    try:
        return parse_session_id(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@admin.command("close-session", epilog=ADMIN_EXIT_CODES, short_help="Close a session.")
@click.argument("session_id", metavar="ID", callback=_session_argument)
@json_option
@click.pass_obj
def admin_close_session(options: dict[str, Any], session_id: int, as_json: bool) -> None:
    """Close session ID (hex, as sessions shows it); its client's next call fails."""
    _admin_call(options, lambda a: a.close_session(session_id), as_json,
                lambda r, _: click.echo(f"closed session {r['session']}"))


@admin.command("drain", epilog=ADMIN_EXIT_CODES,
               short_help="Stop new sessions on a worker.")
@click.argument("worker")
@json_option
@click.pass_obj
def admin_drain(options: dict[str, Any], worker: str, as_json: bool) -> None:
    """Refuse new sessions on WORKER's devices; its open sessions go on."""
    _admin_call(options, lambda a: a.drain(worker), as_json, lambda r, _: click.echo(
        f"{r['worker']} is draining: no new sessions; its {r['sessions']} open session(s) "
        "go on"))


@admin.command("undrain", epilog=ADMIN_EXIT_CODES,
               short_help="Let a drained worker take sessions.")
@click.argument("worker")
@json_option
@click.pass_obj
def admin_undrain(options: dict[str, Any], worker: str, as_json: bool) -> None:
    """Let WORKER take new sessions again."""
    _admin_call(options, lambda a: a.undrain(worker), as_json,
                lambda r, _: click.echo(f"{r['worker']} takes new sessions again"))


@admin.command("forget", epilog=ADMIN_EXIT_CODES,
               short_help="Drop an offline worker's device indexes.")
@click.argument("worker")
@json_option
@click.pass_obj
def admin_forget(options: dict[str, Any], worker: str, as_json: bool) -> None:
    """Drop offline WORKER's name and device indexes; they are never given again (refused
    while it is connected)."""
    _admin_call(options, lambda a: a.forget(worker), as_json, lambda r, _: click.echo(
        f"{r['worker']} forgotten: device index(es) {', '.join(map(str, r['indexes']))} "
        "retired"))


@admin.command("pair", epilog=ADMIN_EXIT_CODES, short_help="Each broker's role in a pair.")
@json_option
@click.pass_obj
def admin_pair(options: dict[str, Any], as_json: bool) -> None:
    """Each broker of a pair (--address A,B, or the admin file's brokers): its role (primary
    or backup) and state (active serves; passive refuses and sends clients to the other), or
    why it could not be asked. Exits 3 when no broker answered."""
    from fabric.client.admin import ADMIN_TOKEN_ENV, pair_roles

    try:
        rows = pair_roles(options["address"], token=resolve_secret(
            options["token"], options["token_file"], ADMIN_TOKEN_ENV),
            admin_file=options["admin_file"], connection_file=options["connection_file"],
            timeout=options["timeout"], curve=options["curve"])
    except FabricError as exc:
        click.echo(f"fabric admin: {' '.join(str(exc).splitlines())}", err=True)
        sys.exit(admin_exit_code(exc))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    for row in [] if as_json else rows:
        said = (f"{row['error']['code']}: {row['error']['message']}" if "error" in row
                else pair_text(row["pair"]) if row["pair"] else "a single broker (no --peer)")
        click.echo(f"{row['address']:<28} {said}")
    if all("error" in row for row in rows):
        sys.exit(3)


@admin.command("shutdown", epilog=ADMIN_EXIT_CODES, short_help="Stop the broker.")
@json_option
@click.pass_obj
def admin_shutdown(options: dict[str, Any], as_json: bool) -> None:
    """Stop the broker: it answers, tells every client its session ends, and exits."""
    _admin_call(options, lambda a: a.shutdown(), as_json, lambda r, address: click.echo(
        f"broker at {address} is shutting down; {r['sessions']} session(s) told"))
