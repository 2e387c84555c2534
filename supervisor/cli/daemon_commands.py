"""Commands that talk to the daemon: send, compact, start, stop,
status (restart: ops_commands)."""

from __future__ import annotations

import json
import sys
from typing import Final, NoReturn

import click

from supervisor.cli import tls_options as tls
from supervisor.cli.options import (
    EXIT_ERROR,
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
from supervisor.errors import ControlError

MAX_BUDGET: Final = 1 << 40
MAX_RESTARTS: Final = 1_000_000
MAX_LEASE_TTL: Final = 3600
MAX_SLOT: Final = (1 << 63) - 1
"""A slot is stored in the log as a JSON integer; past int64 no other reader takes it."""
STATUS_COLUMNS: Final = (
    "session", "state", "pid", "epoch", "records", "restarts", "uptime_s", "rss_bytes", "cpu_s",
    "scheduled", "next_due", "app", "app_version", "last_error",
)  # fmt: skip


def _call(home: str, op: str, timeout: float, **fields: object) -> object:
    try:
        return call(home, op, timeout=timeout, **fields)
    except ControlError as exc:
        _fail(op, exc)


def _fail(op: str, exc: ControlError, *, key: str | None = None) -> NoReturn:
    more = _send_again(exc.code, key) if op == "send" else ""
    click.echo(f"loopd {op}: {exc.message} [{exc.code}]{more}", err=True)
    sys.exit(EXIT_ERROR)


_UNACKNOWLEDGED: Final = frozenset(
    {"DatabaseUnavailable", "LostBeforeWrite", "OutcomeUnknown", "SessionIOError", "timeout"}
)
"""Codes of a send that was not acknowledged, whose store (or worker) may serve it again."""


def _send_again(code: str, key: str | None) -> str:
    """What an operator does after a send failed for the store: send it again by key."""
    if code not in _UNACKNOWLEDGED:
        return ""
    if key is None:
        return " -- not acknowledged (with --key, a request sent again is applied once)"
    return f" -- not acknowledged: send it again with --key {key} (applied once, whatever came)"


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
        _fail("send", exc, key=key)
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
        if home is not None and rows:
            _print_older(home, timeout)


def _print_status(rows: list[object]) -> None:
    for line in status_lines(rows, with_node_column(STATUS_COLUMNS, rows)):
        click.echo(line)


def _print_older(home: str, timeout: float) -> None:
    """How many sessions' epochs name an older App version than a worker would load now."""
    try:
        found = call(home, "app_versions", timeout=timeout)
    except ControlError:
        return  # a daemon from before App versions: the table says what it can
    rows = found.get("sessions") if isinstance(found, dict) else None
    if not isinstance(found, dict) or not isinstance(rows, list):
        return
    failed = [r for r in rows if isinstance(r, dict) and r.get("error") is not None]
    if not found.get("older") and not failed:
        return  # every session runs what a worker would load now: nothing to say
    click.echo(f"{found.get('older')} of {len(rows)} session(s) run an older App version "
               "than a worker started now would load (loopd upgrade)")  # fmt: skip
    for row in failed:
        click.echo(f"  {row.get('session')}: {row.get('loads')} {row.get('error')}")


COMMANDS: Final = (send, compact, start, stop, status)  # create, serve: modules of their own
