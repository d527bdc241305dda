"""The ``fabric`` command: a thin shell over the library (every command is a Python call)."""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable

import click
import zmq

from .config import resolve_secret
from .errors import (
    AuthenticationError,
    ConfigError,
    ConnectError,
    DeviceNotHostable,
    EncryptionError,
    FabricError,
    RequestTimeout,
    SessionLost,
    VersionMismatch,
)
from .security import CurveClient, CurveServer, generate_keys


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


def token_options(role: str, env: str, what: str | None = None,
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--{role}token`` and ``--{role}token-file`` options, also read from ``env``;
    ``what`` names the token in the help [default: the role's token]."""
    what = what or f"{role or 'client '}token"

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option(
            f"--{role}token-file", type=click.Path(dir_okay=False),
            help=f"File holding the {what} (mode 0600). Takes precedence "
                 f"over ${env} and --{role}token.")(command)
        return click.option(
            f"--{role}token", metavar="TOKEN",
            help=f"The {what} itself (visible in ps; prefer the file or "
                 f"${env}).")(command)
    return decorate


def _secret(value: str | None, file: str | None, env: str, what: str) -> str:
    try:
        secret = resolve_secret(value, file, env)
    except FabricError as exc:
        raise click.UsageError(exc.message) from None
    if not secret:
        raise click.UsageError(f"No {what} given: use --{what.replace(' ', '-')}-file, "
                               f"${env} or --{what.replace(' ', '-')}.")
    return secret


timing = [
    click.option("--heartbeat", type=float, default=1.0, show_default=True,
                 help="Seconds between heartbeats between broker and workers."),
    click.option("--liveness", type=int, default=3, show_default=True,
                 help="Heartbeats missed before the peer is declared lost."),
    click.option("--log-level", default="info", show_default=True,
                 type=click.Choice(["debug", "info", "warning", "error"]),
                 help="How much to log to stderr (tokens are never logged)."),
]


def _usage(call: Callable[[], Any]) -> Any:
    """``call()``, with a ConfigError (a bad key file, say) turned into a usage error."""
    try:
        return call()
    except FabricError as exc:
        raise click.UsageError(exc.message) from None


def curve_server_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The broker's CURVE options, handed to ``command`` as one ``curve`` (a CurveServer or
    None). Put it right above the function, below the other options."""

    @functools.wraps(command)
    def wrapper(*args: Any, curve_dir: str | None, curve_secret_key: str | None,
                curve_allow: str | None, curve_allow_clients: str | None,
                curve_allow_workers: str | None, **kwargs: Any) -> Any:
        allow = (curve_allow, curve_allow_clients, curve_allow_workers)
        if curve_dir and curve_secret_key:
            raise click.UsageError("Give --curve or --curve-secret-key, not both.")
        if not (curve_dir or curve_secret_key):
            if any(allow):
                raise click.UsageError("--curve-allow needs --curve-secret-key (or --curve).")
            return command(*args, curve=None, **kwargs)
        keydir = Path(curve_dir) if curve_dir else None
        clients = curve_allow_clients or curve_allow or (keydir and keydir / "clients")
        workers = curve_allow_workers or curve_allow or (keydir and keydir / "workers")
        curve = _usage(lambda: CurveServer.from_files(
            curve_secret_key or keydir / "broker.key_secret", allow_clients=clients or None,
            allow_workers=workers or None))
        return command(*args, curve=curve, **kwargs)

    directory = click.Path(file_okay=False)
    for option in reversed([
        click.option("--curve", "curve_dir", type=directory, metavar="KEYDIR",
                     help="Encrypt both sockets with CURVE using the keys fabric keys generate "
                          "wrote: KEYDIR/broker.key_secret, and only the client keys in "
                          "KEYDIR/clients and worker keys in KEYDIR/workers get in."),
        click.option("--curve-secret-key", type=click.Path(dir_okay=False), metavar="FILE",
                     help="The broker's CURVE secret key file (mode 0600), instead of --curve. "
                          "Without an allow-list any key gets in: encryption only."),
        click.option("--curve-allow", type=directory, metavar="DIR",
                     help="Public keys (*.key files) accepted from clients and workers."),
        click.option("--curve-allow-clients", type=directory, metavar="DIR",
                     help="Public keys accepted from clients and admins (overrides the above)."),
        click.option("--curve-allow-workers", type=directory, metavar="DIR",
                     help="Public keys accepted from workers (overrides the above)."),
    ]):
        wrapper = option(wrapper)
    return wrapper


def curve_client_options(role: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--curve``, ``--curve-secret-key`` and ``--broker-public-key``, handed to the command
    as one ``curve`` (a CurveClient or None); ``role`` names the pair ``--curve`` uses."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, curve_dir: str | None, curve_secret_key: str | None,
                    broker_public_key: str | None, **kwargs: Any) -> Any:
            if curve_dir and (curve_secret_key or broker_public_key):
                raise click.UsageError("Give --curve, or --curve-secret-key with "
                                       "--broker-public-key, not both.")
            if bool(curve_secret_key) != bool(broker_public_key):
                raise click.UsageError("--curve-secret-key and --broker-public-key go together.")
            curve = None
            if curve_dir:
                curve = _usage(lambda: CurveClient.from_dir(curve_dir, role))
            elif curve_secret_key:
                curve = _usage(lambda: CurveClient.from_files(curve_secret_key,
                                                              broker_public_key))
            return command(*args, curve=curve, **kwargs)

        for option in reversed([
            click.option("--curve", "curve_dir", type=click.Path(file_okay=False),
                         metavar="KEYDIR", help=f"Encrypt with CURVE using the keys fabric keys "
                         f"generate wrote: KEYDIR/{role}.key_secret and KEYDIR/broker.key."),
            click.option("--curve-secret-key", type=click.Path(dir_okay=False), metavar="FILE",
                         help=f"This {role}'s CURVE secret key file (mode 0600), instead of "
                              "--curve."),
            click.option("--broker-public-key", type=click.Path(dir_okay=False),
                         metavar="FILE", help="The broker's CURVE public key file (broker.key)."),
        ]):
            wrapper = option(wrapper)
        return wrapper
    return decorate


def limit_options(role: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The size, queue and session limits of a ``broker`` or ``worker``, handed to the command
    as one dict ``limits`` of keyword arguments (``Limits`` fields for a broker, ``Worker``
    arguments for a worker). Put it right above the function."""
    from .flow import (DEFAULT_HWM, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_MAX_SESSIONS_PER_CLIENT,
                       DEFAULT_MAX_SESSIONS_PER_DEVICE, DEFAULT_PEER_QUEUE)

    count = click.IntRange(min=1)
    options = [
        click.option("--max-message-bytes", type=count, default=DEFAULT_MAX_MESSAGE_BYTES,
                     show_default=True, help="Largest frame (one array) a socket takes "
                     "(MAXMSGSIZE); senders refuse bigger ones with MessageTooLarge."),
        click.option("--hwm", type=count, default=DEFAULT_HWM, show_default=True,
                     help="Messages queued per peer each way on every socket (SNDHWM/RCVHWM)."),
    ]
    if role == "broker":
        options += [
            click.option("--max-sessions-per-client", type=count,
                         default=DEFAULT_MAX_SESSIONS_PER_CLIENT, show_default=True,
                         help="Sessions one client connection may hold; more are refused."),
            click.option("--max-sessions-per-device", type=count,
                         default=DEFAULT_MAX_SESSIONS_PER_DEVICE, show_default=True,
                         help="Sessions one device may serve; more are refused."),
            click.option("--peer-queue", type=count, default=DEFAULT_PEER_QUEUE,
                         show_default=True, help="Messages held for a peer whose queue is "
                         "full: a client that leaves more unread is cut off; a worker that "
                         "does pauses the frontend."),
            click.option("--slow-peer-timeout", type=click.FloatRange(min=0), default=None,
                         help="Seconds a worker's queue may stay full (the frontend unread "
                              "meanwhile) before the worker is declared lost; keep it under "
                              "heartbeat x liveness [default: 2/3 of that]."),
        ]
    names = ["max_message_bytes", "hwm", "max_sessions_per_client", "max_sessions_per_device",
             "peer_queue", "slow_peer_timeout"]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            limits = {name: kwargs.pop(name) for name in names if name in kwargs}
            return command(*args, limits=limits, **kwargs)

        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper
    return decorate


def _with(options: list[Callable[..., Any]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


@click.group()
@click.version_option(package_name="fabric-arrays")
def main() -> None:
    """Fabric: numpy-style arrays on devices served by worker processes behind a broker."""


@main.command()
@click.option("--frontend", default="tcp://127.0.0.1:5555", show_default=True,
              help="Address clients and the admin CLI connect to (tcp://host:port, ipc://path;"
                   " port * picks a free one).")
@click.option("--backend", default="tcp://127.0.0.1:5556", show_default=True,
              help="Address workers connect to.")
@token_options("", "FABRIC_TOKEN")
@token_options("worker-", "FABRIC_WORKER_TOKEN")
@token_options("admin-", "FABRIC_ADMIN_TOKEN")
@click.option("--open-timeout", type=float, default=5.0, show_default=True,
              help="Seconds a worker may take to open a session before the client is refused.")
@click.option("--lease", type=float, default=10.0, show_default=True,
              help="Idle seconds after which the broker checks a client is still connected.")
@click.option("--auth-delay", type=click.FloatRange(min=0), default=0.2, show_default=True,
              help="Seconds before a refused token (client, admin or worker) is answered.")
@_with(timing)
@limit_options("broker")
@curve_server_options
def broker(frontend: str, backend: str, token: str | None, token_file: str | None,
           worker_token: str | None, worker_token_file: str | None, admin_token: str | None,
           admin_token_file: str | None, open_timeout: float, lease: float, heartbeat: float,
           liveness: int, log_level: str, auth_delay: float,
           curve: CurveServer | None, limits: dict[str, Any]) -> None:
    """Run a broker: route clients' sessions to the workers that own their devices.

    Prints one JSON line with the bound addresses when ready; logs go to stderr. Stops
    cleanly on SIGINT or SIGTERM.
    """
    from fabric.broker.model import Limits
    from fabric.broker.server import announce_on_stdout, serve

    _logging(log_level)
    client = _secret(token, token_file, "FABRIC_TOKEN", "token")
    worker = _secret(worker_token, worker_token_file, "FABRIC_WORKER_TOKEN", "worker token")
    admin = resolve_secret(admin_token, admin_token_file, "FABRIC_ADMIN_TOKEN")
    limits = Limits(heartbeat=heartbeat, liveness=liveness, open_timeout=open_timeout,
                    lease=lease, auth_delay=auth_delay, **limits)
    try:
        serve(frontend, backend, client_token=client, worker_token=worker, admin_token=admin,
              limits=limits, announce=announce_on_stdout, curve=curve)
    except zmq.ZMQError as exc:  # binding: the port is taken, or the address is malformed
        raise click.ClickException(f"cannot serve on {frontend} / {backend}: {exc}") from None


@main.command()
@click.option("--broker", "broker_address", default="tcp://127.0.0.1:5556", show_default=True,
              help="The broker's backend address.")
@click.option("--backend", default="numpy", show_default=True,
              help="Backend to host: numpy or numexpr. (capture and remote devices cannot host a "
                   "server and are refused.)")
@click.option("--devices", type=int, default=1, show_default=True,
              help="How many devices this worker hosts.")
@click.option("--name", default=None, help="Worker name, unique in the cluster "
              "[default: worker-HOST-PID].")
@click.option("--memory-limit", type=int, default=None,
              help="Most bytes one session may keep resident on a device; going past it "
                   "fails the op with QuotaExceeded and the worker goes on [default: none].")
@token_options("worker-", "FABRIC_WORKER_TOKEN")
@_with(timing)
@limit_options("worker")
@curve_client_options("worker")
def worker(broker_address: str, backend: str, devices: int, name: str | None,
           memory_limit: int | None, worker_token: str | None, worker_token_file: str | None,
           heartbeat: float, liveness: int, log_level: str,
           curve: CurveClient | None, limits: dict[str, Any]) -> None:
    """Run a worker: host DEVICES devices of BACKEND for the broker at --broker."""
    from fabric.workers.backends import device_class
    from fabric.workers.worker import RegistrationRefused, serve

    _logging(log_level)
    try:
        device_class(backend)  # a backend that can never be hosted is refused before the token
        token = _secret(worker_token, worker_token_file, "FABRIC_WORKER_TOKEN", "worker token")
        serve(broker_address, token=token, backend=backend, devices=devices,
              name=name or f"worker-{socket.gethostname()}-{os.getpid()}",
              heartbeat=heartbeat, liveness=liveness, memory_limit=memory_limit, curve=curve,
              **limits)
    except DeviceNotHostable as exc:
        click.echo(exc.message, err=True)
        sys.exit(2)
    except (RegistrationRefused, ValueError) as exc:
        click.echo(f"fabric worker: {exc}", err=True)
        sys.exit(1)


@main.group()
def cluster() -> None:
    """Run a broker and workers on this machine as one unit."""


@cluster.command("up")
@click.option("--workers", type=int, default=2, show_default=True,
              help="How many worker processes to start.")
@click.option("--backend", default="numpy", show_default=True, help="Device backend.")
@click.option("--devices-per-worker", type=int, default=1, show_default=True)
@click.option("--frontend", default="tcp://127.0.0.1:5555", show_default=True,
              help="Address for clients and admin (port * picks a free one).")
@click.option("--backend-address", default="tcp://127.0.0.1:5556", show_default=True,
              help="Address the workers connect to.")
@click.option("--connection-file", type=click.Path(dir_okay=False), default=None,
              help="Where to write addresses and tokens (mode 0600) "
                   "[default: ~/.config/fabric/cluster.json].")
@click.option("--memory-limit", type=int, default=None,
              help="Per-session resident byte limit on each device.")
@click.option("--curve", type=click.Path(file_okay=False), default=None, metavar="KEYDIR",
              help="Encrypt every link with CURVE using the keys in KEYDIR (generated there "
                   "first if it has none); the connection file names the client's key files.")
@_with(timing[:2])
def cluster_up(workers: int, backend: str, devices_per_worker: int, frontend: str,
               backend_address: str, connection_file: str | None, memory_limit: int | None,
               curve: str | None, heartbeat: float, liveness: int) -> None:
    """Start a broker and WORKERS workers, write a connection file, serve until Ctrl-C.

    Generates fresh client, admin and worker tokens. Ctrl-C or SIGTERM stops every process;
    if the launcher itself is killed, its children notice and stop too. Exits 1 when a
    process fails to start or dies.
    """
    from .cluster import LocalCluster
    from .config import default_connection_file

    if curve and not (Path(curve) / "broker.key_secret").exists():
        _usage(lambda: generate_keys(curve))
        click.echo(f"fabric cluster up: CURVE keys generated in {curve}")
    running = _usage(lambda: LocalCluster(  # bad CURVE key files are a usage error
        workers, backend=backend, devices_per_worker=devices_per_worker, heartbeat=heartbeat,
        liveness=liveness, frontend=frontend, backend_address=backend_address,
        worker_args=("--memory-limit", str(memory_limit)) if memory_limit else (),
        curve=curve))
    try:
        running.start()
    except FabricError as exc:
        raise click.ClickException(exc.message.replace("\n", " ")) from None
    path = Path(connection_file or default_connection_file())
    try:
        running.write_connection_file(path)
        click.echo(f"fabric cluster up: broker at {running.address} with {workers} {backend} "
                   f"worker(s), {workers * devices_per_worker} device(s); logs in "
                   f"{running.log_dir}")
        click.echo(f"connection file: {path}")
        click.echo(f"connect:  import fabric; session = fabric.connect(connection_file="
                   f"{str(path)!r})")
        click.echo("Ctrl-C stops everything.", err=True)
        reason = running.watch()
        click.echo(f"fabric cluster up: {reason}; stopping everything", err=True)
    finally:
        running.__exit__()
        path.unlink(missing_ok=True)  # a stale file would only mislead
    if not reason.startswith("stopped by"):
        sys.exit(1)


@main.group()
def keys() -> None:
    """CURVE key pairs: encrypted links, and only known clients and workers get in."""


@keys.command("generate")
@click.argument("directory", type=click.Path(file_okay=False))
def keys_generate(directory: str) -> None:
    """Write broker, client and worker key pairs to DIRECTORY (secret files mode 0600).

    Also writes DIRECTORY/clients and DIRECTORY/workers: the public keys the broker accepts
    (fabric broker --curve DIRECTORY). To admit another client or worker, copy its .key file
    into one of them and restart the broker. Refuses to overwrite existing keys.
    """
    try:
        written = generate_keys(directory)
    except FabricError as exc:
        raise click.ClickException(exc.message) from None
    for name in sorted(written):
        click.echo(written[name])
    click.echo(f"broker:  fabric broker --curve {directory} ...\n"
               f"worker:  fabric worker --curve {directory} ...\n"
               f"client:  fabric.connect(address, token=..., curve={directory!r})")


@main.command()
@click.option("--workers", type=int, default=2, show_default=True)
def demo(workers: int) -> None:
    """Start a local broker with WORKERS workers, list devices, open a session on each."""
    from .demo import run

    run(workers)


# -- fabric admin ------------------------------------------------------------------------------

ADMIN_EXIT_CODES = """\b
Exit codes:
  0  done
  1  refused or not found: not the admin token or CURVE key, no such session or worker
  2  usage: bad arguments, no address or token, unusable connection file
  3  cannot reach the broker: nothing listening, not a fabric broker, no answer
"""
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON (for scripts) instead of a table.")


def _admin_exit_code(error: FabricError) -> int:
    """The documented exit code for an error from ``fabric.Admin``."""
    if isinstance(error, ConfigError):
        return 2
    if isinstance(error, (AuthenticationError, EncryptionError, VersionMismatch)):  # refused
        return 1
    if isinstance(error, (ConnectError, RequestTimeout, SessionLost)):
        return 3
    return 1


def _admin_call(options: dict[str, Any], call: Callable[[Any], Any], as_json: bool,
                render: Callable[[Any, str], None]) -> None:
    """Open a ``fabric.Admin`` from the group's options, make one call, print its result."""
    from .admin import ADMIN_TOKEN_ENV, Admin

    try:
        token = resolve_secret(options["token"], options["token_file"], ADMIN_TOKEN_ENV)
        with Admin(options["address"], token=token, connection_file=options["connection_file"],
                   timeout=options["timeout"], curve=options["curve"]) as admin:
            result = call(admin)
            address = admin.address
    except FabricError as exc:
        click.echo(f"fabric admin: {' '.join(str(exc).splitlines())}", err=True)
        sys.exit(_admin_exit_code(exc))
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        render(result, address)


def _duration(seconds: float) -> str:
    seconds = max(seconds, 0.0)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h"
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _size(count: float) -> str:
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


_TRAFFIC = [("MESSAGES", lambda r: r["messages"]), ("BYTES", lambda r: _size(r["bytes"])),
            ("SUBMITS", lambda r: r["submits"]), ("ERRORS", lambda r: r["errors"])]


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items())) or "none"


def _print_status(status: dict[str, Any], address: str) -> None:
    traffic, rates = status["traffic"], status["rates"]
    draining = status["workers_draining"]
    lines = [
        ("server", f"{status['server']} (protocol {status['protocol_version']})"),
        ("address", address),
        ("uptime", _duration(status["uptime"])),
        ("workers", f"{status['workers']}"
                    + (f" ({len(draining)} draining: {', '.join(draining)})" if draining else "")),
        ("devices", f"{status['devices_online']} online of {status['devices_total']}"),
        ("sessions", f"{status['sessions']} ({_counts(status['sessions_by_state'])}), "
                     f"{status['sessions_ended']} ended"),
        ("traffic", f"{traffic['messages']} messages, {_size(traffic['bytes'])}, "
                    f"{traffic['submits']} submits, {traffic['errors']} errors"),
        ("rates", f"{rates['messages_per_s']:.1f} messages/s, "
                  f"{_size(rates['bytes_per_s'])}/s since start"),
        ("rejects", _counts(status["rejects"])),
        ("protocol errors", _counts(status["protocol_errors"])),
    ]
    queues = status.get("queues")
    if queues:  # flow control: messages waiting for peers that are not reading
        lines.append(("queues", f"{queues['parked_messages']} message(s) waiting for "
                                f"{queues['peers_waiting']} peer(s)"
                                + (", clients paused" if queues["frontend_paused"] else "")))
    for name, value in lines:
        click.echo(f"{name + ':':<17}{value}")


def _print_workers(workers: list[dict[str, Any]], address: str) -> None:
    _table(workers, [
        ("NAME", lambda r: r["name"]), ("BACKEND", lambda r: r["backend"]),
        ("DEVICES", lambda r: ",".join(map(str, r["devices"])) or "-"),
        ("SESSIONS", lambda r: r["sessions"]),
        ("DRAINING", lambda r: "yes" if r["draining"] else "no"),
        ("REGISTERED", lambda r: _duration(r["registered_ago"]) + " ago"),
        ("LAST SEEN", lambda r: _duration(r["last_seen_ago"]) + " ago"), *_TRAFFIC],
        f"no workers are connected to {address}")


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
        ("STATE", lambda r: r["state"]), ("AGE", lambda r: _duration(r["created_ago"])),
        ("IDLE", lambda r: _duration(r["last_seen_ago"])), *_TRAFFIC],
        f"no sessions are open on {address}")


