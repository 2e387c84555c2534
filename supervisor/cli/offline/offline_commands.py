"""Offline, read-only commands: ``inspect`` and ``verify`` (no daemon needed)."""

from __future__ import annotations

import json
import os
import sys
from typing import Final

import click

from supervisor.cli.offline.session_app import AppUnusable, initial_baseline
from supervisor.cli.offline.store_tools import inspect_in_store, store_option, verify_store
from supervisor.cli.options import HOME_ENV, existing_home_option
from worker.app import DEFAULT_APP
from worker.offline.baseline_repair import rebuild_baseline as rebuild_baseline_file
from worker.offline.index_repair import key_index_damaged, rebuild_key_index
from worker.offline.repair import repair_torn_tail
from worker.store.disk.layout import SESSIONS_DIR
from worker.store.errors import InvalidSessionId, LogError, SessionError
from worker.store.inspection import Inspection, inspect_session

EXIT_REFUSED: Final = 1
EXIT_NO_HOME: Final = 2  # as for any other bad argument: distinct from "a log is refused"


def home_problem(home: str) -> str | None:
    """Why ``home`` is not a loopd home (in a few words), or None if it is one."""
    if not os.path.exists(home):
        return "no such directory"
    if not os.path.isdir(home):
        return "not a directory"
    if not os.path.isdir(os.path.join(home, SESSIONS_DIR)):
        sessions = os.path.join(home, SESSIONS_DIR)
        return (
            f"not a loopd home (no {SESSIONS_DIR}/ folder in it; `mkdir {sessions}` makes an "
            "empty one, as `loopd serve` does)"
        )
    return None


def require_home(command: str, home: str) -> None:
    """Exit EXIT_NO_HOME with one line on stderr unless ``home`` is a loopd home.

    Without this, a mistyped ``--home`` looks like an empty, healthy home to verify.
    """
    problem = home_problem(home)
    if problem is not None:
        click.echo(f"loopd {command}: {home}: {problem}", err=True)
        sys.exit(EXIT_NO_HOME)


home_unless_store_option = click.option(
    "--home",
    envvar=HOME_ENV,
    default=None,
    type=click.Path(),
    help=f"An existing loopd home directory (or ${HOME_ENV}); not with --store.",
)


def home_given(command: str, home: str | None) -> str:
    """The home given, checked (exit 2 in one line without one)."""
    if home is None:
        click.echo(f"loopd {command}: give --home (or ${HOME_ENV}) or --store", err=True)
        sys.exit(2)
    require_home(command, home)
    return home


def _describe(found: Inspection) -> str:
    lines = [
        f"session    {found.session}",
        f"directory  {found.directory}",
        f"epoch      {found.epoch}"
        + ("  (ends with EpochEnd: resume pending)" if found.epoch_closed else ""),
        f"slot       {found.slot}",
        f"records    {found.records} in the current epoch",
        f"next_call  {found.next_call}",
        f"carry      {found.carry!r}",
        f"prior      {found.prior_users} user records ({found.prior_untrusted} untrusted)",
    ]
    if found.writer_live:
        holder = f"pid {found.writer_pid}" if found.writer_pid is not None else "another process"
        lines.append(f"writer     live ({holder}); figures may move while you read")
    lines.append("epochs:" if found.epochs[0].epoch == 0 else "epochs (the newest; --all for all):")
    for e in found.epochs:
        counts = ", ".join(f"{name} {n}" for name, n in sorted(e.counts.items()))
        lines.append(f"  {e.epoch:>4}  {e.size:>10} bytes  {counts}")
    lines.append(f"scheduled  {len(found.schedules)} pending" + (":" if found.schedules else ""))
    for pending in found.schedules:
        text = str(pending["text"])
        shown = text if len(text) <= 60 else text[:57] + "..."
        lines.append(f"  {pending['at']}  {pending['key']}  {shown!r}")
    return "\n".join(lines)


