"""``loopd fork ID NEW [--epoch E]``: a new session whose history is ID's up to epoch E.

The store does the fork (worker.offline.fork): ID's sealed epochs 0..E are shared with
NEW (hard links), and NEW's epoch E+1 starts from E's recorded summary. Only sealed
epochs are read, so a live ID is forked without asking its worker. The new epoch's
baseline is the App's ``next_baseline`` for the session as of E, asked of the App ID
was created with: a named App in a child interpreter set up as its workers are, the
default (or ``--app``) App here; NEW's SessionStart names that App and its version by
the worker's rule, as a worker's resume would (docs/apps.md, "Versions"). A daemon that
serves the home is told of NEW (``adopt``); otherwise the intent records NEW's named App
for the next ``serve``.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Final, cast

import click

from supervisor.cli.offline.fork_store import fork_in_store
from supervisor.cli.offline.offline_commands import (
    EXIT_REFUSED,
    home_given,
    home_unless_store_option,
)
from supervisor.cli.offline.session_app import AppUnusable, run_as_its_workers
from supervisor.cli.offline.store_tools import store_option
from supervisor.cli.options import timeout_option
from supervisor.client.control import call, daemon_answers
from supervisor.errors import ControlError, SupervisorError
from supervisor.hosting.apps import AppConfig, app_import_path
from supervisor.hosting.config import ConfigError, config_path, read_apps
from supervisor.hosting.intent import IntentError, IntentFile
from worker.app import DEFAULT_APP, DEFAULT_BUDGET, load_app
from worker.app.version import app_version
from worker.offline.fork import (
    AppVersion,
    StagedFork,
    abandon_fork,
    finish_fork,
    sealed_through,
    stage_fork,
)
from worker.store.baseline import Baseline
from worker.store.errors import SessionError

if TYPE_CHECKING:
    from worker.store.session import Session

_NEXT_BASELINE: Final = """
import json, sys
sys.path[:] = json.loads(sys.argv[3])
from worker.app import load_app
from worker.app.version import app_version
from worker.offline.fork import StagedSession
from worker.store.loader import load_session
view = StagedSession(load_session(sys.argv[4], sys.argv[5]))
baseline = load_app(sys.argv[1], int(sys.argv[2])).next_baseline(view, sys.argv[6])
sys.stdout.buffer.write(json.dumps(app_version(sys.argv[1])).encode() + b"\\n")
sys.stdout.buffer.write(baseline.to_json())
"""


def next_baseline(
    staged: StagedFork, app: AppConfig | None, spec: str | None
) -> tuple[Baseline, AppVersion]:
    """The App's ``next_baseline`` for the staged session as of epoch E, and E's summary,
    and the App and version that built it."""
    if app is None:
        target = spec or DEFAULT_APP
        try:  # the App sees the session read-only, as of the end of epoch E
            view = cast("Session", staged.session)
            built = load_app(target).next_baseline(view, staged.summary)
            return built, (target, app_version(target))
        except Exception as exc:
            raise AppUnusable(f"--app {target}", f"{type(exc).__name__}: {exc}") from exc
    where = f"app {app.name!r} ({app.target})"
    budget = app.budget if app.budget is not None else DEFAULT_BUDGET
    path = json.dumps(app_import_path(app))
    args = [app.target, str(budget), path, staged.staging, staged.source, staged.summary]
    out = run_as_its_workers(app, _NEXT_BASELINE, args, "next_baseline")
    head, _newline, body = out.partition(b"\n")
    try:
        version = json.loads(head)
        baseline = Baseline.from_json(body)
    except ValueError as exc:
        raise AppUnusable(where, f"its next baseline is not one: {exc}") from exc
    if not isinstance(version, str) or not version:
        raise AppUnusable(where, f"its version is not one: {head[:100]!r}")
    return baseline, (app.target, version)


def _named_app(home: str, source: str) -> tuple[str | None, AppConfig | None]:
    """The named App ``source`` was created with (intent.json), if any, and its config."""
    intent = IntentFile(home)
    try:
        intent.load()
    except IntentError as exc:
        raise AppUnusable(intent.path, f"{exc.why}: the session's App is not known") from exc
    name = intent.app_of(source)
    if name is None:
        return None, None
    try:
        app = read_apps(config_path(home)).get(name)
    except (ConfigError, SupervisorError) as exc:
        raise AppUnusable(config_path(home), str(exc)) from exc
    if app is None:
        raise AppUnusable(
            f"session {source}",
            f"was created with the App {name!r} (intent.json), and loopd.toml's [apps] does "
            f"not name it: add [apps.{name}] back",
        )
    return name, app


@click.command()
@home_unless_store_option
@store_option
@timeout_option
@click.option(
    "--epoch",
    type=click.IntRange(min=0),
    default=None,
    help="The last epoch of ID that NEW shares (sealed). Default: ID's newest sealed one.",
)
@click.option("--app", "spec", default=None, help="serve's --app, for a session of no named App.")
@click.argument("source", metavar="ID")
@click.argument("new", metavar="NEW")
def fork(
    home: str | None,
    store: str | None,
    timeout: float,
    epoch: int | None,
    spec: str | None,
    source: str,
    new: str,
) -> None:
    """Make NEW a session whose history is ID's up to the end of epoch E.

    ID's epochs 0..E are shared (hard-linked where the file system allows, else
    copied); NEW's next epoch starts from E's recorded summary, with the baseline the
    App gives for it, and records that it was forked from ID. ID may be live: only its
    sealed epochs are read, and it is not changed. NEW is built in the trash and
    renamed into place whole; a fork cut short leaves no NEW. With ``--store URI`` both
    are in that PostgreSQL store: NEW's epochs are copies, created in one transaction
    (the default App, or --app, gives the baseline); a serve on that store serves NEW
    from its next start (it serves every session of its database).
    """
    if store is not None:
        _fork_in_store(store, source, new, epoch, spec)
        return
    home = home_given("fork", home)
    try:
        name, app = _named_app(home, source)
        staged = stage_fork(home, source, new, sealed_through(home, source, epoch))
        try:
            baseline, built_by = next_baseline(staged, app, spec)
        except BaseException:
            abandon_fork(staged)
            raise
        result = finish_fork(staged, baseline, built_by)
        if daemon_answers(home, timeout):
            call(
                home,
                "adopt",
                timeout=timeout,
                session=new,
                **({} if name is None else {"app": name}),
            )
        elif name is not None:
            intent = IntentFile(home)
            intent.load()
            intent.set_app(new, name)
    except (SessionError, AppUnusable, ControlError, IntentError) as exc:
        click.echo(f"loopd fork: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(
        f"forked {source} as {new} from epoch {result.epoch}: epochs 0..{result.epoch} "
        f"shared ({result.linked} files linked, {result.copied} copied), epoch "
        f"{result.epoch + 1} starts from its summary; next: loopd start {new}"
    )


def _fork_in_store(uri: str, source: str, new: str, epoch: int | None, spec: str | None) -> None:
    try:
        made = fork_in_store(uri, source, new, epoch, lambda s: next_baseline(s, None, spec))
    except (SessionError, AppUnusable) as exc:
        click.echo(f"loopd fork: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(
        f"forked {source} as {new} in {made.place} from epoch {made.epoch}: epochs "
        f"0..{made.epoch} copied ({made.files} files), epoch {made.epoch + 1} starts from its "
        "summary"
    )