@main.group(epilog=ADMIN_EXIT_CODES)
@click.option("--address", default=None, metavar="ADDRESS",
              help="The broker's frontend, like tcp://host:5555 [default: the connection "
                   "file's].")
@click.option("--connection-file", type=click.Path(dir_okay=False), default=None,
              help="The file fabric cluster up wrote [default: $FABRIC_CONNECTION_FILE, else "
                   "the default one if it exists].")
@token_options("", "FABRIC_ADMIN_TOKEN", "admin token")
@click.option("--timeout", type=float, default=5.0, show_default=True,
              help="Seconds to wait for the broker's answer.")
@click.option("--curve", type=click.Path(file_okay=False), default=None, metavar="KEYDIR",
              help="Encrypt with CURVE using KEYDIR/client.key_secret and KEYDIR/broker.key "
                   "[default: the connection file's keys, if any].")
@click.pass_context
def admin(ctx: click.Context, address: str | None, connection_file: str | None,
          token: str | None, token_file: str | None, timeout: float, curve: str | None) -> None:
    """Inspect and steer a running broker with the admin token (a client token is refused).

    The address and token come from the options, else from the connection file; the token
    from --token-file, $FABRIC_ADMIN_TOKEN or --token comes first. Tokens are never printed.
    """
    ctx.obj = {"address": address, "connection_file": connection_file, "token": token,
               "token_file": token_file, "timeout": timeout, "curve": curve}


