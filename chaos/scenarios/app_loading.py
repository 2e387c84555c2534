"""Loading a user's App as ``loopd serve`` does, and saying in one line why it fails."""

from __future__ import annotations

import functools
import sys

from supervisor.hosting.apps import AppConfigError, app_import_path, check_importable


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
    """Load the App as ``loopd serve`` does: checked once in a child interpreter, then
    imported by each worker after its fork, from where serve imports it
    (``app_import_path``: the working directory first, then PYTHONPATH).

    The rig never imports the App itself: its workers are forked from the rig, and an
    App imported before the fork would run without what its import made that a fork
    does not copy (a client's thread), unlike under serve. ImportError if it does not
    import (the check's one line).
    """
    module_name, sep, attribute = app.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"an app is given as module:attribute, not {app!r}")
    sys.path[:] = app_import_path()
    _check_importable(app)


@functools.cache
def _check_importable(app: str) -> None:
    """serve's own import check of ``app``, once per rig (its forks inherit the verdict)."""
    try:
        check_importable(app)
    except AppConfigError as exc:
        raise ImportError(exc.why) from exc
