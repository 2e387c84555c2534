"""Named Apps: ``[apps.NAME]`` tables of ``loopd.toml``, and the check that each imports.

Each App a home hosts is named once, with what its workers need (as pm2's ecosystem
file and supervisord's ``[program:x]`` do)::

    [apps.agent]
    app = "examples.agent_app:AgentApp"      # module:attribute, called with the budget
    path = ["/srv/agent/src"]                # first on the import path (relative: to cwd)
    cwd = "/srv/agent"                       # the workers' working directory, next on it
    env = { MODEL_URL = "http://127.0.0.1:8080/v1" }
    budget = 8000
    hang-timeout = 120.0
    request-deadline = 600.0

``loopd create ID --app agent`` records the name in the operator's intent, so every
restart of that session runs the same App. ``serve`` imports every configured App (and
its ``--app``) in a child interpreter before it serves (the supervisor itself never
imports an App: forked workers would inherit whatever it did), and refuses one that
does not import in one line naming the App and the error.

Where an App is imported from is one rule, ``app_import_path``: the App's ``path`` and
``cwd``, the directory serve was started in, PYTHONPATH, the installed packages. A
console script (``.venv/bin/loopd``) has its own folder as ``sys.path[0]``, not the
working directory as ``python -m supervisor`` has, so the working directory is put on
the path here rather than left to how the supervisor happened to be started.
"""

from __future__ import annotations

import functools
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

    def work_dir(self) -> str:
        """The workers' working directory, absolute: ``cwd`` (relative: to the directory
        serve was started in), or that directory."""
        return os.path.abspath(os.path.join(start_dir(), self.cwd)) if self.cwd else start_dir()


@functools.cache
def start_dir() -> str:
    """The directory the supervisor (or the rig) was started in, absolute, read once.

    Read before the first App is checked; the supervisor never changes directory, and
    reading it once keeps a directory removed later from failing a restart."""
    try:
        return os.path.abspath(os.getcwd())
    except OSError as exc:  # removed under the shell that started serve
        raise AppConfigError("the working directory", f"cannot be read: {exc}") from exc


def app_import_dirs(app: AppConfig | None = None) -> tuple[str, ...]:
    """The directories an App is imported from before PYTHONPATH, absolute, first first:
    a named App's ``path`` entries (relative: to its working directory) and ``cwd``,
    then the directory serve was started in. ``WorkerSpec.path`` carries them."""
    if app is None:
        return (start_dir(),)
    work = app.work_dir()
    dirs = [os.path.abspath(os.path.join(work, entry)) for entry in app.path]
    if app.cwd:
        dirs.append(work)
    return tuple(_unique([*dirs, start_dir()]))


def app_import_path(app: AppConfig | None = None) -> list[str]:
    """Where an App is imported from, first to last: ``app_import_dirs``, the App's own
    ``env`` PYTHONPATH, then the supervisor's ``sys.path`` (its PYTHONPATH, the installed
    packages). A forked worker's sys.path, as spawn builds it; the import check and the
    rig use it whole."""
    extra = [] if app is None else _pythonpath(app.env, app.work_dir())
    return _unique([*app_import_dirs(app), *extra, *sys.path])


def _pythonpath(env: Mapping[str, str], work_dir: str) -> list[str]:
    entries = env.get("PYTHONPATH", "").split(os.pathsep)
    return [os.path.abspath(os.path.join(work_dir, entry)) for entry in entries if entry]


def _unique(paths: list[str]) -> list[str]:
    """``paths`` without its later repeats (the first place of an entry is its rank)."""
    return list(dict.fromkeys(paths))


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
            target=_no_nul(where, "app", _target(where, entry.get("app"))),
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
    return [_no_nul(where, key, v) for v in value]


def _optional(where: str, key: str, value: object, kind: type) -> str | None:
    if value is not None and type(value) is not kind:
        raise AppConfigError(where, f"key {key!r} must be a string")
    return None if value is None else _no_nul(where, key, value)  # type: ignore[arg-type]


def _no_nul(where: str, key: str, value: str) -> str:
    # A path, an argv word or an environment value cannot hold one: the OS call would
    # raise a ValueError that names no key.
    if "\0" in value:
        raise AppConfigError(where, f"key {key!r} holds a NUL byte")
    return value


def _env(where: str, value: object) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise AppConfigError(where, "key 'env' must be a table of strings")
    bad = [k for k in value if not k or "=" in k or "\0" in k]
    if bad:
        raise AppConfigError(where, f"env: {bad[0]!r} is not a usable variable name")
    held = [k for k, v in value.items() if "\0" in v]
    if held:
        raise AppConfigError(where, f"env: the value of {held[0]!r} holds a NUL byte")
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
    # The import path of a forked worker (fork, template: the default start method's two
    # ways), not that of a fresh ``python -c``, whose sys.path[0] would be its own working
    # directory.
    paths = app_import_path(app)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHECK, target, json.dumps(paths)],
            cwd=app.work_dir() if app else None,
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
        raise AppConfigError(where, f"does not import: {last[:300]}{_shadowed(paths)}")


_LOOPD_PACKAGES: Final = ("worker", "supervisor", "chaos")


def _shadowed(paths: list[str]) -> str:
    """A note naming a file of the App's directories that hides one of loopd's packages
    (they come first on the import path: a ``worker.py`` there is imported as loopd's
    ``worker``), else nothing."""
    for directory in paths[: paths.index(start_dir()) + 1] if start_dir() in paths else []:
        for name in _LOOPD_PACKAGES:
            candidate = os.path.join(directory, f"{name}.py")
            if os.path.isfile(candidate):
                return f" ({candidate} hides loopd's own package {name!r}: rename it)"
    return ""


def check_all(apps: Mapping[str, AppConfig], default: str | None) -> None:
    """Every configured App, and the default ``--app`` if one is given, must import."""
    if default is not None:
        check_importable(default)
    for name, app in apps.items():
        check_importable(app.target, name=name, app=app)
