"""Loading a user's App as ``loopd serve`` does, and saying in one line why it fails."""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys

from supervisor.hosting.apps import AppConfigError, app_import_path, check_importable
from supervisor.templates.template_main import other_threads


class CleanRunFailed(RuntimeError):
    """A scenario's run with no fault failed: nothing can be faulted against it (most
    often the App itself fails); ``str()`` is one line with the worker's last words."""

    def __init__(self, scenario: str, app: str | None, code: int | None, last: str) -> None:
        super().__init__(scenario, app, code, last)
        self.scenario, self.app, self.code, self.last = scenario, app, code, last

    def __str__(self) -> str:
        who = f" through {self.app}" if self.app else ""
        said = f": {self.last}" if self.last else ""
        return f"the clean run of {self.scenario}{who} (no fault) exited with {self.code}{said}"


def last_line(path: str) -> str:
    """The last non-blank line a worker printed (its error, most often), at most 300 chars."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f.read()[-8192:].splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def import_app(app: str) -> None:
    """Load the App as ``loopd serve`` does: checked once in a child interpreter, from
    where serve imports it (``app_import_path``: the working directory first, then
    PYTHONPATH), then as serve's template loads it (supervisor.templates): imported once
    here, before the rig forks its workers, so that they share what the import made, as
    the workers a template forks do; unless the import starts a thread, which a fork
    does not copy (an SDK's client), in which case serve gives the App no template and
    each worker imports it after its fork, and so do the rig's. ImportError if it does
    not import (the check's one line).
    """
    module_name, sep, attribute = app.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"an app is given as module:attribute, not {app!r}")
    sys.path[:] = app_import_path()
    _check_importable(app)
    _load_as_template(app)


@functools.cache
def _check_importable(app: str) -> None:
    """serve's own import check of ``app``, once per rig (its forks inherit the verdict)."""
    try:
        check_importable(app)
    except AppConfigError as exc:
        raise ImportError(exc.why) from exc


@functools.cache
def _load_as_template(app: str) -> bool:
    """Import ``app`` in this process if its template would (no thread left running by
    its import, judged in a forked child as the template judges it); whether it did."""
    if import_threads(app):
        return False  # serve forks its workers from itself: each imports the App
    module_name, _, attribute = app.partition(":")
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    return True


def import_threads(app: str) -> list[str]:
    """The threads importing ``app`` leaves running, seen in a forked child (this
    process stays single-threaded whatever the App does)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            os.close(read_end)
            module_name, _, attribute = app.partition(":")
            target: object = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
            os.write(write_end, json.dumps(other_threads()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read()
    os.waitpid(pid, 0)
    threads = json.loads(said) if said else []
    return [str(name) for name in threads]
