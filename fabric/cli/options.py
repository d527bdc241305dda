"""The options the ``fabric`` commands share: tokens, CURVE keys, limits and timing.

Rule: an option's name, default and help text are written once, here; a decorator hands a
command one value where several options make it (``curve``, ``limits``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable

import click
from click.core import ParameterSource

from fabric.core.addresses import check_endpoint
from fabric.core.config import resolve_secret
from fabric.core.errors import FabricError
from fabric.core.flow import DEFAULT_PAIR_HEARTBEAT, DEFAULT_PAIR_LIVENESS
from fabric.core.security import CurveClient, CurveServer


def token_options(role: str, env: str, what: str | None = None,
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--{role}token`` and ``--{role}token-file`` options, also read from ``env``;
    ``what`` names the token in the help [default: the role's token]."""
    what = what or f"{role or 'client '}token"

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option(
            f"--{role}token-file", type=click.Path(dir_okay=False),
            help=f"File holding the {what} (mode 0600; - reads it from the first line of "
                 "standard input). Takes precedence "
                 f"over ${env} and --{role}token. Whitespace around a token (a trailing "
                 "newline or space) is ignored in all three.")(command)
        return click.option(
            f"--{role}token", metavar="TOKEN",
            help=f"The {what} itself (visible in ps; prefer the file or "
                 f"${env}).")(command)
    return decorate


def required_secret(value: str | None, file: str | None, env: str, what: str) -> str:
    """The secret from ``file``, ``env`` or ``value`` (``resolve_secret``); a usage error
    naming the options when there is none."""
    try:
        secret = resolve_secret(value, file, env)
    except FabricError as exc:
        raise click.UsageError(exc.message) from None
    if not secret:
        raise click.UsageError(f"No {what} given: use --{what.replace(' ', '-')}-file, "
                               f"${env} or --{what.replace(' ', '-')}.")
    return secret


timing_options = [
    click.option("--heartbeat", type=float, default=1.0, show_default=True,
                 help="Seconds between heartbeats between broker and workers."),
    click.option("--liveness", type=int, default=3, show_default=True,
                 help="Heartbeats a link may miss before its peer is declared lost "
                      "(stopped or cut off: a busy peer's link still answers)."),
    click.option("--log-level", default="info", show_default=True,
                 type=click.Choice(["debug", "info", "warning", "error"]),
                 help="How much to log to stderr (tokens are never logged)."),
]


