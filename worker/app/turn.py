"""What an App may call while it handles a request: ``progress()``, ``stream()``, ``schedule()``.

An App runs inside the worker's loop: while ``handle`` (or ``handle_many``) runs, the
loop does not turn. ``progress()`` tells the supervisor the App is alive and working
(as systemd's ``WATCHDOG=1`` does): it stamps the heartbeat and restarts the request's
deadline, so a ten-minute tool loop that calls it is never taken for a hang, while an
App that is stuck (no progress) or stopped (SIGSTOP) still is. ``stream(text)`` sends
partial output to the client of the request being handled; nothing of it is written to
the log, and a client that loses its worker mid-stream retries by key and sees the
partials again from the start (they are not durable: docs/apps.md).

``schedule(at, text, key=...)`` schedules a request for the session at or after ``at``:
its ``Schedule`` record joins the request's group commit (docs/apps.md, "Schedules").

``progress`` and ``stream`` are no-ops outside a worker (an App's own unit tests may
call them freely); ``schedule`` outside a worker returns the key and schedules nothing.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Protocol

from worker.ipc.wire import Message


class TurnHooks(Protocol):
    """The worker's side of the calls below (``worker.loop.turns.TurnRunner``)."""

    def progress(self) -> None: ...
    def stream(self, text: str, request: Message | None) -> None: ...
    def schedule(self, at: object, text: object, key: object, untrusted: object) -> str: ...


_hooks: TurnHooks | None = None


def install(hooks: TurnHooks | None) -> None:
    """Route the calls below to ``hooks`` (the worker does this once; None: no-ops)."""
    global _hooks  # noqa: PLW0603 - one worker, one loop: the App's calls find it here
    _hooks = hooks


def progress() -> None:
    """Say the App is alive and still working on the current request(s)."""
    if _hooks is not None:
        _hooks.progress()


def stream(text: str, request: Message | None = None) -> None:
    """Send ``text`` as partial output of the request being handled.

    ``request`` names which request it belongs to when ``handle_many`` holds several
    (the request message the App was given); in ``handle`` it may be left out.
    TypeError if ``text`` is not a string; ValueError if the request is ambiguous.
    """
    if type(text) is not str:
        raise TypeError(f"stream() takes a string, got {type(text).__name__}")
    if _hooks is not None:
        _hooks.stream(text, request)


def schedule(
    at: datetime.datetime | str,
    text: str,
    *,
    key: str | None = None,
    untrusted: bool = False,
) -> str:
    """Schedule a request ``text`` for this session, delivered once at or after ``at``.

    ``at`` is an aware datetime or an ISO 8601 string with an offset; ``key`` is the
    delivered request's key (made up when None) and is returned. The schedule is written
    with the current request's records, in the same group commit: if the request is not
    applied, nothing is scheduled. ValueError for a key already scheduled or used, or a
    time without a zone; TypeError for values of the wrong type.
    """
    if _hooks is None:
        return key if key is not None else f"schedule-{uuid.uuid4().hex}"
    return _hooks.schedule(at, text, key, untrusted)
