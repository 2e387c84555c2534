"""The cluster's operator commands: ``loopd move``, ``drain``, ``cordon``, ``uncordon``,
``takeover``."""

from __future__ import annotations

import json
from typing import Final

import click

from supervisor.cli.options import ETCD_URL
from supervisor.cli.tls_options import client_tls_options, cluster_tls_files, tls_files_given
from supervisor.client.control import call
from supervisor.cluster.errors import ClusterError, MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import check_node_name, move_key
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.routing import node_address
from supervisor.cluster.transport import TlsFiles
from supervisor.errors import ControlError
from supervisor.moves.move import MoveDone, MoveIntent, abort_move, move_session, node_home
from supervisor.moves.remote_move import NodeBusy, abort_remote, move_remote
from supervisor.moves.takeover import take_over
from supervisor.moves.takeover_remote import take_over_remote
from supervisor.node.cordon import cordon, uncordon
from supervisor.node.drain import drain_node
from worker.store.errors import InvalidSessionId
from worker.store.session_id import validate_session_id

MOVE_TIMEOUT: Final = 120.0
"""Seconds a node has to answer one step of a move (a pull streams the whole session)."""
_cluster_option = click.option(
    "--cluster",
    "url",
    envvar="LOOPD_CLUSTER",
    required=True,
    type=ETCD_URL,
    help="etcd URL, http(s)://host:port[,...] (or LOOPD_CLUSTER).",
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


class RemoteNodes:
    """A move's requests to nodes at ``tls://`` addresses, with the operator's certificate."""

    def __init__(self, client: EtcdClient, files: TlsFiles) -> None:
        self.client = client
        self.files = files
        self.links: dict[str, NodeLink] = {}

    def __call__(self, node: str, op: str, session: str) -> object:
        return self.request(node, op, session=session)

    def request(self, node: str, op: str, **fields: object) -> object:
        """One request with ``fields`` to ``node``; ClusterError naming it if refused."""
        link = self.links.get(node)
        if link is None:
            address = node_address(self.client, node)
            if address is None:
                raise ClusterError(f"node {node} is not registered (is it running?)")
            link = self.links[node] = NodeLink(address, node, self.files, timeout=MOVE_TIMEOUT)
        try:
            return link.call(op, **fields)
        except ControlError as exc:
            if op in ("stop", "forget") and exc.code == "not_found":
                return None  # nothing hosted there: nothing to stop or forget
            kind = NodeBusy if exc.code == "busy" else ClusterError
            raise kind(f"node {node}: {op} {fields.get('session')}: {exc}") from exc

    def close(self) -> None:
        for link in self.links.values():
            link.close()


def _remote(client: EtcdClient, node: str) -> RemoteNodes | None:
    """The remote mover's calls if ``node`` is reached over TLS, else None (one machine)."""
    address = node_address(client, node)
    if address is None or address.startswith("unix:"):
        return None
    files = tls_files_given()
    if files is None:
        raise ClusterError(f"node {node} is at {address}: give --tls-ca, --tls-cert and "
                           "--tls-key (an operator certificate)")  # fmt: skip
    return RemoteNodes(client, files)


def etcd_client(url: str) -> EtcdClient:
    """The etcd client of a command: with its TLS files for ``https://`` endpoints."""
    files = cluster_tls_files(url)
    return EtcdClient(url, tls=files.etcd_context() if files is not None else None)


def _move_source(client: EtcdClient, session: str) -> str:
    """The source node of the move of ``session`` in progress (MoveFailed if none)."""
    kv = client.get(move_key(session))
    if kv is None:
        raise MoveFailed(session, "abort", "no move is in progress")
    return MoveIntent.decode(session, kv.value).source


def _fail(exc: ClusterError) -> None:
    raise click.ClickException(str(exc)) from exc


def _check_names(session: str | None, *nodes: str | None) -> None:
    """A bad session id or node name given: one line saying which, before etcd is asked."""
    try:
        if session is not None:
            validate_session_id(session)
        for node in nodes:
            if node is not None:
                check_node_name(node)
    except (InvalidSessionId, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


@click.command()
@_cluster_option
@client_tls_options
@click.argument("session_id", metavar="ID")
@click.option("--to", "target", default=None, help="the node to move the session to.")
@click.option("--abort", is_flag=True, help="undo an interrupted move (before the target owns it).")
def move(url: str, session_id: str, target: str | None, abort: bool) -> None:
    """Move a session to another node (a rerun finishes an interrupted move)."""
    if (target is None) == (not abort):
        raise click.UsageError("give exactly one of --to NODE and --abort")
    _check_names(session_id, target)
    try:
        with etcd_client(url) as client:
            remote = _remote(client, target or _move_source(client, session_id))
            if target is None and remote is not None:
                try:
                    done = abort_remote(client, session_id, remote)
                finally:
                    remote.close()
            elif target is None:
                done = abort_move(client, session_id)
            elif remote is not None:
                try:
                    done = move_remote(client, session_id, target, remote)
                finally:
                    remote.close()
            else:
                done = move_session(client, session_id, target, control=DaemonControl())
    except ClusterError as exc:
        _fail(exc)
    else:
        click.echo(json.dumps({"session": done.session, "node": done.node, "token": done.token}))


@click.command()
@_cluster_option
@client_tls_options
@click.argument("node")
def drain(url: str, node: str) -> None:
    """Cordon NODE, then move every session of it to the other live nodes."""
    _check_names(None, node)
    try:
        with etcd_client(url) as client:
            remote = _remote(client, node)
            mover = None
            if remote is not None:
                calls = remote

                def mover(session: str, target: str) -> MoveDone:
                    return move_remote(client, session, target, calls)

            try:
                drained = drain_node(client, node, control=DaemonControl(), mover=mover)
            finally:
                if remote is not None:
                    remote.close()
    except ClusterError as exc:
        _fail(exc)
    else:
        for done in drained:
            click.echo(
                json.dumps({"session": done.session, "node": done.node, "token": done.token})
            )


@click.command("cordon")
@_cluster_option
@client_tls_options
@click.argument("node")
def cordon_command(url: str, node: str) -> None:
    """Place no new session on NODE (its sessions stay; `drain` moves them)."""
    try:
        with etcd_client(url) as client:
            cordon(client, node)
    except (ClusterError, ValueError) as exc:
        _fail(ClusterError(str(exc)))
    click.echo(json.dumps({"node": node, "cordoned": True}))


@click.command("uncordon")
@_cluster_option
@client_tls_options
@click.argument("node")
def uncordon_command(url: str, node: str) -> None:
    """Place new sessions on NODE again."""
    try:
        with etcd_client(url) as client:
            was = uncordon(client, node)
    except (ClusterError, ValueError) as exc:
        _fail(ClusterError(str(exc)))
    click.echo(json.dumps({"node": node, "cordoned": False, "was_cordoned": was}))


@click.command()
@_cluster_option
@client_tls_options
@click.argument("session_id", metavar="ID")
@click.option("--from-copy", "copy", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--to", "target", required=True, help="the node that takes the session over.")
def takeover(url: str, session_id: str, copy: str, target: str) -> None:
    """LOSSY: install a copy of a session whose node is gone for good (docs/scaling.md)."""
    try:
        with etcd_client(url) as client:
            remote = _remote(client, target)
            if remote is not None:
                try:
                    done = take_over_remote(client, session_id, copy, target, remote)
                finally:
                    remote.close()
            else:
                done = take_over(client, session_id, copy, target)
                home, _lease = node_home(client, target)
        if remote is None:
            DaemonControl().start(target, home, session_id)
    except ClusterError as exc:
        _fail(exc)
    else:
        click.echo(json.dumps({"session": done.session, "node": done.node, "token": done.token}))
