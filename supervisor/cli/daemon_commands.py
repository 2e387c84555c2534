"""Commands that run or talk to the daemon: serve, create, send, compact, start, stop,
status (restart: ops_commands)."""

from __future__ import annotations

import json
import sys
from typing import Final, NoReturn, cast

import click

from supervisor.cli import tls_options as tls
from supervisor.cli.options import (
    ETCD_URL,
    client_home_option,
    cluster_option,
    home_option,
    timeout_option,
)
from supervisor.cli.tail_command import print_stream
from supervisor.client.control import call, not_utf8, statuses
from supervisor.client.direct import Client
from supervisor.client.status_table import status_lines, with_node_column
from supervisor.cluster.errors import ClusterError
from supervisor.daemon.loop import ServeConfig, Supervisor
from supervisor.daemon.poison import DEFAULT_POISON_AFTER
from supervisor.daemon.spawn import StartMethod
from supervisor.errors import ControlError, HomeLocked, ServeError
from supervisor.hosting.apps import AppConfigError, check_all
from supervisor.hosting.bounds import seconds
from supervisor.hosting.config import (
    CONFIG_NAME,
    ConfigError,
    config_path,
    merge_config,
    option_specs,
    read_apps,
    render_config,
)
from supervisor.hosting.settings import hosting_options, settings_from
from worker.heartbeat import MAX_TURN_KEYS
from worker.turns import DEFAULT_MAX_BATCH

EXIT_ERROR: Final = 1
MAX_BUDGET: Final = 1 << 40
MAX_RESTARTS: Final = 1_000_000
MAX_LEASE_TTL: Final = 3600
MAX_SLOT: Final = (1 << 63) - 1
"""A slot is stored in the log as a JSON integer; past int64 no other reader takes it."""
STATUS_COLUMNS: Final = (
    "session", "state", "pid", "epoch", "records", "restarts", "uptime_s", "rss_bytes", "cpu_s",
    "last_error",
)  # fmt: skip


def _call(home: str, op: str, timeout: float, **fields: object) -> object:
    try:
        return call(home, op, timeout=timeout, **fields)
    except ControlError as exc:
        _fail(op, exc)


def _fail(op: str, exc: ControlError) -> NoReturn:
    click.echo(f"loopd {op}: {exc.message} [{exc.code}]", err=True)
    sys.exit(EXIT_ERROR)


