"""The ``fabric`` command: a thin shell over the library (every command is a Python call).

The shared options are in ``fabric.cli.options``, the ``fabric admin`` group in
``fabric.cli.admin_commands``, the ``fabric cluster`` group in ``fabric.cli.cluster_commands``.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

import click
import zmq
from click.core import ParameterSource

from fabric.cli.admin_commands import admin
from fabric.cli.cluster_commands import cluster
from fabric.cli.dashboard_command import dashboard
from fabric.cli.options import (checked, curve_client_options, curve_server_options,
                                limit_options, metrics_option, pair_options, renamed_option,
                                required_secret, timing_options, token_options, with_options)
from fabric.cli.top_command import top
from fabric.core.addresses import advertise_host, check_endpoints
from fabric.core.config import load_admin_file, resolve_secret
from fabric.core.errors import ConfigError, DeviceNotHostable, FabricError
from fabric.core.host_slot import claim_slot
from fabric.core.parallel_copy import default_min_bytes, default_threads
from fabric.core.protocol import MAX_LABEL_CHARS
from fabric.core.security import CurveClient, CurveServer, generate_keys
from fabric.core.shm import DEFAULT_POOL_BYTES, IDLE_SECONDS, START_SLOT_BYTES
from fabric.core.flow import DEFAULT_RESUME_GRACE
from fabric.core.worker_options import DEFAULT_MEMORY_BUDGET, WorkerOptions, budget_from_option


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


@click.group()
@click.version_option(package_name="fabric-arrays")
def main() -> None:
    """Fabric: numpy-style arrays on devices served by worker processes behind a broker."""


@main.command()
@click.option("--frontend", default="tcp://127.0.0.1:5555", show_default=True,
              help="Address clients and the admin CLI connect to (tcp://host:port, ipc://path;"
                   " port * picks a free one).")
@click.option("--worker-address", default="tcp://127.0.0.1:5556", show_default=True,
              help="Address workers connect to (their --broker; port * picks a free one). "
                   "Formerly --backend, which still works for this release.")
@token_options("", "FABRIC_TOKEN", "client token, or several, one a line (one per user or team: "
               "each has its own share of every device's sessions)")
@token_options("worker-", "FABRIC_WORKER_TOKEN")
@token_options("admin-", "FABRIC_ADMIN_TOKEN")
@click.option("--open-timeout", type=float, default=5.0, show_default=True,
              help="Seconds a worker may take to open a session before the client is refused.")
@click.option("--lease", type=float, default=10.0, show_default=True,
              help="Idle seconds after which the broker checks a client is still connected.")
@click.option("--auth-delay", type=click.FloatRange(min=0), default=0.2, show_default=True,
              help="Seconds before a refused token (client, admin or worker) is answered.")
@click.option("--handshake-timeout", type=click.FloatRange(min=0.1), default=10.0,
              show_default=True,
              help="Seconds a peer has to finish the ZeroMQ handshake (with its token) before "
                   "its connection is closed.")
@click.option("--resume-grace", "broker_resume_grace", type=click.FloatRange(min=0),
              default=DEFAULT_RESUME_GRACE, show_default=True, metavar="SECONDS",
              help="With --peer: how long a session a worker reported after a takeover waits "
                   "for its client to resume it before it is closed.")
@click.option("--settle", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="With --peer: the longest clients wait, once this broker took over, for "
                   "the workers of the device table (--state-file) to report their sessions "
                   "[default: 2 x heartbeat x liveness].")
@click.option("--advertise", default=None, metavar="HOST", callback=checked(advertise_host),
              help="The host name or address clients and workers reach this broker by, where "
                   "it names its ports to a peer at the wrong one (for a broker bound to every "
                   "interface) [default: the bound address].")
@click.option("--state-file", type=click.Path(dir_okay=False), default=None,
              help="Keep the device numbering (worker name -> indexes) in this file, read at "
                   "start and rewritten atomically when it changes, so indexes survive a "
                   "broker restart [default: none; fabric cluster up puts one beside its "
                   "connection file].")
@with_options(timing_options)
@limit_options("broker")
@curve_server_options
@metrics_option
@pair_options
@renamed_option("--backend", "--worker-address")
def broker(frontend: str, worker_address: str, token: str | None, token_file: str | None,
           worker_token: str | None, worker_token_file: str | None, admin_token: str | None,
           admin_token_file: str | None, open_timeout: float, lease: float, heartbeat: float,
           liveness: int, log_level: str, auth_delay: float, handshake_timeout: float,
           broker_resume_grace: float, settle: float | None, advertise: str | None,
           state_file: str | None, curve: CurveServer | None,
           limits: dict[str, Any], metrics: str | None, pair: Any) -> None:
    """Run a broker: route clients' sessions to the workers that own their devices.

    Prints one JSON line with the bound addresses when ready; logs go to stderr. Stops
    cleanly on SIGINT or SIGTERM.
    """
    from fabric.broker.metrics import parse_address
    from fabric.broker.model import Limits
    from fabric.broker.server import announce_on_stdout, serve

    from fabric.launch.local import start_with_server_environment

    start_with_server_environment()
    _logging(log_level)
    client = required_secret(token, token_file, "FABRIC_TOKEN", "token")
    client_tokens = [line.strip() for line in client.splitlines() if line.strip()]
    worker = required_secret(worker_token, worker_token_file, "FABRIC_WORKER_TOKEN",
                             "worker token")
    admin = resolve_secret(admin_token, admin_token_file, "FABRIC_ADMIN_TOKEN")
    limits = Limits(heartbeat=heartbeat, liveness=liveness, open_timeout=open_timeout,
                    lease=lease, auth_delay=auth_delay, handshake_timeout=handshake_timeout,
                    resume_grace=broker_resume_grace, settle=settle, **limits)
    try:
        serve(frontend, worker_address, client_token=client_tokens, worker_token=worker,
              admin_token=admin, limits=limits, announce=announce_on_stdout, curve=curve,
              state_file=state_file, metrics=parse_address(metrics) if metrics else None,
              advertise=advertise, pair=pair)
    except ConfigError as exc:  # a state file it cannot use, a peer of its own role
        raise click.ClickException(exc.message) from None
    except zmq.ZMQError as exc:  # binding: the port is taken, or the address is malformed
        hint = (" (another broker or cluster on that port? tcp://127.0.0.1:* picks a free one)"
                if exc.errno == zmq.EADDRINUSE else "")
        bound = " / ".join([frontend, worker_address, *([pair.address] if pair else [])])
        raise click.ClickException(f"cannot serve on {bound}: {exc}{hint}") from None
    except OSError as exc:  # the metrics address: taken, or not this host's
        raise click.ClickException(f"cannot serve metrics on {metrics}: {exc.strerror}"
                                   ) from None


@main.command()
@click.option("--broker", "broker_address", default="tcp://127.0.0.1:5556", show_default=True,
              callback=checked(check_endpoints),
              help="The broker's address for workers (fabric broker --worker-address); for a "
                   "pair, both brokers', separated by a comma: the worker serves the active one.")
@click.option("--backend", default="numpy", show_default=True,
              help="Device backend to host: numpy, numexpr, jax (the [jax] extra; "
                   "--devices N on a CPU host makes N XLA CPU devices) or cupy (the [cupy] "
                   "extra; NVIDIA GPUs). (capture and remote devices cannot host a server "
                   "and are refused.)")
@click.option("--devices", type=int, default=1, show_default=True,
              help="How many devices this worker hosts.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="Threads numpy's BLAS, OpenMP and numexpr may use in this worker "
                   "[default: the cores it may run on, shared among its devices].")
@click.option("--name", default=None, help="Worker name, unique in the cluster [default: "
              "HOST/SLOT, the lowest slot no other live unnamed worker of this host holds for "
              "this broker (a lock file in $FABRIC_HOST_SLOTS, else ~/.cache/fabric/host-slots), "
              "so a restarted worker takes back its name and device indexes].")
@click.option("--memory-limit", type=int, default=None,
              help="Most bytes one session may keep resident on a device; an op that would "
                   "pass it fails with QuotaExceeded and the worker goes on [default: none].")
@click.option("--memory-budget", default=DEFAULT_MEMORY_BUDGET, show_default=True,
              metavar="SIZE|PERCENT",
              help="Most bytes all sessions on all of this worker's devices may hold: a size "
                   "(1073741824, 512MiB, 2G) or a percentage of the memory available at start "
                   "(MemAvailable, less where a memory cgroup has less left). An op or upload "
                   "that would pass it fails with QuotaExceeded before it allocates, and the "
                   "worker goes on.")
@click.option("--give-up-after", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Exit 1 once the broker has said nothing for SECONDS, at start or later "
                   "(for a supervisor that starts the worker elsewhere) [default: never].")
@click.option("--resume-grace", type=click.FloatRange(min=0), default=DEFAULT_RESUME_GRACE,
              show_default=True, metavar="SECONDS",
              help="With a broker pair (--broker A,B): how long the worker keeps its sessions "
                   "after its broker went, for the other broker and the sessions' clients to "
                   "take them up; then it drops them (0: at once).")
@click.option("--admin-file", type=click.Path(dir_okay=False), default=None,
              help="Take the broker's worker address and the worker token from this admin "
                   "file (fabric cluster up writes it; on a shared filesystem every node of a "
                   "batch job reads the same one). --broker and a token given otherwise win.")
@click.option("--stop-on-stdin-close", is_flag=True,
              help="Stop (as SIGTERM stops it) once standard input closes: a worker started "
                   "over SSH ends when its launcher's session does.")
@click.option("--no-shared-memory", is_flag=True,
              help="Refuse shared memory with clients on this host: their large arrays then "
                   "travel inside messages, as from other hosts.")
@click.option("--bulk-host", default="auto", show_default=True, metavar="HOST|auto|none",
              help="Where large tensors moved from other workers arrive over a direct link (a "
                   "free port): the address other workers reach this one by; auto: the address "
                   "its route to the broker leaves from; none: they travel through the broker.")
@click.option("--shared-memory-limit", type=click.IntRange(min=0), default=DEFAULT_POOL_BYTES,
              show_default=True, metavar="BYTES",
              help="Most shared memory each device keeps for uploads from clients on this "
                   "host: the tensors they became, and free segments for the next (closed "
                   "once unused --shared-memory-idle); past it, uploads are copied out of "
                   "the client's.")
@click.option("--shared-memory-idle", type=click.FloatRange(min=0), default=IDLE_SECONDS,
              show_default=True, metavar="SECONDS",
              help="Seconds a free segment of a device's shared memory is kept for the next "
                   "upload before it is closed.")
@click.option("--start-slot", type=click.IntRange(min=0), default=START_SLOT_BYTES,
              show_default=True, metavar="BYTES",
              help="Size of the segment each device keeps made, never closed as idle, for the "
                   "first upload of a client on this host that opens a session (its start "
                   "slot; 0: none kept, one is made when asked).")
@click.option("--copy-threads", type=click.IntRange(min=1), default=None, metavar="N",
              help="Threads that copy a large array into or out of shared memory together "
                   "(1: one) [default: FABRIC_COPY_THREADS, else the cores it may use, at "
                   "most 4].")
@token_options("worker-", "FABRIC_WORKER_TOKEN")
@with_options(timing_options)
@limit_options("worker")
@curve_client_options("worker")
def worker(broker_address: str, backend: str, devices: int, threads: int | None,
           name: str | None, memory_limit: int | None, memory_budget: str,
           give_up_after: float | None, resume_grace: float, admin_file: str | None,
           stop_on_stdin_close: bool, no_shared_memory: bool, bulk_host: str,
           shared_memory_limit: int, shared_memory_idle: float, start_slot: int,
           copy_threads: int | None, worker_token: str | None,
           worker_token_file: str | None, heartbeat: float, liveness: int, log_level: str,
           curve: CurveClient | None, limits: dict[str, Any]) -> None:
    """Run a worker: host DEVICES devices of BACKEND for the broker at --broker.

    Exits 1 when the broker refuses it or stays silent past --give-up-after, 2 on a usage
    error (a backend that cannot be hosted or is not installed, the broker's client port
    given as --broker).
    """
    from fabric.workers.backends import device_class, prepare
    from fabric.workers.control import WorkerStops
    from fabric.workers.control_io import serve

    from fabric.launch.local import start_with_server_environment

    start_with_server_environment()
    _logging(log_level)
    try:  # (the environment's settings of the copies, read here, once)
        copies = {"copy_threads": copy_threads or default_threads(),
                  "copy_min_bytes": default_min_bytes()}
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        budget = budget_from_option(memory_budget)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--memory-budget") from None
    if name is not None and len(name) > MAX_LABEL_CHARS:  # (a broker refuses it in REGISTER)
        raise click.BadParameter(f"a worker name has at most {MAX_LABEL_CHARS} characters, "
                                 f"not {len(name)}: choose a shorter one.", param_hint="--name")
    try:
        prepare(backend, devices)  # (what its module reads as it loads, set before)
        device_class(backend)  # a backend that can never be hosted is refused before the token
        cluster_info = load_admin_file(admin_file) if admin_file else {}
        token = required_secret(worker_token or cluster_info.get("worker_token"),
                                worker_token_file, "FABRIC_WORKER_TOKEN", "worker token")
        if admin_file and click.get_current_context().get_parameter_source(
                "broker_address") is ParameterSource.DEFAULT:
            if "worker_address" not in cluster_info:
                raise ConfigError(f"{admin_file} names no worker address: give --broker, or "
                                  "write the file again with this release's fabric cluster up.")
            broker_address = cluster_info["worker_address"]
        if stop_on_stdin_close:  # (after the token, which may come first on standard input)
            _stop_when_stdin_closes()
        slot = None if name else claim_slot(broker_address)  # (held while this process lives)
        serve(broker_address, WorkerOptions(
            token=token, name=name or slot.name, backend=backend, devices=devices,
            threads=threads, heartbeat=heartbeat, liveness=liveness, memory_limit=memory_limit,
            memory_budget=budget, curve=curve, give_up_after=give_up_after,
            resume_grace=resume_grace, bulk_host=None if bulk_host == "none" else bulk_host,
            shared_memory=not no_shared_memory, shared_memory_limit=shared_memory_limit,
            shared_memory_idle=shared_memory_idle, start_slot=start_slot, **copies,
            **limits))
    except DeviceNotHostable as exc:
        click.echo(exc.message, err=True)
        sys.exit(2)
    except WorkerStops as exc:
        click.echo(f"fabric worker: {exc}", err=True)
        sys.exit(exc.exit_code)
    except (ValueError, ConfigError) as exc:
        click.echo(f"fabric worker: {exc}", err=True)
        sys.exit(1)


def _stop_when_stdin_closes() -> None:
    """Read standard input to its end in a thread, then stop this process as SIGTERM does."""
    main_thread = threading.main_thread().ident

    def watch() -> None:
        sys.stdin.read()  # whatever else arrives is not for us; its end is
        # To the main thread itself, whose handler stops the worker (and whose wait the
        # signal interrupts, which a signal to the process might not, landing elsewhere).
        signal.pthread_kill(main_thread, signal.SIGTERM)

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


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
    """Run the quick-start job on a local cluster started and stopped for you.

    Starts a broker and WORKERS numpy workers, lists their devices, uploads an array to
    device 0, streams 300 ops on it, moves the result to device 1 worker to worker, computes
    there, reads the result back and checks it against local numpy, then prints the session's
    stats and the broker's admin status, and stops every process.
    """
    from fabric.cli.demo import run

    run(workers)


main.add_command(admin)
main.add_command(cluster)
main.add_command(top)
main.add_command(dashboard)
