"""What a worker's exit code says about its session: FATAL, and what the operator does next."""

from __future__ import annotations

from typing import Final

from worker.process import (
    EXIT_CANNOT_OPEN,
    EXIT_CRASH,
    EXIT_DATABASE,
    EXIT_DISK_FULL,
    EXIT_LOCKED,
    EXIT_NOT_FOUND,
    EXIT_NOT_OWNER,
    EXIT_REFUSED,
)

# What a worker says on its channel ("exiting") before each exit code of loopd's own.
_SAID_FOR: Final = {
    EXIT_LOCKED: "locked",
    EXIT_REFUSED: "refused",
    EXIT_NOT_FOUND: "not_found",
    EXIT_CANNOT_OPEN: "cannot_open",
    EXIT_NOT_OWNER: "not_owner",
    EXIT_DATABASE: "database",
    EXIT_DISK_FULL: "disk_full",
}


def honoured_exit(code: int, reported: object) -> int:
    """The exit code to act on: one of loopd's own only if the worker said so first.

    An App may end its worker with any code (``os._exit(4)``); taken at its word, a 4
    would call a healthy log refused and stop restarting the session. Unannounced, such a
    code is a crash (restarted, with the real code in ``last_error``).
    """
    expected = _SAID_FOR.get(code)
    if expected is not None and reported != expected:
        return EXIT_CRASH
    return code


def refused_next(kind: str | None, home: str, session: str, stored: bool = False) -> str:
    """The operator's next step for a refused log of ``kind`` (worker.offline.refusal);
    ``stored``: the session is in a database, which the home's repair tools do not reach."""
    start = f"then `loopd start {session}`"
    if stored:  # the URI is not repeated: it may hold a password
        return (
            f"Next: `loopd inspect --store URI {session}` names the place and `loopd verify "
            f"--store URI` checks every session of the database (URI: serve's --store)"
        )
    inspect = f"`loopd inspect --home {home} {session}`"
    if kind == "torn_tail":
        return (
            f"the newest log's last group is damaged, as a crash mid-write leaves it. Next: "
            f"`loopd repair --home {home} {session}` (it moves that group aside), {start}"
        )
    if kind == "newest":
        return (
            f"damage inside the newest log, not a torn tail. Next: restore it from a backup "
            f"(`loopd restore --home {home} BACKUP --force`), or keep its intact prefix with "
            f"`loopd salvage --home {home} {session}` (what it cuts may hold acknowledged "
            f"work; it says what), {start}"
        )
    if kind == "sealed":
        return (
            f"damage in a sealed epoch's log. Next: restore the session from a backup "
            f"(`loopd restore --home {home} BACKUP --force`); `loopd salvage --home {home} "
            f"{session}` keeps only what comes before the damage; {start}"
        )
    if kind == "missing_baseline":
        return (
            f"epoch 0's baseline is missing. Next: `loopd repair --rebuild-baseline --home "
            f"{home} {session}` (it rebuilds it from the App if the hash matches), {start}"
        )
    if kind == "key_index":
        return (
            f"a key index file is missing or damaged. Next: `loopd repair --home {home} "
            f"{session}` rebuilds the index from the logs, {start}"
        )
    if kind == "baseline":
        return (
            f"a baseline is damaged. Next: restore the session from a backup "
            f"(`loopd restore --home {home} BACKUP --force`), {start}"
        )
    if kind == "unsafe":
        return f"a file of the session is not a regular file. Next: move it aside, {start}"
    return f"Next: {inspect} names the place (docs/operations.md, each kind's drill), {start}"


def outage_wait(code: int, home: str, said: str | None = None) -> str | None:
    """What a session whose worker exited with ``code`` waits for, when that is an outage
    of what every session needs (the database, the home's disk): started again until it
    is over, never FATAL, not counted with the crashes (docs/operations.md). None for any
    other code."""
    if code == EXIT_DATABASE and said is not None and "too many clients" in said:
        return (
            "waiting for a connection: started again until the database takes one (its "
            "max_connections is taken: raise it, cap this node's workers with --max-live, or "
            "put PgBouncer in front: docs/scaling.md, 0.2)"
        )
    if code == EXIT_DATABASE:
        return "waiting for the database: started again until it answers"
    if code == EXIT_DISK_FULL:
        return (
            f"the filesystem of {home} is full: started again until space is freed (nothing "
            "acknowledged was lost; a request refused for it was not applied: send it again)"
        )
    return None


def fatal_reason(
    code: int,
    said: str | None,
    home: str,
    session: str,
    holder: int | None = None,
    kind: str | None = None,
    stored: bool = False,
) -> str | None:
    """The ``last_error`` of a session whose worker exited with ``code``, if that code is
    one a restart will not fix (None: restart it, or it exited cleanly). A refused log's
    ``kind`` (what the worker said of it) picks the next step."""
    if code == EXIT_REFUSED:
        return (
            f"{said or 'log refused'} -- the log is refused and will not be restarted: "
            f"{refused_next(kind, home, session, stored)}"
        )
    if code == EXIT_CANNOT_OPEN:
        return (
            f"{said or 'the session cannot be opened'} -- opening the session failed in a "
            f"way a restart will not fix, so it is not restarted. Next: fix the file or "
            f"directory named (its type, owner, mode, or the free space), then "
            f"`loopd start {session}`"
        )
    if code == EXIT_LOCKED:
        why = said or "the session is locked by another process"
        if holder is not None:
            why += f" (pid {holder} holds it; it is not ours: not fighting it)"
        return why
    if code == EXIT_NOT_FOUND:
        return said or "no such session"
    if code == EXIT_NOT_OWNER:
        # A restart would claim the session back from the process that holds it now, and
        # the two would depose each other in turn: never restarted.
        return (
            f"{said or 'the database refused a write: another owner holds the session'} -- "
            f"another process (a second serve on the same database?) claimed the session, so "
            f"it is not restarted here. Next: stop the other, then `loopd start {session}`"
        )
    return None
