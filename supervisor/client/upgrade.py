"""Move sessions onto the App version a worker started now would load (``loopd upgrade``).

For each session whose current epoch names another version (the daemon's
``app_versions``), at most N at a time: restart its worker, which loads the App as it is
now (a worker that resumes mid-epoch under another version writes ``AppChanged``), then
compact with it, so that the epoch it starts is begun by the new version and its
``SessionStart`` names it. Requests that arrive meanwhile are queued by the daemon and
served by the new worker, as any restart's are (docs/operations.md, "App versions").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Final

from supervisor.client.control import call
from supervisor.errors import ControlError
from worker.ipc.wire import Message

UPGRADED_STATES: Final = frozenset({"RUNNING", "STARTING", "BACKOFF", "IDLE"})
"""The sessions upgraded: the running ones and the hibernated ones (started for it). A
STOPPED session stays stopped (the operator's intent), a FATAL or EXITED one waits for
``loopd start``: each is listed as skipped."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Upgraded:
    """One session's upgrade: the versions before and after, or why it failed."""

    session: str
    before: str | None
    after: str | None
    epoch: int | None
    seconds: float
    failure: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What ``loopd upgrade`` will do: the rows to upgrade, the rows left, and why."""

    upgrade: list[Message]
    skipped: list[tuple[str, str]]
    """(session, state) of older sessions not upgraded because they are not running."""
    unchecked: list[tuple[str, str]]
    """(session, why) of sessions whose App's version now cannot be learnt (no import)."""
    matched: int
    """Sessions of the App asked for, whatever their version."""


def plan_upgrade(home: str, app: str | None, *, timeout: float) -> Plan:
    """The sessions of App ``app`` (a named App, or serve's ``--app`` by its
    ``module:attribute``; None: every App) whose epoch names another version than now."""
    versions = call(home, "app_versions", timeout=timeout)
    rows = versions.get("sessions") if isinstance(versions, dict) else None
    states = {str(r.get("session")): str(r.get("state")) for r in _rows(call(home, "status"))}
    upgrade: list[Message] = []
    skipped: list[tuple[str, str]] = []
    unchecked: list[tuple[str, str]] = []
    matched = 0
    for row in _rows(rows):
        if app is not None and app not in (row.get("named"), row.get("loads")):
            continue
        matched += 1
        session = str(row.get("session"))
        if row.get("error") is not None:
            unchecked.append((session, f"{row.get('loads')} {row.get('error')}"))
        elif row.get("older") and states.get(session) not in UPGRADED_STATES:
            skipped.append((session, states.get(session, "unknown")))
        elif row.get("older"):
            upgrade.append(row)
    return Plan(upgrade=upgrade, skipped=skipped, unchecked=unchecked, matched=matched)


def upgrade_sessions(
    home: str,
    rows: list[Message],
    *,
    at_once: int,
    timeout: float,
    on_done: Callable[[Upgraded], None],
    keep_going: bool = False,
) -> list[Upgraded]:
    """Upgrade each of ``rows`` (``plan_upgrade``'s), ``at_once`` at a time; each result.

    After a failure no further session is begun (those already begun end), unless
    ``keep_going``: a version whose workers cannot start is met on one batch, not on
    every session of the home."""
    waiting = list(rows)
    done: list[Upgraded] = []
    with ThreadPoolExecutor(max_workers=at_once) as pool:
        running: set[Future[Upgraded]] = set()
        while waiting or running:
            failed = any(d.failure is not None for d in done)
            while waiting and len(running) < at_once and (keep_going or not failed):
                running.add(pool.submit(_upgrade_one, home, waiting.pop(0), timeout))
            if not running:
                break  # a failure: the rest are not begun
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                on_done(future.result())
                done.append(future.result())
    return done


def _upgrade_one(home: str, row: Message, timeout: float) -> Upgraded:
    """Restart the session's worker, compact with the new one, and read its new epoch."""
    session = str(row.get("session"))
    wanted = row.get("current")
    began = time.monotonic()

    def result(after: Message | None, failure: str | None = None) -> Upgraded:
        return Upgraded(
            session=session,
            before=_text(row.get("app_version")),
            after=_text(after.get("app_version")) if after else None,
            epoch=_count(after.get("epoch")) if after else None,
            seconds=time.monotonic() - began,
            failure=failure,
        )

    try:
        call(home, "restart", session=session, timeout=timeout)
        call(home, "compact", session=session, timeout=timeout)
        after = next(iter(_rows(call(home, "status", session=session, timeout=timeout))), None)
    except ControlError as exc:
        return result(None, str(exc))
    if after is None or after.get("app_version") != wanted:
        seen = after.get("app_version") if after else None
        return result(after, f"its new epoch names version {seen}, not {wanted}")
    return result(after)


def _rows(value: object) -> Iterable[Message]:
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int | None:
    return value if type(value) is int else None
