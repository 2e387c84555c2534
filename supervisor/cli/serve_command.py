"""``loopd serve``: the supervisor daemon (its own module: the other daemon commands are
clients and never load the daemon's loop)."""

from __future__ import annotations

import sys
from typing import Final, cast

import click

from supervisor.cli import tls_options as tls
from supervisor.cli.options import (
    ETCD_URL,
    EXIT_ERROR,
    home_option,
    retired_replicas_option,
)
from supervisor.daemon.loop import ServeConfig, Supervisor
from supervisor.errors import HomeLocked, ServeError
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
from supervisor.http.tokens import read_tokens
from supervisor.sessions.poison import DEFAULT_POISON_AFTER
from supervisor.sessions.spawn import StartMethod
from worker.ipc.heartbeat import MAX_TURN_KEYS
from worker.loop.turns import DEFAULT_MAX_BATCH

MAX_BUDGET: Final = 1 << 40
MAX_RESTARTS: Final = 1_000_000
MAX_LEASE_TTL: Final = 3600


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
    "--start-retries",
    type=click.IntRange(0, MAX_RESTARTS),
    default=5,
    show_default=True,
    help="more starts than this in a row that never reach ready are FATAL, however slow.",
)
@click.option(
    "--start-timeout",
    type=seconds(0.1),
    default=60.0,
    show_default=True,
    help="seconds a worker may take to say ready (its App's import and factory); "
    "then it is killed, a failed start.",
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
    "worker.app.turn.progress() call, before its worker is killed (default: no deadline).",
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
    default=StartMethod.AUTO.value,
    show_default=True,
    help="auto: template for every App but loopd's built-in default App, whose workers "
    "fork from the warm supervisor; template: workers fork from their App's template, a "
    "child that imported the App once (docs/templates.md); fork: workers fork from the "
    "warm supervisor and import their App themselves; exec: each worker is a fresh "
    "interpreter.",
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
@retired_replicas_option
@click.option(
    "--store",
    envvar="LOOPD_STORE",
    default=None,
    help="a libpq URI (postgresql://...): the sessions live in this database, not in HOME "
    "(pip install 'loopd[postgres]'; docs/scaling.md, section 0).",
)
@click.option(
    "--store-wait",
    type=seconds(0.0),
    default=0.0,
    show_default=True,
    help="with --store: seconds to wait at start for a database that does not answer yet "
    "(a boot that starts loopd first), instead of refusing it at once.",
)
@click.option(
    "--require-sync-replication",
    is_flag=True,
    help="with --store: refuse to start unless the server replicates synchronously "
    "(synchronous_commit and synchronous_standby_names).",
)
@click.option(
    "--http",
    default=None,
    metavar="HOST:PORT",
    help="serve the HTTP API (docs/http.md) at HOST:PORT, e.g. 127.0.0.1:8080.",
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
    specs = option_specs(serve, exclude=frozenset({"home", "print_config", "replicas"}))
    try:
        merged = merge_config(ctx, params, specs, config_path(home))
        apps = read_apps(config_path(home))
        tokens = read_tokens(config_path(home))  # [tenants]: the HTTP port's bearer tokens
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
        start_retries=cast(int, get("start_retries")),
        start_timeout=cast(float, get("start_timeout")),
        backoff_base=cast(float, get("backoff_base")), backoff_cap=cast(float, get("backoff_max")),
        stable_after=cast(float, get("stable_after")),
        start_method=StartMethod(cast(str, get("start_method"))),
        hang_timeout=cast(float, get("hang_timeout")),
        request_deadline=cast("float | None", get("request_deadline")), hosting=hosting,
        max_batch=cast(int, get("max_batch")), poison_after=cast(int, get("poison_after")),
        cluster=cast("str | None", get("cluster")), node=cast("str | None", get("node")),
        lease_ttl=cast("int | None", get("lease_ttl")), apps=apps,
        listen=cast("str | None", get("listen")), tls=tls.tls_files(*map(get, tls.TLS_PARAMS)),
        store=cast("str | None", get("store")),
        require_sync_replication=cast(bool, get("require_sync_replication")),
        store_wait=cast(float, get("store_wait")),
    )  # fmt: skip
    http = None
    try:
        # Its own thread and loop, a client of the daemon like any other (docs/http.md).
        # Bound first (a port in use is said before anything starts), listening only once
        # the control socket does: a call let in earlier would be answered no_daemon.
        if get("http") is not None:
            from supervisor.http.server import bind_http  # noqa: PLC0415 - --http only

            http = bind_http(cast(str, get("http")), home, tokens)
        daemon = Supervisor(config)
        code = daemon.run() if http is None else daemon.run(on_listening=http.listen)
    except (HomeLocked, ServeError) as exc:
        click.echo(f"loopd serve: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    finally:
        if http is not None:
            http.close()
    sys.exit(code)


COMMANDS: Final = (serve,)
