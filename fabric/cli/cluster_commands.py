"""``fabric cluster``: a broker and workers started, watched and stopped as one unit (here, over
SSH, or in a Slurm job)."""

from __future__ import annotations

import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click
from click.core import ParameterSource

from fabric.cli.options import (as_usage_error, checked, metrics_option, renamed_option,
                                timing_options, with_options)
from fabric.core.addresses import advertise_host
from fabric.core.errors import FabricError
from fabric.core.security import generate_keys
from fabric.core.worker_options import DEFAULT_MEMORY_BUDGET

if TYPE_CHECKING:
    from fabric.launch.local import LocalCluster
    from fabric.launch.ssh import Host


@click.group()
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
               ssh_config: str | None, ssh_option: tuple[str, ...], max_restarts: int,
               standby: bool, **options: Any) -> None:
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
        _every_interface_unless_given(options)
    _check_advertised(options)
    worker_address, advertise = options["worker_address"], options["advertise"]
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
                 max_restarts=max_restarts, **options)


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
                  **options: Any) -> None:
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

    _every_interface_unless_given(options)
    _check_advertised(options)
    _run_cluster(SlurmCluster, {"nodes": nodes, "workers_per_node": workers_per_node,
                                "partition": partition, "time_limit": time_limit,
                                "sbatch_options": sbatch_option, "python": python},
                 "fabric cluster slurm", max_restarts=0, **options)

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


def _check_advertised(options: dict[str, Any]) -> None:
    """A usage error where a wildcard address has no --advertise to name it by."""
    from fabric.core.addresses import advertised

    for address in (options["frontend"], options["worker_address"]):
        as_usage_error(lambda: advertised(address, options["advertise"]))


def _every_interface_unless_given(options: dict[str, Any]) -> None:
    """Bind --frontend and --worker-address, in ``options``, to every interface for workers
    elsewhere, where the command line left them at their loopback defaults."""
    given = click.get_current_context().get_parameter_source
    if given("frontend") is ParameterSource.DEFAULT:
        options["frontend"] = "tcp://0.0.0.0:5555"
    if given("worker_address") is ParameterSource.DEFAULT:
        options["worker_address"] = "tcp://0.0.0.0:5556"


def _remote_hosts(hosts: str | None, hostfile: str | None) -> list[Host]:
    """The hosts --hosts or --hostfile lists, or [] for none."""
    from fabric.launch.ssh import parse_hosts

    if hosts and hostfile:
        raise click.UsageError("Give --hosts or --hostfile, not both.")
    if hostfile:
        return as_usage_error(lambda: parse_hosts(Path(hostfile).read_text()))
    return as_usage_error(lambda: parse_hosts(hosts)) if hosts is not None else []