@click.command()
@home_unless_store_option
@store_option
@click.argument("session_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--all", "history", is_flag=True, help="Read and check every epoch, not only the newest."
)
def inspect(
    home: str | None, store: str | None, session_id: str, as_json: bool, history: bool
) -> None:
    """Show a session's epochs, record counts, carry and next_call (read-only).

    Reads the newest epoch, checked as a worker's open checks it; ``--all`` reads the
    history, checked as ``verify`` checks it (every line's canonical form too).
    A refused log prints ``path:line: why`` on stderr and exits 1. With ``--store`` the
    session is read from that PostgreSQL store, never claimed.
    """
    if store is not None:
        found = inspect_in_store(store, session_id, history)
        click.echo(json.dumps(found.to_json(), indent=2) if as_json else _describe(found))
        return
    home = home_given("inspect", home)
    try:
        found = inspect_session(home, session_id, history=history)
    except SessionError as exc:
        click.echo(f"refused: {exc}" if not isinstance(exc, LogError) else str(exc), err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(json.dumps(found.to_json(), indent=2) if as_json else _describe(found))


@click.command()
@home_unless_store_option
@store_option
def verify(home: str | None, store: str | None) -> None:
    """Check every session of the home, every epoch; a line each; exit 1 if any is refused.

    Every line must be the writer's own bytes for its record, not only carry a matching
    checksum (open trusts the checksum: docs/format.md, "What each reader checks").
    Exits 2 with one line on stderr if ``--home`` is missing or not a loopd home.
    ``--store URI`` checks the sessions of that PostgreSQL store instead, claiming none.
    """
    if store is not None:
        verify_store(store)
        return
    home = home_given("verify", home)
    sessions = os.path.join(home, SESSIONS_DIR)
    names = sorted(os.listdir(sessions))
    refused = 0
    for name in names:
        try:
            found = inspect_session(home, name, history=True)
        except InvalidSessionId as exc:
            refused += 1
            click.echo(f"REFUSED  {os.path.join(sessions, name)}: {exc}")
        except SessionError as exc:
            refused += 1
            click.echo(f"REFUSED  {name}  {exc}")
        else:
            live = "  (writer live)" if found.writer_live else ""
            click.echo(f"ok       {name}  epoch {found.epoch}  records {found.records}{live}")
    click.echo(f"{len(names)} sessions, {refused} refused")
    if refused:
        sys.exit(EXIT_REFUSED)


@click.command()
@existing_home_option
@click.argument("session_id", metavar="ID")
@click.option(
    "--rebuild-baseline",
    is_flag=True,
    help="Rebuild a missing epoch-0 baseline from the App, if its hash matches SessionStart's.",
)
@click.option(
    "--app",
    default=None,
    help="module:attribute of the App the session was created with (--rebuild-baseline); "
    f"default: its named App (intent.json), else {DEFAULT_APP}.",
)
def repair(home: str, session_id: str, rebuild_baseline: bool, app: str | None) -> None:
    """Move a damaged last group of ID's newest log into <home>/quarantine/ID/.

    Or, when the key index files are what open refuses, rebuild them from the logs
    (after checking the whole history, as verify does). With --rebuild-baseline, write
    a missing epoch-0 baseline again from the App's initial baseline, only if it hashes
    to what the log's SessionStart says.

    Explicit and narrow: it refuses while a worker holds the session, refuses a clean
    log, never touches a bad line in the middle of a log, and changes nothing unless
    the session will open afterwards.
    """
    require_home("repair", home)
    if rebuild_baseline:
        _rebuild_baseline(home, session_id, app)
        return
    try:
        damaged = key_index_damaged(home, session_id)
        if damaged is not None:
            written = rebuild_key_index(home, session_id)
            click.echo(f"rebuilt the key index from the logs ({damaged}):")
            for path in written:
                click.echo(f"   {path}")
            click.echo(f"the session opens cleanly; next: loopd start {session_id}")
            return
        result = repair_torn_tail(home, session_id)
    except SessionError as exc:
        click.echo(f"loopd repair: refused: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    lines = (
        f"line {result.line}"
        if result.line == result.last_line
        else f"lines {result.line}-{result.last_line}"
    )
    click.echo(
        f"moved {result.moved_bytes} bytes ({lines}, the damaged last group) of "
        f"{result.log}\n   to {result.quarantine}"
    )
    for what in result.readable:
        click.echo(f"   {what}")
    keys = ", ".join(result.keys) if result.keys else "none"
    click.echo(
        f"keys moved: {keys}\nif the damage came from a crash, none of it was acknowledged "
        "(a reply follows the fsync of a whole group); if it did not, acknowledged work may "
        f"be among it.\nthe log now ends after its last whole group ({result.kept_bytes} "
        f"bytes) and opens cleanly; next: loopd start {session_id}"
    )


def _rebuild_baseline(home: str, session_id: str, app: str | None) -> None:
    try:  # the App the session was created with: its named App, from the intent
        baseline, spec = initial_baseline(home, session_id, app)
    except AppUnusable as exc:
        click.echo(f"loopd repair: {exc}", err=True)
        sys.exit(EXIT_NO_HOME)
    try:
        path, still = rebuild_baseline_file(home, session_id, baseline)
    except SessionError as exc:
        click.echo(f"loopd repair: refused: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(f"rebuilt {path} from {spec}: its hash is the one SessionStart names")
    if still is not None:
        click.echo(f"loopd repair: the session is still refused: {still}", err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(f"the session opens cleanly; next: loopd start {session_id}")


COMMANDS: Final = (inspect, verify, repair)
