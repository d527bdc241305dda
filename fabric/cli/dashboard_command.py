"""``fabric dashboard``: the broker's dashboard in a browser, signed in.

Rule: a thin shell over ``fabric.client.dashboard``: finds the address and the admin token
as ``fabric admin`` finds them, asks for a one-time sign-in link, prints the dashboard's
address and opens the link in a browser where one exists. The token is never printed.
"""

from __future__ import annotations

import sys
import webbrowser

import click

from fabric.cli.admin_commands import ADMIN_EXIT_CODES, admin_exit_code
from fabric.cli.options import token_options
from fabric.core.config import resolve_secret
from fabric.core.errors import FabricError


@click.command(epilog=ADMIN_EXIT_CODES)
@click.option("--url", default=None, metavar="URL",
              help="The broker's metrics address, http://HOST:PORT/metrics (the dashboard is "
                   "served beside it) [default: the admin file's].")
@click.option("--admin-file", type=click.Path(dir_okay=False), default=None,
              help="The admin file fabric cluster up wrote for operators [default: "
                   "$FABRIC_ADMIN_FILE, else ~/.config/fabric/cluster-admin.json if it "
                   "exists].")
@token_options("", "FABRIC_ADMIN_TOKEN", "admin token")
@click.option("--no-browser", is_flag=True,
              help="Only print the addresses; open no browser.")
@click.option("--timeout", type=float, default=5.0, show_default=True,
              help="Seconds to wait for the dashboard's answer.")
def dashboard(url: str | None, admin_file: str | None, token: str | None,
              token_file: str | None, no_browser: bool, timeout: float) -> None:
    """Open the broker's dashboard (devices, sessions, lost workers, live) in a browser.

    The broker serves it beside its Prometheus metrics, so it needs --metrics (fabric
    cluster up --metrics HOST:PORT). It is an admin view: this command shows the admin token
    to the broker and opens a sign-in link that works once, within a minute; the page
    itself asks for the token where that link is too old.
    """
    from fabric.client.admin import ADMIN_TOKEN_ENV
    from fabric.client.dashboard import find_dashboard, sign_in_link

    try:
        address, admin_token = find_dashboard(
            url, token=resolve_secret(token, token_file, ADMIN_TOKEN_ENV),
            admin_file=admin_file)
        link = sign_in_link(address, admin_token, timeout)
    except FabricError as exc:
        click.echo(f"fabric dashboard: {' '.join(str(exc).splitlines())}", err=True)
        sys.exit(admin_exit_code(exc))
    click.echo(f"dashboard: {address}")
    click.echo(f"sign in (once, within a minute): {link}")
    if not no_browser and not webbrowser.open(link):
        click.echo("fabric dashboard: no browser found here: open the sign-in link in one",
                   err=True)
