"""The offline tools on a PostgreSQL store (``--store URI``): read, never claim or write.

``verify`` and ``inspect`` read with the loader a home's tools use, in one snapshot,
under no owner token: a live owner is not deposed. ``backup --store`` copies a session
out of the database as a backup directory (restored into a home as any other), and
``restore --store`` puts a backup, of a home's session or a database's, into it.
"""

from __future__ import annotations

import sys
from typing import Final

import click

from worker.offline.backup import BackupError, Point, write_backup
from worker.store.errors import LogError, SessionError
from worker.store.inspection import Inspection
from worker.store.postgres import PostgresStore
from worker.store.postgres.errors import OutcomeUnknown
from worker.store.postgres.transfer import (
    inspect_stored,
    loaded_from,
    put_session,
    read_session,
    session_files,
)

EXIT_REFUSED: Final = 1

store_option = click.option(
    "--store",
    metavar="URI",
    default=None,
    help="A PostgreSQL store (a libpq URI, postgresql://...) instead of a home.",
)


def _refused(exc: SessionError) -> str:
    return str(exc) if isinstance(exc, LogError) else f"refused: {exc}"


def inspect_in_store(uri: str, session_id: str, history: bool) -> Inspection:
    """The session's inspection; exit 1 after printing why it is refused."""
    try:
        return inspect_stored(PostgresStore(uri), session_id, history=history)
    except SessionError as exc:
        click.echo(_refused(exc), err=True)
        sys.exit(EXIT_REFUSED)


def verify_store(uri: str) -> None:
    """``loopd verify --store``: every session, every epoch, canonical; a line each."""
    try:
        store = PostgresStore(uri)
        names = store.session_ids()
    except SessionError as exc:
        click.echo(f"loopd verify: {exc}", err=True)
        sys.exit(2)
    refused = 0
    for name in names:
        try:
            state = read_session(store, name, history=True, canonical=True)
        except SessionError as exc:
            refused += 1
            click.echo(f"REFUSED  {name}  {exc}")
        else:
            click.echo(f"ok       {name}  epoch {state.epoch}  records {len(state.records)}")
    click.echo(f"{len(names)} sessions, {refused} refused")
    if refused:
        sys.exit(EXIT_REFUSED)


def backup_from_store(uri: str, session_id: str, dest: str) -> None:
    """Copy the session, as of one snapshot, into ``<dest>/<id>`` with its manifest."""
    try:
        store = PostgresStore(uri)
        files = session_files(store, session_id)
        state = loaded_from(store, session_id, files)  # the point of the very files copied
        point = Point(state.epoch, state.log_size, "database snapshot")
        result = write_backup(dest, session_id, point, files)
    except (SessionError, BackupError) as exc:
        click.echo(f"loopd backup: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    if result.refused is not None:
        click.echo(f"loopd backup: the copy of {session_id} is refused: {result.refused}", err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(f"backed up {session_id} to {result.directory}: {result.files} files")


def restore_into_store(uri: str, session_id: str, files: dict[str, bytes], source: str) -> None:
    """Create the session in the database from a checked backup's files once they load
    (nothing is written otherwise), then read it back from the database."""
    try:
        store = PostgresStore(uri)
        put_session(store, session_id, files)
        state = read_session(store, session_id, history=True, canonical=True)
    except OutcomeUnknown as exc:
        click.echo(f"loopd restore: {exc}; `loopd verify --store URI` says whether "
                   f"{session_id} is there (if not, restore it again)", err=True)  # fmt: skip
        sys.exit(EXIT_REFUSED)
    except SessionError as exc:
        click.echo(f"loopd restore: {exc}", err=True)
        sys.exit(EXIT_REFUSED)
    click.echo(
        f"restored {session_id} from {source} into {store.place}: {len(files)} files, "
        f"epoch {state.epoch}, {len(state.records)} records; it verifies"
    )