def _metrics_address(ctx: click.Context, param: click.Parameter,
                     value: str | None) -> str | None:
    from fabric.broker.metrics import parse_address

    if value is not None:
        try:
            parse_address(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


metrics_option = click.option(
    "--metrics", metavar="HOST:PORT", default=None, callback=_metrics_address,
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (a port alone: on loopback; "
         "port 0 picks a free one) [default: not served]. Bound only there: anyone who can "
         "reach it sees the cluster's figures (never a token or session id).")


def as_usage_error(call: Callable[[], Any]) -> Any:
    """``call()``, with a ConfigError (a bad key file, say) turned into a usage error."""
    try:
        return call()
    except FabricError as exc:
        raise click.UsageError(exc.message) from None


def checked(check: Callable[[str], str]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback that passes an option's value through ``check`` (a function of
    ``fabric.core.addresses``): its ConfigError becomes the option's usage error (exit 2)."""

    def callback(_: click.Context, parameter: click.Parameter, value: Any) -> Any:
        try:
            return None if value is None else check(value)
        except FabricError as exc:
            raise click.BadParameter(exc.message, param=parameter) from None

    return callback


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
        if not (clients and workers):
            raise click.UsageError(
                "--curve-secret-key needs the public keys it admits: --curve-allow DIR (or "
                "--curve-allow-clients and --curve-allow-workers). A broker admits no peer "
                "without an allowed key or a token; fabric keys generate writes both lists.")
        curve = as_usage_error(lambda: CurveServer.from_files(
            curve_secret_key or keydir / "broker.key_secret", allow_clients=clients,
            allow_workers=workers))
        return command(*args, curve=curve, **kwargs)

    directory = click.Path(file_okay=False)
    for option in reversed([
        click.option("--curve", "curve_dir", type=directory, metavar="KEYDIR",
                     help="Encrypt both sockets with CURVE using the keys fabric keys generate "
                          "wrote: KEYDIR/broker.key_secret, and only the client keys in "
                          "KEYDIR/clients and worker keys in KEYDIR/workers get in."),
        click.option("--curve-secret-key", type=click.Path(dir_okay=False), metavar="FILE",
                     help="The broker's CURVE secret key file (mode 0600), instead of --curve; "
                          "give the allow-lists with it."),
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
                curve = as_usage_error(lambda: CurveClient.from_dir(curve_dir, role))
            elif curve_secret_key:
                curve = as_usage_error(lambda: CurveClient.from_files(curve_secret_key,
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
    from fabric.core.flow import (DEFAULT_HWM, DEFAULT_MAX_MESSAGE_BYTES,
                                  DEFAULT_MAX_SESSIONS_PER_CLIENT, DEFAULT_MAX_SESSIONS_PER_DEVICE,
                                  DEFAULT_PEER_QUEUE)

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
            click.option("--max-sessions-per-token", type=count, default=None,
                         help="Sessions one client token may hold on one device, over all "
                              "its connections; more are refused [default: the per-device "
                              "limit shared evenly among the client tokens]."),
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
             "max_sessions_per_token", "peer_queue", "slow_peer_timeout"]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            limits = {name: kwargs.pop(name) for name in names if name in kwargs}
            return command(*args, limits=limits, **kwargs)

        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper
    return decorate


def renamed_option(old: str, new: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Keep ``old``, the former spelling of the command's option ``new``, working for one
    release: hidden from --help, it sets ``new`` and says on stderr to use ``new``. Put it
    right above the function."""
    old_name = "renamed_" + old.lstrip("-").replace("-", "_")
    new_name = new.lstrip("-").replace("-", "_")

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            value = kwargs.pop(old_name)
            if value is not None:
                context = click.get_current_context()
                if context.get_parameter_source(new_name) is ParameterSource.COMMANDLINE:
                    raise click.UsageError(f"Give {new} alone: {old} is its old spelling.")
                click.echo(f"{context.command_path}: {old} is deprecated and goes in the next "
                           f"release: use {new}.", err=True)
                kwargs[new_name] = value
            return command(*args, **kwargs)

        return click.option(old, old_name, default=None, hidden=True)(wrapper)
    return decorate


def with_options(options: list[Callable[..., Any]],
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Apply ``options`` to a command, the first one outermost (as written above it)."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def pair_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """A broker's place in a pair (``fabric.broker.pair``), handed to ``command`` as one
    ``pair`` (a PairSettings, or None without ``--peer``). Put it right above the function."""
    @functools.wraps(command)
    def wrapper(*args: Any, peer: str | None, pair_address: str | None, role: str | None,
                pair_heartbeat: float, pair_liveness: int, **kwargs: Any) -> Any:
        if peer is None:
            if pair_address is not None or role is not None:
                raise click.UsageError("--pair-address, --primary and --backup need --peer, "
                                       "the other broker's --pair-address.")
            return command(*args, pair=None, **kwargs)
        if pair_address is None or role is None:
            raise click.UsageError("--peer needs --pair-address (this broker's state socket) "
                                   "and --primary or --backup (one of each in a pair).")
        from fabric.broker.pair import PairSettings  # (the broker loads only when it runs)

        return command(*args, pair=PairSettings(peer, pair_address, role == "primary",
                                                pair_heartbeat, pair_liveness), **kwargs)

    endpoint = checked(check_endpoint)
    for option in reversed([
        click.option("--peer", default=None, metavar="ADDR", callback=endpoint,
                     help="The other broker of a pair: its --pair-address. This broker then "
                          "serves only while the pair makes it active (Binary Star)."),
        click.option("--pair-address", default=None, metavar="ADDR",
                     help="Where this broker says its state to its peer (its --peer)."),
        click.option("--primary", "role", flag_value="primary", default=None,
                     help="This broker is the pair's primary: it serves first."),
        click.option("--backup", "role", flag_value="backup",
                     help="This broker is the pair's backup: it takes over when the primary "
                          "is silent past the pair's liveness and a client or worker comes."),
        click.option("--pair-heartbeat", type=click.FloatRange(min=0.01),
                     default=DEFAULT_PAIR_HEARTBEAT, show_default=True,
                     help="Seconds between the pair's state heartbeats."),
        click.option("--pair-liveness", type=click.IntRange(min=1),
                     default=DEFAULT_PAIR_LIVENESS, show_default=True,
                     help="State heartbeats the peer may miss before it counts as gone."),
    ]):
        wrapper = option(wrapper)
    return wrapper
