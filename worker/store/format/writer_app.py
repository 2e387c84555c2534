"""The App this process writes for: stamped on every ``SessionStart`` it writes.

A worker hosts one App for its whole life; it says which (``module:attribute``) and
its version (``worker.app.version``) once, after loading it, and every ``SessionStart``
made in this process from then on (a create, an epoch commit, on every backend: the
``SessionStart`` defaults below) names them. A process that never says (a tool, a
test) writes ``SessionStart`` lines without the block, as before; ``loopd fork`` names
the App that built its epoch's baseline explicitly (``worker.offline.fork.finish_fork``).
"""

from __future__ import annotations

_stamp: tuple[str, str] | None = None


def stamp_app(app: str, version: str) -> None:
    """From now on every SessionStart this process makes names ``app`` at ``version``."""
    global _stamp  # noqa: PLW0603 - one App per worker process, said once
    if not app or not version:
        raise ValueError(f"an App and its version must be non-empty, got {app!r} {version!r}")
    _stamp = (app, version)


def clear_app() -> None:
    """Stop stamping (a test that stamped; a process that forks a child of another App)."""
    global _stamp  # noqa: PLW0603 - see stamp_app
    _stamp = None


def stamped_app() -> str | None:
    """The App every new SessionStart names, or None."""
    return None if _stamp is None else _stamp[0]


def stamped_version() -> str | None:
    """Its version, or None."""
    return None if _stamp is None else _stamp[1]
