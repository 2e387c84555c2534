"""The cluster's operator commands: ``loopd move``, ``drain``, ``cordon``, ``uncordon``,
``takeover``."""

from __future__ import annotations

import json

import click

from supervisor.cli.options import ETCD_URL
from supervisor.client.control import call
from supervisor.cluster.cordon import cordon, uncordon
from supervisor.cluster.drain import drain_node
from supervisor.cluster.errors import ClusterError
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.move import abort_move, move_session, node_home
from supervisor.cluster.takeover import take_over
from supervisor.errors import ControlError

_cluster_option = click.option(
    "--cluster",
    "url",
    envvar="LOOPD_CLUSTER",
    required=True,
    type=ETCD_URL,
    help="etcd URL, http://host:port (or LOOPD_CLUSTER).",
)


class DaemonControl:
    """Stops and starts a session's worker through the node's ``loopd serve``, if one runs."""

    def stop(self, node: str, home: str, session: str) -> None:
        """Stop the worker so that its lock is free; no daemon means nothing runs."""
        self._call(home, "stop", session)

    def start(self, node: str, home: str, session: str) -> None:
        """Have the new node claim the moved session and serve it."""
        self._call(home, "adopt", session)

    def release(self, node: str, home: str, session: str) -> None:
        """Have the old node stop listing the session."""
        self._call(home, "forget", session)

    @staticmethod
    def _call(home: str, op: str, session: str) -> None:
        try:
            call(home, op, timeout=30.0, session=session)
        except ControlError as exc:
            if exc.code not in {"no_daemon", "not_found"}:
                raise ClusterError(f"{home}: {op} {session}: {exc}") from exc


def _fail(exc: ClusterError) -> None:
    raise click.ClickException(str(exc)) from exc


@click.command()
@_cluster_option
@click.argument("session_id", metavar="ID")
@click.option("--to", "target", default=None, help="the node to move the session to.")
@click.option("--abort", is_flag=True, help="undo an interrupted move (before the target owns it).")
def move(url: str, session_id: str, target: str | None, abort: bool) -> None:
    """Move a session to another node (a rerun finishes an interrupted move)."""
    if (target is None) == (not abort):
        raise click.UsageError("give exactly one of --to NODE and --abort")
    try:
        with EtcdClient(url) as client:
            if target is None:
                done = abort_move(client, session_id)
            else:
                done = move_session(client, session_id, target, control=DaemonControl())
    except ClusterError as exc:
        _fail(exc)
    else:
        click.echo(json.dumps({"session": done.session, "node": done.node, "token": done.token}))


@click.command()
@_cluster_option
@click.argument("node")
def drain(url: str, node: str) -> None:
    """Cordon NODE, then move every session of it to the other live nodes."""
    try:
        with EtcdClient(url) as client:
            moves = drain_node(client, node, control=DaemonControl())
    except ClusterError as exc:
        _fail(exc)
    else:
        for done in moves:
            click.echo(
                json.dumps({"session": done.session, "node": done.node, "token": done.token})
            )


@click.command("cordon")
@_cluster_option
@click.argument("node")
def cordon_command(url: str, node: str) -> None:
    """Place no new session on NODE (its sessions stay; `drain` moves them)."""
    try:
        with EtcdClient(url) as client:
            cordon(client, node)
    except (ClusterError, ValueError) as exc:
        _fail(ClusterError(str(exc)))
    click.echo(json.dumps({"node": node, "cordoned": True}))


@click.command("uncordon")
@_cluster_option
@click.argument("node")
def uncordon_command(url: str, node: str) -> None:
    """Place new sessions on NODE again."""
    try:
        with EtcdClient(url) as client:
            was = uncordon(client, node)
    except (ClusterError, ValueError) as exc:
        _fail(ClusterError(str(exc)))
    click.echo(json.dumps({"node": node, "cordoned": False, "was_cordoned": was}))


@click.command()
@_cluster_option
@click.argument("session_id", metavar="ID")
@click.option("--from-copy", "copy", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--to", "target", required=True, help="the node that takes the session over.")
def takeover(url: str, session_id: str, copy: str, target: str) -> None:
    """LOSSY: install a copy of a session whose node is gone for good (docs/scaling.md)."""
    try:
        with EtcdClient(url) as client:
            done = take_over(client, session_id, copy, target)
            home, _lease = node_home(client, target)
        DaemonControl().start(target, home, session_id)
    except ClusterError as exc:
        _fail(exc)
    else:
        click.echo(json.dumps({"session": done.session, "node": done.node, "token": done.token}))
