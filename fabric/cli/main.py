"""The ``fabric`` command: a thin shell over the library (every command is a Python call).

The shared options are in ``fabric.cli.options``, the ``fabric admin`` group in
``fabric.cli.admin_commands``.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click
import zmq
from click.core import ParameterSource

from fabric.cli.admin_commands import admin
from fabric.cli.dashboard_command import dashboard
from fabric.cli.options import (as_usage_error, checked, curve_client_options,
                                curve_server_options, limit_options, metrics_option, pair_options,
                                renamed_option, required_secret, timing_options, token_options,
                                with_options)
from fabric.cli.top_command import top
from fabric.core.addresses import advertise_host, check_endpoints
from fabric.core.config import load_admin_file, resolve_secret
from fabric.core.errors import ConfigError, DeviceNotHostable, FabricError
from fabric.core.host_slot import claim_slot
from fabric.core.parallel_copy import default_min_bytes, default_threads
from fabric.core.protocol import MAX_LABEL_CHARS
from fabric.core.security import CurveClient, CurveServer, generate_keys
from fabric.core.shm import DEFAULT_POOL_BYTES, IDLE_SECONDS
from fabric.core.flow import DEFAULT_RESUME_GRACE
from fabric.core.worker_options import DEFAULT_MEMORY_BUDGET, WorkerOptions, budget_from_option

if TYPE_CHECKING:
    from fabric.launch.local import LocalCluster
    from fabric.launch.ssh import Host


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

    from fabric.launch.local import start_with_bulk_malloc

    start_with_bulk_malloc()
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
           shared_memory_limit: int,
           shared_memory_idle: float, copy_threads: int | None, worker_token: str | None,
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

    from fabric.launch.local import start_with_bulk_malloc

    start_with_bulk_malloc()
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
            shared_memory_idle=shared_memory_idle, **copies, **limits))
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
def cluster() -> None:
    """Run a broker and workers as one unit: here, on other hosts over SSH, or in a Slurm
    job."""


# The options every cluster command takes (cluster up, cluster slurm).
_cluster_options = [
    click.option("--backend", default="numpy", show_default=True,
                 help="Device backend: numpy, numexpr or jax (the [jax] extra)."),
    click.option("--devices-per-worker", type=int, default=1, show_default=True),
    click.option("--frontend", default="tcp://127.0.0.1:5555", show_default=True,
                 help="Address for clients and admin (port * picks a free one)."),
    click.option("--worker-address", default="tcp://127.0.0.1:5556", show_default=True,
                 help="Address the workers connect to (port * picks a free one). Formerly "
                      "--backend-address, which still works for this release."),
    click.option("--connection-file", type=click.Path(dir_okay=False), default=None,
                 help="Where to write the connection file to hand to users: address, client "
                      "token, client CURVE key files (mode 0600) "
                      "[default: ~/.config/fabric/cluster.json]."),
    click.option("--admin-file", type=click.Path(dir_okay=False), default=None,
                 help="Where to write the admin file for operators only: admin and worker tokens, "
                      "worker address (mode 0600) [default: NAME-admin.json beside the "
                      "connection file NAME.json]."),
    click.option("--memory-limit", type=int, default=None,
                 help="Per-session resident byte limit on each device."),
    click.option("--memory-budget", default=DEFAULT_MEMORY_BUDGET, show_default=True,
                 metavar="SIZE|PERCENT",
                 help="Most bytes the workers' sessions may hold in all, shared evenly among "
                      "the workers: a size (2G, 512MiB) or a percentage of the memory available "
                      "(see fabric worker --help)."),
    click.option("--advertise", default=None, metavar="HOST", callback=checked(advertise_host),
                 help="The host name or address clients and workers reach the broker by, written "
                      "into both files with the bound ports; needed when --frontend or "
                      "--worker-address binds every interface (tcp://0.0.0.0:PORT)."),
    click.option("--log-dir", type=click.Path(file_okay=False), default=None,
                 help="Folder for the broker's and each worker's log (made if missing, appended "
                      "to, kept after stop) [default: NAME-logs-DATE-TIME beside the connection "
                      "file NAME.json]."),
    click.option("--curve", type=click.Path(file_okay=False), default=None, metavar="KEYDIR",
                 help="Encrypt every link with CURVE using the keys in KEYDIR (generated there "
                      "first if it has none); both files name the client's key files."),
    metrics_option,
    *timing_options[:2],
    renamed_option("--backend-address", "--worker-address"),
]


@cluster.command("up")
@click.option("--workers", type=int, default=2, show_default=True,
              help="How many worker processes to start (with --hosts: on each host).")
@click.option("--hosts", default=None, metavar="HOST,...",
              help="Start the workers on these hosts over SSH instead of here: "
                   "[user@]host[:port], separated by commas (see --hostfile for per-host "
                   "settings). The broker runs here and binds every interface unless "
                   "--frontend and --worker-address say otherwise; give --advertise.")
@click.option("--hostfile", type=click.Path(dir_okay=False, exists=True), default=None,
              help="Hosts for the workers, one a line: [user@]host[:port] [workers=N] "
                   "[python=PATH]; # starts a comment. Instead of --hosts.")
@click.option("--remote-python", default="python3", show_default=True, metavar="PATH",
              help="The interpreter that runs fabric worker on the hosts (this fabric "
                   "release installed), where a host does not give python=PATH.")
@click.option("--ssh-config", type=click.Path(dir_okay=False, exists=True), default=None,
              help="An ssh config file for reaching the hosts (ssh -F) [default: yours].")
@click.option("--ssh-option", multiple=True, metavar="OPTION",
              help="An ssh option (ssh -o OPTION: ConnectTimeout=30, ProxyJump=gw); repeat "
                   "for more.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=5, show_default=True,
              help="Times a worker that dies is restarted within a minute; past that it "
                   "stays down and the others serve on (0: never restarted).")
@click.option("--standby", is_flag=True, help="Run a broker pair here: a primary and a backup "
              "that takes over when the primary dies; workers and the connection file name both.")
@with_options(_cluster_options)
def cluster_up(workers: int, hosts: str | None, hostfile: str | None, remote_python: str,
               ssh_config: str | None, ssh_option: tuple[str, ...], backend: str,
               devices_per_worker: int, frontend: str,
               worker_address: str, connection_file: str | None, admin_file: str | None,
               memory_limit: int | None, memory_budget: str, advertise: str | None,
               max_restarts: int, standby: bool,
               log_dir: str | None,
               curve: str | None, metrics: str | None,
               heartbeat: float, liveness: int) -> None:
    """Start a broker and WORKERS workers (here, or on each of --hosts over SSH), write a
    connection file and an admin file, serve until Ctrl-C.

    Generates fresh client, admin and worker tokens. The connection file (address, client
    token) is the one to hand to users; the admin file (admin and worker tokens) is for
    operators: fabric admin reads it. Ctrl-C or SIGTERM stops every process and removes both
    files, and keeps the logs (--log-dir), whose folder is named on every exit; if the
    launcher itself is killed, its children notice and stop too. The broker keeps its device
    numbering in NAME-state.json beside the connection file NAME.json, so a worker keeps its
    device indexes from one run to the next. Exits 1 when a process fails to start or dies.

    With --hosts or --hostfile, each host's workers are started through your ssh (your
    config, keys and agent), get the worker token on the SSH channel's standard input, and
    stop when Ctrl-C closes it, or when the SSH session drops.
    """
    from fabric.core.addresses import advertised, only_this_host
    from fabric.launch.local import LocalCluster
    from fabric.launch.ssh import SSHCluster

    remote_hosts = _remote_hosts(hosts, hostfile)
    if remote_hosts:
        frontend, worker_address = _every_interface_unless_given(frontend, worker_address)
    _check_advertised(frontend, worker_address, advertise)
    if remote_hosts and (only_this_host(worker_address)
                         or only_this_host(advertised(worker_address, advertise))):
        raise click.UsageError(f"Workers on other hosts cannot reach {worker_address}"
                               f"{f' as {advertise}' if advertise else ''}: bind "
                               "--worker-address where they reach it (tcp://0.0.0.0:5556 "
                               "with --advertise HOST).")

    placement: dict[str, Any] = {"workers": workers, "standby": standby}
    if remote_hosts and standby:
        raise click.UsageError("--standby runs both brokers and the workers on this host: give "
                               "it without --hosts (or start a pair with fabric broker --peer).")
    if remote_hosts:
        placement = {"hosts": remote_hosts, "workers_per_host": workers,
                     "remote_python": remote_python, "ssh_config": ssh_config,
                     "ssh_options": ssh_option}
    _run_cluster(SSHCluster if remote_hosts else LocalCluster, placement, "fabric cluster up",
                 backend=backend, devices_per_worker=devices_per_worker, frontend=frontend,
                 worker_address=worker_address, connection_file=connection_file,
                 admin_file=admin_file, memory_limit=memory_limit, memory_budget=memory_budget,
                 advertise=advertise, max_restarts=max_restarts, log_dir=log_dir, curve=curve,
                 metrics=metrics, heartbeat=heartbeat, liveness=liveness)


@cluster.command("slurm")
@click.option("--nodes", type=click.IntRange(min=1), required=True,
              help="Nodes the job asks for (sbatch --nodes).")
@click.option("--workers-per-node", type=click.IntRange(min=1), default=1, show_default=True,
              help="Workers on each node: one srun task each (sbatch --ntasks-per-node).")
@click.option("--partition", default=None, help="The partition (sbatch --partition) "
              "[default: Slurm's].")
@click.option("--time", "time_limit", default=None, metavar="TIME",
              help="The job's time limit (sbatch --time: 30, 4:00:00, 2-0) [default: the "
                   "partition's].")
@click.option("--sbatch-option", multiple=True, metavar="OPTION",
              help="One more sbatch option, as one word (--account=A, --gres=gpu:1, "
                   "--cpus-per-task=8); repeat for more.")
@click.option("--python", default=sys.executable, show_default="this interpreter",
              metavar="PATH", help="The interpreter the tasks run fabric worker with (this "
              "fabric release installed; on a shared filesystem, this one).")
@with_options(_cluster_options)
def cluster_slurm(nodes: int, workers_per_node: int, partition: str | None,
                  time_limit: str | None, sbatch_option: tuple[str, ...], python: str,
                  backend: str, devices_per_worker: int, frontend: str, worker_address: str,
                  connection_file: str | None, admin_file: str | None,
                  memory_limit: int | None, memory_budget: str, advertise: str | None,
                  log_dir: str | None, curve: str | None, metrics: str | None,
                  heartbeat: float, liveness: int) -> None:
    """Start a broker here and NODES x WORKERS-PER-NODE workers in one Slurm job, write a
    connection file and an admin file once every worker is in, serve until Ctrl-C.

    The job (sbatch) runs one fabric worker per task under srun; each connects back to the
    broker, which binds every interface unless --frontend and --worker-address say otherwise:
    give --advertise, the name the nodes reach this host by. The launcher waits while the job
    is queued, then up to 30 s for its workers. A worker is named NODE/SLOT (slots count the
    workers of a node from 0), and gets the worker token in the job's environment. Ctrl-C or
    SIGTERM cancels the job (scancel; each worker stops on its SIGTERM), then stops the broker
    and removes both files; a scancel of the job from elsewhere does the same, and exits 0.
    The job's own output (every worker's log) is slurm-JOB.log in the log folder. Exits 1
    when the job cannot start, its workers do not register, or it ends otherwise.
    """
    from fabric.launch.slurm import SlurmCluster

    frontend, worker_address = _every_interface_unless_given(frontend, worker_address)
    _check_advertised(frontend, worker_address, advertise)
    _run_cluster(SlurmCluster, {"nodes": nodes, "workers_per_node": workers_per_node,
                                "partition": partition, "time_limit": time_limit,
                                "sbatch_options": sbatch_option, "python": python},
                 "fabric cluster slurm", backend=backend,
                 devices_per_worker=devices_per_worker, frontend=frontend,
                 worker_address=worker_address, connection_file=connection_file,
                 admin_file=admin_file, memory_limit=memory_limit, memory_budget=memory_budget,
                 advertise=advertise, max_restarts=0, log_dir=log_dir, curve=curve,
                 metrics=metrics, heartbeat=heartbeat, liveness=liveness)

def _run_cluster(make_cluster: Callable[..., "LocalCluster"], placement: dict[str, Any],
                 command: str, *, backend: str, devices_per_worker: int, frontend: str,
                 worker_address: str, connection_file: str | None, admin_file: str | None,
                 memory_limit: int | None, memory_budget: str, advertise: str | None,
                 max_restarts: int, log_dir: str | None, curve: str | None,
                 metrics: str | None, heartbeat: float, liveness: int) -> None:
    """Start a cluster (``make_cluster(**placement, ...)``), write its connection and admin
    files, serve until it stops, then remove them; exit 1 unless stopped by a signal (or an
    operator's scancel)."""
    from fabric.core.config import (
        admin_file_beside,
        default_connection_file,
        logs_beside,
        state_file_beside,
    )

    client_path = Path(connection_file or default_connection_file())
    admin_path = Path(admin_file or admin_file_beside(client_path))
    if client_path.resolve() == admin_path.resolve():
        raise click.UsageError("--connection-file and --admin-file must be different files: "
                               "the first goes to users, the second only to operators.")
    if curve and not (Path(curve) / "broker.key_secret").exists():
        as_usage_error(lambda: generate_keys(curve))
        click.echo(f"{command}: CURVE keys generated in {curve}")
    logs = Path(log_dir) if log_dir else logs_beside(client_path, datetime.now())
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise click.UsageError(f"Cannot make the log folder {logs}: {exc.strerror}.") from None
    try:
        running = as_usage_error(lambda: make_cluster(
            **placement, backend=backend, devices_per_worker=devices_per_worker,
            heartbeat=heartbeat, liveness=liveness, frontend=frontend,
            worker_address=worker_address, memory_budget=memory_budget, advertise=advertise,
            worker_args=("--memory-limit", str(memory_limit)) if memory_limit else (),
            curve=curve, log_dir=logs,
            broker_args=("--state-file", str(state_file_beside(client_path)),
                         *(("--metrics", metrics) if metrics else ()),
                         *(("--advertise", advertise) if advertise else ()))))
    except ValueError as exc:  # the budget is measured once, and shared among the workers
        raise click.BadParameter(str(exc), param_hint="--memory-budget") from None
    kept = f"{command}: logs kept in {logs}"
    try:
        running.start(report=lambda line: click.echo(f"{command}: {line}", err=True))
    except FabricError as exc:
        raise click.ClickException(f"{exc.message} (logs in {logs})".replace("\n", " ")
                                   ) from None
    except BaseException:  # interrupted while starting: start() stopped what it started
        click.echo(kept, err=True)
        raise
    try:
        # The admin file first: once the connection file exists, both do.
        running.write_admin_file(admin_path)
        running.write_connection_file(client_path)
        click.echo(f"{command}: broker at {running.address} with {running.n_workers} "
                   f"{backend} worker(s), {running.n_workers * devices_per_worker} device(s); "
                   f"logs in {running.log_dir}")
        click.echo(f"connection file (hand this one to users): {client_path}")
        click.echo(f"admin file (operators only: admin and worker tokens): {admin_path}")
        click.echo(f"connect:  import fabric; session = fabric.connect(connection_file="
                   f"{str(client_path)!r})")
        click.echo(f"admin:    fabric admin --admin-file {admin_path} status")
        if running.metrics_url:
            click.echo(f"metrics:  {running.metrics_url}")
        click.echo("Ctrl-C stops everything.", err=True)
        reason = running.watch(restarts=max_restarts)
        click.echo(f"{command}: {reason}; stopping everything", err=True)
    finally:
        running.__exit__()
        for path in (client_path, admin_path):
            path.unlink(missing_ok=True)  # a stale file would only mislead
        click.echo(kept, err=True)
    if not reason.startswith("stopped by"):
        sys.exit(1)


def _check_advertised(frontend: str, worker_address: str, advertise: str | None) -> None:
    """A usage error where a wildcard address has no --advertise to name it by."""
    from fabric.core.addresses import advertised

    for address in (frontend, worker_address):
        as_usage_error(lambda: advertised(address, advertise))


def _every_interface_unless_given(frontend: str, worker_address: str) -> tuple[str, str]:
    """--frontend and --worker-address for workers elsewhere: bound to every interface
    where the command line left them at their loopback defaults."""
    given = click.get_current_context().get_parameter_source
    if given("frontend") is ParameterSource.DEFAULT:
        frontend = "tcp://0.0.0.0:5555"
    if given("worker_address") is ParameterSource.DEFAULT:
        worker_address = "tcp://0.0.0.0:5556"
    return frontend, worker_address


def _remote_hosts(hosts: str | None, hostfile: str | None) -> list[Host]:
    """The hosts --hosts or --hostfile lists, or [] for none."""
    from fabric.launch.ssh import parse_hosts

    if hosts and hostfile:
        raise click.UsageError("Give --hosts or --hostfile, not both.")
    if hostfile:
        return as_usage_error(lambda: parse_hosts(Path(hostfile).read_text()))
    return as_usage_error(lambda: parse_hosts(hosts)) if hosts is not None else []


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
main.add_command(top)
main.add_command(dashboard)
