"""A session read without claiming it, and a session's files moved in or out whole.

``loopd verify/inspect --store`` read with the loader the file store's tools use, in one
REPEATABLE READ snapshot, under no token: nothing is written, the owner is not deposed.
``loopd restore --store`` puts a backup's files (docs/operations.md) into the database
in one transaction; ``loopd backup --store`` takes them out as of one snapshot, so a
session moves between a home and a database as the same bytes.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from worker.store.errors import SessionExists, SessionIOError, SessionNotFound
from worker.store.inspection import Inspection, summarize, type_counts
from worker.store.loader import load_session
from worker.store.postgres.backend import _LOG_NAME, PostgresBackend
from worker.store.postgres.connection import database_error, driver
from worker.store.postgres.errors import OutcomeUnknown

if TYPE_CHECKING:
    from worker.store.format.records import Record
    from worker.store.postgres.store import PostgresStore
    from worker.store.session_state import SessionState

# A reader's backend holds no owner token: every write it tried would be refused.
_NO_OWNER: Final = 0


def read_session(
    store: PostgresStore,
    session_id: str,
    *,
    on_epoch: Callable[[Sequence[Record]], None] | None = None,
    history: bool = False,
    canonical: bool = False,
) -> SessionState:
    """Load the session as ``load_session`` does, in one snapshot, without claiming it."""
    directory = store.session_dir(session_id)
    with store.connection() as conn:
        backend = PostgresBackend(conn, directory, session_id, _NO_OWNER)
        with backend.snapshot():
            if not backend.names():
                raise SessionNotFound(directory)
            return load_session(
                directory, session_id, dir_fd=backend, on_epoch=on_epoch,
                history=history, canonical=canonical,
            )  # fmt: skip


class FilesInMemory:
    """A session's files held in memory, read as a backend's (``StoredFiles``)."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def names(self) -> list[str]:
        return sorted(self.files)

    def read(self, name: str, path: str) -> bytes:
        if name not in self.files:
            raise SessionIOError(path, errno.ENOENT, "read")
        return self.files[name]


def session_files(store: PostgresStore, session_id: str) -> dict[str, bytes]:
    """Every file of the session as a home would hold it, as of one snapshot."""
    directory = store.session_dir(session_id)
    with store.connection() as conn:
        backend = PostgresBackend(conn, directory, session_id, _NO_OWNER)
        with backend.snapshot():
            names = backend.names()
            if not names:
                raise SessionNotFound(directory)
            return {name: backend.read(name, f"{directory}/{name}") for name in names}


def loaded_from(
    store: PostgresStore, session_id: str, files: dict[str, bytes], *, history: bool = False
) -> SessionState:
    """The session ``files`` (a session's files in memory) load to, as session
    ``session_id`` of ``store`` (``history``: every epoch, canonically)."""
    return load_session(store.session_dir(session_id), session_id, dir_fd=FilesInMemory(files),
                        history=history, canonical=history)  # fmt: skip


def put_session(store: PostgresStore, session_id: str, files: dict[str, bytes]) -> SessionState:
    """Create the session from ``files`` in one transaction, once they load as session
    ``session_id`` (every epoch, canonically: nothing is written otherwise); the state
    they load to. SessionExists if it exists; OutcomeUnknown if the connection is lost
    while the transaction commits."""
    directory = store.session_dir(session_id)
    state = loaded_from(store, session_id, files, history=True)
    committing = False
    with store.connection() as conn:
        try:
            with conn.transaction():
                made = conn.execute(
                    "INSERT INTO loopd_sessions (session, owner_token) VALUES (%s, 1) "
                    "ON CONFLICT DO NOTHING RETURNING owner_token",
                    (session_id,),
                ).fetchone()
                if made is None:
                    raise SessionExists(directory)
                for name, data in sorted(files.items()):
                    if _LOG_NAME.fullmatch(name):
                        conn.execute(
                            "INSERT INTO loopd_log_chunks (session, epoch, start, data) "
                            "VALUES (%s, %s, 0, %s)",
                            (session_id, int(name[: -len(".jsonl")]), data),
                        )
                    else:
                        conn.execute(
                            "INSERT INTO loopd_files (session, name, data) VALUES (%s, %s, %s)",
                            (session_id, name, data),
                        )
                committing = True
        except driver().Error as exc:
            if committing:
                raise OutcomeUnknown(directory, f"{exc}".strip()) from exc
            raise database_error(directory, exc) from exc
    return state


def inspect_stored(store: PostgresStore, session_id: str, *, history: bool = False) -> Inspection:
    """``inspect_session`` of a session in the database (``--all``: ``history``, canonical)."""
    counts: list[dict[str, int]] = []

    def count_epoch(records: Sequence[Record]) -> None:
        counts.append(type_counts(records))

    state = read_session(
        store, session_id, on_epoch=count_epoch, history=history, canonical=history
    )
    return summarize(state, store.session_dir(session_id), counts)
