"""The App a session was created with, for an offline tool that needs its initial baseline.

A session created with ``--app NAME`` runs the named App of ``loopd.toml``'s ``[apps]``
(the intent records the name); any other runs serve's ``--app``. ``repair
--rebuild-baseline`` must ask that same App: a named App is imported in a child
interpreter set up as its workers are (its path, environment and working directory,
the budget it is configured with), never in this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from typing import Final

from supervisor.errors import SupervisorError
from supervisor.hosting.apps import IMPORT_TIMEOUT, AppConfig, AppConfigError, app_import_path
from supervisor.hosting.config import ConfigError, config_path, read_apps
from supervisor.hosting.intent import IntentError, IntentFile
from supervisor.templates.prctl import die_with_parent
from worker.app import DEFAULT_APP, DEFAULT_BUDGET, load_app
from worker.store.baseline import Baseline

_BASELINE: Final = """
import json, sys
sys.path[:] = json.loads(sys.argv[3])
from worker.app import load_app
baseline = load_app(sys.argv[1], int(sys.argv[2])).initial_baseline(sys.argv[4])
sys.stdout.buffer.write(baseline.to_json())
"""


class AppUnusable(SupervisorError):
    """The session's App cannot be found or asked; ``str()`` is one line."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(where, why)
        self.where = where
        self.why = why

    def __str__(self) -> str:
        return f"{self.where}: {self.why}"


def initial_baseline(home: str, session_id: str, spec: str | None) -> tuple[Baseline, str]:
    """The initial baseline of the App the session was created with, and which App that is.

    ``spec``: the ``--app`` the operator gave, if any; refused when the intent names
    another App for the session.
    """
    intent = IntentFile(home)
    try:
        intent.load()
    except IntentError as exc:
        raise AppUnusable(intent.path, f"{exc.why}: the session's App is not known") from exc
    name = intent.app_of(session_id)
    if name is None:
        return _default(spec or DEFAULT_APP, session_id), spec or DEFAULT_APP
    try:
        apps = read_apps(config_path(home))
    except (ConfigError, SupervisorError) as exc:
        raise AppUnusable(config_path(home), str(exc)) from exc
    app = apps.get(name)
    if app is None:
        raise AppUnusable(
            f"session {session_id}",
            f"was created with the App {name!r} (intent.json), and loopd.toml's [apps] does "
            f"not name it: add [apps.{name}] back",
        )
    if spec is not None and spec not in (name, app.target):
        raise AppUnusable(
            f"--app {spec}",
            f"session {session_id} was created with the App {name!r} ({app.target}, "
            "intent.json): leave --app out to use it",
        )
    return _named(app, session_id), f"app {name!r} ({app.target})"


def _default(spec: str, session_id: str) -> Baseline:
    try:
        return load_app(spec).initial_baseline(session_id)
    except Exception as exc:
        raise AppUnusable(f"--app {spec}", f"{type(exc).__name__}: {exc}") from exc


def _named(app: AppConfig, session_id: str) -> Baseline:
    where = f"app {app.name!r} ({app.target})"
    budget = app.budget if app.budget is not None else DEFAULT_BUDGET
    # Imported from where its workers import it, in the directory they run in.
    args = [app.target, str(budget), json.dumps(app_import_path(app)), session_id]
    out = run_as_its_workers(app, _BASELINE, args, "initial_baseline")
    try:
        return Baseline.from_json(out)
    except ValueError as exc:
        raise AppUnusable(where, f"its initial baseline is not one: {exc}") from exc


def run_as_its_workers(app: AppConfig, script: str, args: list[str], call: str) -> bytes:
    """Run ``script`` in a child interpreter set up as ``app``'s workers are (its working
    directory and environment; the script sets its import path) and return its output;
    AppUnusable, in one line, if it cannot start, fails or outlasts the import timeout.
    ``call`` names the App's method it runs, for those lines."""
    where = f"app {app.name!r} ({app.target})"
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, *args],
            cwd=app.work_dir(),
            env=app.check_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=IMPORT_TIMEOUT,
            check=False,
            # Ended with the command, however it ends (a SIGKILL of `loopd fork` in a
            # hanging App's call leaves no interpreter behind); one thread: fork-safe.
            preexec_fn=partial(die_with_parent, os.getpid()),
        )
    except subprocess.TimeoutExpired as exc:
        raise AppUnusable(where, f"its {call} took over {IMPORT_TIMEOUT:g} s") from exc
    except OSError as exc:  # a cwd that does not exist, most often
        raise AppUnusable(where, f"cannot be started: {exc}") from exc
    except AppConfigError as exc:  # the working directory it is relative to is gone
        raise AppUnusable(where, str(exc)) from exc
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        last = lines[-1].strip() if lines else f"exit code {done.returncode}"
        raise AppUnusable(where, f"{call} failed: {last[:300]}")
    return done.stdout