def _report_command(name: str, short_help: str, help_text: str,
                    printer: Callable[[Any, str], None]) -> None:
    """Register ``fabric admin NAME``: one read-only call of fabric.Admin, as a table or JSON."""
    @admin.command(name, epilog=ADMIN_EXIT_CODES, short_help=short_help, help=help_text)
    @json_option
    @click.pass_obj
    def report(options: dict[str, Any], as_json: bool) -> None:
        _admin_call(options, lambda a: getattr(a, name)(), as_json, printer)


for _report in [
    ("status", "Broker summary.",
     "Broker identity, uptime, workers, devices, sessions, traffic rates, rejections.",
     _print_status),
    ("workers", "List workers.",
     "Each worker: backend, devices, sessions, draining, ages and traffic.", _print_workers),
    ("devices", "List devices.",
     "Each device, online or not: worker, backend, sessions and traffic.", _print_devices),
    ("sessions", "List sessions.",
     "Each session: id, client, device, state, ages and traffic.\n\nSUBMITS counts op "
     "batches: the broker never decodes the ops themselves.", _print_sessions),
]:
    _report_command(*_report)


def _session_argument(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from .admin import parse_session_id

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


@admin.command("shutdown", epilog=ADMIN_EXIT_CODES, short_help="Stop the broker.")
@json_option
@click.pass_obj
def admin_shutdown(options: dict[str, Any], as_json: bool) -> None:
    """Stop the broker: it answers, tells every client its session ends, and exits."""
    _admin_call(options, lambda a: a.shutdown(), as_json, lambda r, address: click.echo(
        f"broker at {address} is shutting down; {r['sessions']} session(s) told"))
