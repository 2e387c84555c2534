"""``loopd create ID``: a new session, on a home or on the least loaded node of a cluster."""

from __future__ import annotations

import sys
from typing import Final

import click

from supervisor.cli import tls_options as tls
from supervisor.cli.daemon_commands import (
    MAX_SLOT,
    _call,
    _cluster_fail,
    _home_or_cluster,
    _print_status,
)
from supervisor.cli.options import (
    EXIT_ERROR,
    client_home_option,
    cluster_option,
    retired_replicas_option,
    timeout_option,
)
from supervisor.cluster.errors import ClusterError
from supervisor.errors import ControlError


@click.command()
@client_home_option
@cluster_option
@tls.client_tls_options
@timeout_option
@click.argument("session_id", metavar="ID")
@click.option("--slot", type=click.IntRange(0, MAX_SLOT), default=0, show_default=True)
@retired_replicas_option
@click.option(
    "--app",
    "app",
    default=None,
    help="the named App ([apps.NAME] of loopd.toml) the session runs, now and at every "
    "restart (default: serve's --app).",
)
def create(
    home: str | None,
    cluster: str | None,
    timeout: float,
    session_id: str,
    slot: int,
    app: str | None,
) -> None:
    """Create session ID and start its worker (with --cluster: on the least loaded node)."""
    if _home_or_cluster(home, cluster) is not None:
        assert home is not None
        _print_status([_call(home, "create", timeout, session=session_id, slot=slot, app=app)])
        return
    if app is not None:
        click.echo("loopd create: --app is for a home's named Apps, not --cluster", err=True)
        sys.exit(EXIT_ERROR)
    assert cluster is not None
    try:
        with tls.cluster_client(cluster, timeout=timeout) as client:
            row = client.create(session_id, slot=slot)
    except (ClusterError, ControlError) as exc:
        _cluster_fail("create", exc)
    _print_status([row])


COMMANDS: Final = (create,)
