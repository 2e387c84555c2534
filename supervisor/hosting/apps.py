"""Named Apps: ``[apps.NAME]`` tables of ``loopd.toml``, and the check that each imports.

Each App a home hosts is named once, with what its workers need (as pm2's ecosystem
file and supervisord's ``[program:x]`` do)::

    [apps.agent]
    app = "examples.agent_app:AgentApp"      # module:attribute, called with the budget
    path = ["/srv/agent/src"]                # prepended to the import path (sys.path)
    cwd = "/srv/agent"                       # the workers' working directory
    env = { MODEL_URL = "http://127.0.0.1:8080/v1" }
    budget = 8000
    hang-timeout = 120.0
    request-deadline = 600.0

``loopd create ID --app agent`` records the name in the operator's intent, so every
restart of that session runs the same App. ``serve`` imports every configured App (and
its ``--app``) in a child interpreter before it serves (the supervisor itself never
imports an App: forked workers would inherit whatever it did), and refuses one that
does not import in one line naming the App and the error.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from supervisor.errors import SupervisorError
from supervisor.hosting.bounds import MAX_SECONDS

APP_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
IMPORT_TIMEOUT: Final = 60.0
"""Seconds one App's import check may take before it is refused."""
_KEYS: Final = ("app", "path", "cwd", "env", "budget", "hang-timeout", "request-deadline")
_CHECK: Final = """
import importlib, json, sys
sys.path[:] = json.loads(sys.argv[2])
module, _, attribute = sys.argv[1].partition(":")
target = importlib.import_module(module)
for part in attribute.split("."):
    target = getattr(target, part)
if not callable(target):
    raise TypeError(f"{sys.argv[1]} is not callable: it must take the budget and return an App")
"""


class AppConfigError(SupervisorError):
    """A named App is badly configured or does not import; ``str()`` is one line."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(where, why)
        self.where = where
        self.why = why

    def __str__(self) -> str:
        return f"{self.where}: {self.why}"


@dataclass(frozen=True, slots=True, kw_only=True)
class AppConfig:
    """One named App and what its workers run with."""

    name: str
    target: str  # module:attribute
    path: tuple[str, ...] = ()
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    budget: int | None = None
    hang_timeout: float | None = None
    request_deadline: float | None = None

    def check_env(self) -> dict[str, str]:
        """The environment its import check runs with: a worker's."""
        return {**os.environ, **self.env}

    def import_path(self) -> list[str]:
        """Where a forked worker of this App imports from: ``path``, the App's own
        ``PYTHONPATH`` (env), then the supervisor's import path."""
        return worker_import_path(self.path, self.env)


def worker_import_path(path: tuple[str, ...], env: dict[str, str]) -> list[str]:
    """A forked worker's sys.path: the App's path and PYTHONPATH entries before the
    supervisor's own (a fork does not read PYTHONPATH again)."""
    extra = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    return [*path, *extra, *sys.path]


def parse_apps(table: object, path: str) -> dict[str, AppConfig]:
    """The ``apps`` table of ``path``; AppConfigError naming the key that is wrong."""
    if not isinstance(table, dict):
        raise AppConfigError(path, "'apps' must be a table of [apps.NAME] tables")
    apps = {}
    for name, entry in table.items():
        where = f"{path}: [apps.{name}]"
        if not APP_NAME.fullmatch(name):
            raise AppConfigError(where, "an App's name is 1-64 letters, digits, '_', '.', '-'")
        if not isinstance(entry, dict):
            raise AppConfigError(where, "must be a table")
        unknown = sorted(set(entry) - set(_KEYS))
        if unknown:
            raise AppConfigError(where, f"unknown key {unknown[0]!r} (known: {', '.join(_KEYS)})")
        apps[name] = AppConfig(
            name=name,
            target=_target(where, entry.get("app")),
            path=tuple(_strings(where, "path", entry.get("path", []))),
            cwd=_optional(where, "cwd", entry.get("cwd"), str),
            env=_env(where, entry.get("env", {})),
            budget=_count(where, "budget", entry.get("budget")),
            hang_timeout=_number(
                where, "hang-timeout", entry.get("hang-timeout"), float, 0.1, MAX_SECONDS
            ),
            request_deadline=_number(
                where, "request-deadline", entry.get("request-deadline"), float, 0.01, MAX_SECONDS
            ),  # the bounds of serve's own options
        )
    return apps


def _target(where: str, value: object) -> str:
    if not isinstance(value, str):
        raise AppConfigError(where, "key 'app' (module:attribute) is required and is a string")
    module, sep, attribute = value.partition(":")
    if not sep or not module or not attribute:
        raise AppConfigError(where, f"key 'app' must be module:attribute, got {value!r}")
    return value


def _strings(where: str, key: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AppConfigError(where, f"key {key!r} must be a list of strings")
    return value


def _optional(where: str, key: str, value: object, kind: type) -> str | None:
    if value is not None and type(value) is not kind:
        raise AppConfigError(where, f"key {key!r} must be a string")
    return value  # type: ignore[return-value]


def _env(where: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise AppConfigError(where, "key 'env' must be a table of strings")
    bad = [k for k in value if not k or "=" in k or "\0" in k or "\0" in value[k]]
    if bad:
        raise AppConfigError(where, f"env: {bad[0]!r} is not a usable variable name")
    return dict(value)


def _count(where: str, key: str, value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= 10**12:
        raise AppConfigError(where, f"key {key!r} must be an integer from 1 to 10**12")
    return value


def _number(
    where: str, key: str, value: object, kind: type, low: float, high: float
) -> int | float | None:
    if value is None:
        return None
    if kind is float and type(value) is int:
        value = float(value)
    if type(value) is not kind or not low <= value <= high:  # type: ignore[operator]
        what = "an integer" if kind is int else "a number"
        raise AppConfigError(where, f"key {key!r} must be {what} from {low:g} to {high:g}")
    return value  # type: ignore[return-value]


def check_importable(target: str, *, name: str | None = None, app: AppConfig | None = None) -> None:
    """Import ``target`` in a child interpreter set up as its workers are; AppConfigError."""
    where = f"app {name!r} ({target})" if name else f"--app {target}"
    env = app.check_env() if app else dict(os.environ)
    # The import path of a forked worker (the default start method), not that of a fresh
    # ``python -c``: a module found only from the shell's working directory is refused.
    paths = app.import_path() if app else list(sys.path)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHECK, target, json.dumps(paths)],
            cwd=app.cwd if app else None,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=IMPORT_TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AppConfigError(where, f"importing it took over {IMPORT_TIMEOUT:g} s") from exc
    except OSError as exc:  # a cwd that does not exist, most often
        raise AppConfigError(where, f"cannot start its import check: {exc}") from exc
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = lines[-1].strip() if lines else f"exit code {done.returncode}"
        raise AppConfigError(where, f"does not import: {last[:300]}")


def check_all(apps: Mapping[str, AppConfig], default: str | None) -> None:
    """Every configured App, and the default ``--app`` if one is given, must import."""
    if default is not None:
        check_importable(default)
    for name, app in apps.items():
        check_importable(app.target, name=name, app=app)