@click.command()
@home_option
@click.option("--app", default=None, help="module:attribute of the app (default: echo app).")
@click.option(
    "--budget",
    type=click.IntRange(1, MAX_BUDGET),
    default=None,
    help="context tokens before an epoch commit.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(0, MAX_RESTARTS),
    default=5,
    show_default=True,
    help="more restarts than this within --restart-window is FATAL.",
)
@click.option(
    "--restart-window",
    type=seconds(0.0),
    default=10.0,
    show_default=True,
    help="seconds over which restarts are counted.",
)
@click.option(
    "--backoff-base",
    type=seconds(0.0),
    default=0.1,
    show_default=True,
    help="seconds before the second restart in a row; doubles each time.",
)
@click.option(
    "--backoff-max",
    type=seconds(0.0),
    default=5.0,
    show_default=True,
    help="longest backoff, seconds.",
)
@click.option(
    "--stable-after",
    type=seconds(0.0),
    default=5.0,
    show_default=True,
    help="uptime, seconds, after which the backoff streak is forgotten.",
)
@click.option(
    "--hang-timeout",
    type=seconds(0.1),
    default=30.0,
    show_default=True,
    help="seconds without a heartbeat from a worker's loop before it is killed and restarted.",
)
@click.option(
    "--request-deadline",
    type=seconds(0.01),
    default=None,
    help="seconds one request may take, from its start or its App's last "
    "worker.turn.progress() call, before its worker is killed (default: no deadline).",
)
@click.option(
    "--max-batch",
    type=click.IntRange(min=1, max=MAX_TURN_KEYS),
    default=DEFAULT_MAX_BATCH,
    show_default=True,
    help="requests handed to the App together at most; fewer while the App is slow "
    "(chunks are sized to half the hang timeout).",
)
@click.option(
    "--poison-after",
    type=click.IntRange(min=1, max=1000),
    default=DEFAULT_POISON_AFTER,
    show_default=True,
    help="deaths of a worker with the same request key in flight, after which that "
    "request is refused (poison_request) and the session serves the others.",
)
@click.option(
    "--start-method",
    type=click.Choice([m.value for m in StartMethod]),
    default=StartMethod.FORK.value,
    show_default=True,
    help="fork: workers fork from the warm supervisor (fast restarts); "
    "exec: each worker is a fresh interpreter.",
)
@hosting_options
@tls.serve_tls_options
@click.option(
    "--cluster",
    envvar="LOOPD_CLUSTER",
    default=None,
    type=ETCD_URL,
    help="etcd URL(s) http(s)://host:port[,...]: serve as a node of a cluster (docs/scaling.md).",
)
@click.option("--node", default=None, help="this node's name in the cluster.")
@click.option(
    "--lease-ttl",
    type=click.IntRange(1, MAX_LEASE_TTL),
    default=None,
    help="seconds of the node's etcd lease (default 10); writes stop after 2/3 of it "
    "without a renewal.",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, 9),
    default=None,
    help="with --cluster: the copies of a session created on this node whose create does "
    "not say (default 1; docs/scaling.md, Replication).",
)
@click.option(
    "--zone",
    default=None,
    help="with --cluster: this node's zone (a rack, a data centre), registered with it: a "
    "replicated session's copies go to nodes in different zones while there are enough.",
)
@click.option(
    "--print-config",
    is_flag=True,
    help=f"print the settings (<home>/{CONFIG_NAME} under these flags) as TOML, and exit.",
)
@click.pass_context
def serve(ctx: click.Context, /, home: str, print_config: bool, **params: object) -> None:
    """Run the supervisor for HOME until SIGTERM or SIGINT (then stop every worker, exit 0).

    Every option may also be set in HOME/loopd.toml (key: the flag without its dashes);
    flags given here win.
    """
    specs = option_specs(serve, exclude=frozenset({"home", "print_config"}))
    try:
        merged = merge_config(ctx, params, specs, config_path(home))
        apps = read_apps(config_path(home))
    except (ConfigError, AppConfigError) as exc:
        click.echo(f"loopd serve: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    if print_config:
        click.echo(render_config(merged, specs, apps), nl=False)
        return
    hosting = settings_from(merged)
    get = merged.get
    try:
        check_all(apps, cast("str | None", get("app")))
    except AppConfigError as exc:
        click.echo(f"loopd serve: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    config = ServeConfig(
        home=home, app=cast("str | None", get("app")), budget=cast("int | None", get("budget")),
        max_restarts=cast(int, get("max_restarts")), window=cast(float, get("restart_window")),
        backoff_base=cast(float, get("backoff_base")), backoff_cap=cast(float, get("backoff_max")),
        stable_after=cast(float, get("stable_after")),
        start_method=StartMethod(cast(str, get("start_method"))),
        hang_timeout=cast(float, get("hang_timeout")),
        request_deadline=cast("float | None", get("request_deadline")), hosting=hosting,
        max_batch=cast(int, get("max_batch")), poison_after=cast(int, get("poison_after")),
        cluster=cast("str | None", get("cluster")), node=cast("str | None", get("node")),
        lease_ttl=cast("int | None", get("lease_ttl")), apps=apps,
        replicas=cast("int | None", get("replicas")), zone=cast("str | None", get("zone")),
        listen=cast("str | None", get("listen")), tls=tls.tls_files(*map(get, tls.TLS_PARAMS)),
    )  # fmt: skip
    try:
        code = Supervisor(config).run()
    except (HomeLocked, ServeError) as exc:
        click.echo(f"loopd serve: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    sys.exit(code)


def _home_or_cluster(home: str | None, cluster: str | None) -> str | None:
    """The home to talk to, or None for the cluster; a usage error unless exactly one is given."""
    if (home is None) == (cluster is None):
        raise click.UsageError("give exactly one of --home and --cluster")
    return home


def _cluster_fail(op: str, exc: ClusterError | ControlError) -> NoReturn:
    click.echo(f"loopd {op}: {exc}", err=True)
    sys.exit(EXIT_ERROR)


@click.command()
@client_home_option
@cluster_option
@tls.client_tls_options
@timeout_option
@click.argument("session_id", metavar="ID")
@click.argument("text")
@click.option(
    "--key",
    default=None,
    help="request key: the request is applied once for the life of the session, however "
    "often and from whichever process it is sent with this key; a retry is answered from "
    "the log (default: a new key).",
)
@click.option("--untrusted", is_flag=True, help="mark the text as untrusted input.")
@click.option(
    "--stream",
    "streamed",
    is_flag=True,
    help="print the App's partial output as it comes (not durable), then the reply.",
)
def send(
    home: str | None,
    cluster: str | None,
    timeout: float,
    session_id: str,
    text: str,
    key: str | None,
    untrusted: bool,
    streamed: bool,
) -> None:
    """Send TEXT to session ID (straight to its worker) and print the reply."""
    for name, value in (("ID", session_id), ("TEXT", text), ("--key", key)):
        problem = not_utf8(value) if value is not None else None
        if problem is not None:
            raise click.BadParameter(problem, param_hint=name)
    if _home_or_cluster(home, cluster) is None:
        assert cluster is not None
        if streamed:
            click.echo("loopd send: --stream is for a home (--home), not --cluster", err=True)
            sys.exit(EXIT_ERROR)
        try:
            with tls.cluster_client(cluster, timeout=timeout) as routed:
                result = routed.send(session_id, text, key=key, untrusted=untrusted)
        except (ClusterError, ControlError) as exc:
            _cluster_fail("send", exc)
        click.echo(json.dumps(result, sort_keys=True))
        return
    assert home is not None
    try:
        with Client(home, timeout=timeout, retry_for=timeout) as client:
            if streamed:
                result = print_stream(client.stream(session_id, text, key=key, untrusted=untrusted))
            else:
                result = client.send(session_id, text, key=key, untrusted=untrusted)
    except ControlError as exc:
        _fail("send", exc)
    click.echo(json.dumps(result, sort_keys=True))


@click.command()
@home_option
@click.argument("session_id", metavar="ID")
@click.option("--summary", default=None, help="the epoch's summary (default: the app's).")
@timeout_option
def compact(home: str, session_id: str, summary: str | None, timeout: float) -> None:
    """Close session ID's epoch now and start the next one."""
    click.echo(json.dumps(_call(home, "compact", timeout, session=session_id, summary=summary)))


def _lifecycle(op: str, doc: str) -> click.Command:
    @click.command(name=op, help=doc)
    @home_option
    @timeout_option
    @click.argument("session_id", metavar="ID")
    def command(home: str, timeout: float, session_id: str) -> None:
        _print_status([_call(home, op, timeout, session=session_id)])

    return command


start = _lifecycle("start", "Start session ID's worker (also out of FATAL).")
stop = _lifecycle("stop", "Stop session ID's worker: SIGTERM, a deadline, SIGKILL.")


@click.command()
@client_home_option
@cluster_option
@tls.client_tls_options
@click.argument("session_id", metavar="[ID]", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array, one object a session.")
@timeout_option
def status(
    home: str | None, cluster: str | None, session_id: str | None, as_json: bool, timeout: float
) -> None:
    """Show each session: state, pid, epoch, records, restarts, uptime, rss, last error."""
    if _home_or_cluster(home, cluster) is None:
        assert cluster is not None
        try:
            with tls.cluster_client(cluster, timeout=timeout) as client:
                rows = [
                    r
                    for r in client.status()
                    if session_id is None
                    or (isinstance(r, dict) and r.get("session") == session_id)
                ]
        except (ClusterError, ControlError) as exc:
            _cluster_fail("status", exc)
    else:
        assert home is not None
        if session_id is not None:
            result = _call(home, "status", timeout, session=session_id)
            rows = result if isinstance(result, list) else []
        else:
            try:
                rows = list(statuses(home, timeout=timeout))
            except ControlError as exc:
                _fail("status", exc)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        _print_status(rows)


def _print_status(rows: list[object]) -> None:
    for line in status_lines(rows, with_node_column(STATUS_COLUMNS, rows)):
        click.echo(line)


COMMANDS: Final = (serve, send, compact, start, stop, status)  # create: create_command.py
