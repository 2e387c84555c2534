"""Mutants of the PostgreSQL backend, caught only by the faults at its seam (chaos.postgres)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from worker.store.errors import NotOwnerNow
from worker.store.postgres import backend
from worker.store.postgres.boundaries import Point, reach
from worker.store.postgres.connection import database_error, driver

if TYPE_CHECKING:
    from worker.store.postgres.connection import Connection

_OWNER = "SELECT owner_token FROM loopd_sessions WHERE session = %s"


def fence_checked_apart() -> None:
    """The owner's token is checked in a transaction of its own, then the write made in another."""

    @contextmanager
    def fenced(self: backend.PostgresBackend, *, checked: bool = True) -> Iterator[Connection]:
        del checked  # the check is always the separate one below
        conn = self._conn()
        psycopg = driver()
        try:
            row = conn.execute(_OWNER, (self.session_id,)).fetchone()  # autocommit: its own
            owner = None if row is None else int(str(row[0]))
            if owner != self.token:
                raise NotOwnerNow(self.directory, f"the database holds owner token {owner}")
            with conn.transaction():
                yield conn
                reach(Point.BEFORE_COMMIT, conn.info.backend_pid)
            reach(Point.AFTER_COMMIT, conn.info.backend_pid)
        except psycopg.Error as exc:
            raise database_error(self.directory, exc) from exc

    def append_group(self: backend.PostgresBackend, epoch: int, offset: int, data: bytes) -> None:
        with self._fenced() as conn:
            conn.execute(
                "INSERT INTO loopd_log_chunks (session, epoch, start, data) "
                "VALUES (%s, %s, %s, %s)",
                (self.session_id, epoch, offset, data),
            )

    backend.PostgresBackend._fenced = fenced  # type: ignore[method-assign]
    backend.PostgresBackend.append_group = append_group  # type: ignore[method-assign]


def sealed_log_read_from_directory() -> None:
    """A retry of a sealed epoch's key reads that log from the session's directory, which a
    database's session does not have (as the PostgreSQL store once did)."""
    from worker.store import request_records  # noqa: PLC0415 - patched in the child only
    from worker.store.epochs.sealed_logs import read_sealed  # noqa: PLC0415

    def sealed_records(session: object, epoch: int) -> list[object]:
        return list(read_sealed(session.dir, epoch).records)  # type: ignore[attr-defined]

    request_records.sealed_records = sealed_records  # type: ignore[assignment]
