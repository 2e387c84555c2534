"""``loopd delete`` and ``loopd forget``: a session leaves the home without a restart.

Both act through the running daemon when there is one (it stops the session, and its
``forget`` operation drops the session from its list and clears its intent entry), and
on the files alone when no daemon serves the home. A directory is never removed:
``delete`` moves it to ``<home>/trash/<id>.<UTC time>``, and the session's output log
(``<home>/logs/<id>.log`` and its numbered backups) beside it, to
``<home>/trash/<id>.<UTC time>.logs/``, once the daemon has forgotten the session (so a
session created again under the id starts a log of its own).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Final, NoReturn

import click

from supervisor.cli.offline.offline_commands import EXIT_REFUSED, require_home
from supervisor.cli.options import existing_home_option, timeout_option
from supervisor.client.control import call, daemon_answers
from supervisor.errors import ControlError
from supervisor.hosting.intent import IntentError, IntentFile
from supervisor.hosting.session_log import backup_numbers, backup_path, log_path
from worker.offline.trash import move_to_trash
from worker.store.disk import durable
from worker.store.disk.layout import session_dir
from worker.store.errors import SessionError, SessionNotFound


def _fail(command: str, why: object) -> NoReturn:
    click.echo(f"loopd {command}: {why}", err=True)
    sys.exit(EXIT_REFUSED)


def move_logs_to_trash(home: str, session_id: str, target: str) -> str | None:
    """Move the session's output log and its backups to ``<target>.logs/``.

    Where they went, or None when the session had no log. Called once the daemon no
    longer lists the session, so nothing writes to them while they move.
    """
    path = log_path(home, session_id)
    names = [path] + [backup_path(path, n) for n in backup_numbers(path)]
    present = [name for name in names if os.path.lexists(name)]
    if not present:
        return None
    logs = target + ".logs"
    os.mkdir(logs, 0o700)
    for name in present:
        durable.rename(name, os.path.join(logs, os.path.basename(name)))
    durable.fsync_dir(logs)
    durable.fsync_dir(os.path.dirname(path))
    return logs


def _forget_once_settled(home: str, session_id: str, timeout: float) -> None:
    """Forget a session whose directory is in the trash now. A start that raced the move
    (a ``restart`` between the stop and the move) finds no directory and ends FATAL at
    once: ``busy`` until then, so it is asked again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            call(home, "forget", timeout=timeout, session=session_id)
        except ControlError as exc:
            if exc.code != "busy" or time.monotonic() >= deadline:
                raise
        else:
            return
        time.sleep(0.05)  # the interval between asks, against the deadline above


def forget_offline(home: str, session_id: str) -> None:
    """No daemon runs: clear the session's intent entry in the file itself."""
    intent = IntentFile(home)
    intent.load()
    intent.forget(session_id)


@click.command()
@existing_home_option
@timeout_option
@click.argument("session_id", metavar="ID")
def delete(home: str, timeout: float, session_id: str) -> None:
    """Stop session ID, move its directory to <home>/trash/, and forget it.

    Nothing is removed: the directory keeps every file, under ``trash/<id>.<time>``.
    """
    require_home("delete", home)
    try:
        directory = session_dir(home, session_id)
        live = daemon_answers(home, timeout)
        if live:
            try:
                call(home, "stop", timeout=timeout, session=session_id)
            except ControlError as exc:
                if exc.code != "not_found":  # not hosted: its files alone are moved
                    raise
        try:
            target = move_to_trash(home, session_id)
        except SessionNotFound:
            # No directory (a create that never got its first log, or one moved aside):
            # nothing to move, and what is left of it is the daemon's list and the intent.
            _fail("delete", f"{directory}: no session directory to move to the trash; "
                  f"`loopd forget --home {home} {session_id}` drops the session from the "
                  "daemon's list and the intent")  # fmt: skip
        if live:
            _forget_once_settled(home, session_id, timeout)
        else:
            forget_offline(home, session_id)
        logs = move_logs_to_trash(home, session_id, target)
    except (ControlError, SessionError, IntentError) as exc:
        _fail("delete", exc)
    except OSError as exc:
        _fail("delete", f"{directory} is in the trash, but its log could not follow: {exc}")
    how = "the daemon no longer lists it" if live else "no daemon runs; its intent is cleared"
    click.echo(f"moved {directory}\n   to {target}")
    if logs is not None:
        click.echo(f"moved {log_path(home, session_id)}\n   to {logs}")
    click.echo(f"{how}; `loopd create {session_id}` is free")


@click.command()
@existing_home_option
@timeout_option
@click.argument("session_id", metavar="ID")
def forget(home: str, timeout: float, session_id: str) -> None:
    """Stop listing session ID, whose directory was moved out of <home>/sessions/.

    Refused while the directory is there (``loopd delete`` moves it) or a worker runs.
    """
    require_home("forget", home)
    try:
        directory = session_dir(home, session_id)
        if daemon_answers(home, timeout):
            said = call(home, "forget", timeout=timeout, session=session_id)
            if isinstance(said, dict) and said.get("forgotten") is False:
                click.echo(f"nothing to forget: the daemon lists no session {session_id} "
                           "(an intent entry for it, if any, is cleared)")  # fmt: skip
                return
            how = "the daemon no longer lists it and its intent is cleared"
        elif os.path.lexists(directory):
            _fail("forget", f"{directory}: the session's directory is still there; "
                  "`loopd delete` moves it to the trash and forgets it")  # fmt: skip
        else:
            forget_offline(home, session_id)
            how = "no daemon runs; its intent is cleared"
    except (ControlError, SessionError, IntentError) as exc:
        _fail("forget", exc)
    click.echo(f"forgot {session_id}: {how}; `loopd create {session_id}` is free")


COMMANDS: Final = (delete, forget)
