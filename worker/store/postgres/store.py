"""A store of sessions in one PostgreSQL database: ``Session.create(PostgresStore(uri), ...)``.

Each opened session has its own connection (a worker holds one session). Open claims
the session: it raises the owner token in the database, so every write of an earlier
owner is refused from then on (``worker.store.postgres.backend``). Ownership between
nodes is etcd's (docs/scaling.md); a token given to ``open_session`` is that owner's.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from worker.store.baseline import Baseline
from worker.store.creation import check_slot
from worker.store.disk.layout import SESSIONS_DIR
from worker.store.errors import NotOwnerNow, SessionExists, SessionNotFound
from worker.store.format.epoch_records import EpochRecords
from worker.store.format.kept_scan import KeptScan
from worker.store.format.records import SessionStart, encode_lines
from worker.store.format.scan_summary import ScanSummary
from worker.store.format.scan_summary import encode as encode_summary
from worker.store.loader import baseline_path, load_session
from worker.store.postgres.backend import (
    SUMMARY_NAME,
    NotPreloaded,
    PostgresBackend,
    _bytes,
    summary_of_row,
)
from worker.store.postgres.connection import connect, database_error, driver, place_of
from worker.store.postgres.durability import Durability, read_durability
from worker.store.postgres.opening import claim_and_read
from worker.store.postgres.schema import ensure_schema
from worker.store.postgres.session import PostgresSession
from worker.store.session_id import validate_session_id
from worker.store.session_state import SessionState

if TYPE_CHECKING:
    from worker.store.postgres.connection import Connection


class PostgresStore:
    """The sessions of one database, named by a libpq URI (``postgresql://...``)."""

    def __init__(self, uri: str) -> None:
        """Name the database; nothing is connected until a session is made or opened.

        A session's scan summary is kept in the database beside its log (docs/format.md,
        "The scan summary"), where every node's open finds it: no node keeps one.
        """
        self.uri = uri
        self.place = place_of(uri)

    def __repr__(self) -> str:
        return f"PostgresStore({self.place!r})"

    def session_dir(self, session_id: str) -> str:
        """How a session is named in messages: ``<place>/sessions/<id>``."""
        validate_session_id(session_id)
        return os.path.join(self.place, SESSIONS_DIR, session_id)

    def ensure_schema(self) -> int:
        """Create or migrate loopd's tables; return their version (SchemaTooNew if newer)."""
        conn = connect(self.uri, self.place)
        try:
            return ensure_schema(conn, self.place)
        except driver().Error as exc:
            raise database_error(self.place, exc) from exc
        finally:
            conn.close()

    def session_ids(self) -> list[str]:
        """The ids of the database's sessions, sorted (creating the tables if absent)."""
        conn = self._connect()
        try:
            rows = conn.execute("SELECT session FROM loopd_sessions ORDER BY session").fetchall()
        except driver().Error as exc:
            raise database_error(self.place, exc) from exc
        finally:
            conn.close()
        return [str(row[0]) for row in rows]

    def newest_starts(self) -> dict[str, bytes]:
        """The first line (no newline) of each session's newest log, by id, in one query:
        its SessionStart, whose chunk starts the log. Only that line leaves the server."""
        conn = self._connect()
        try:
            rows = conn.execute(_NEWEST_STARTS).fetchall()
        except driver().Error as exc:
            raise database_error(self.place, exc) from exc
        finally:
            conn.close()
        return {str(session): _bytes(line).rstrip(b"\n") for session, line in rows}

    def durability(self) -> Durability:
        """The server's synchronous replication settings, as this store's connections see them."""
        conn = connect(self.uri, self.place)
        try:
            return read_durability(conn)
        except driver().Error as exc:
            raise database_error(self.place, exc) from exc
        finally:
            conn.close()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A connection of the store's (its schema checked) for the block; closed after it."""
        conn = self._connect()
        try:
            yield conn
        except driver().Error as exc:
            raise database_error(self.place, exc) from exc
        finally:
            conn.close()

    def _reconnect(self) -> Connection:
        """A session's new connection, once the server ended its last one between
        statements (``PostgresBackend._conn``); DatabaseUnavailable if none can be made."""
        return connect(self.uri, self.place)

    def _connect(self) -> Connection:
        conn = connect(self.uri, self.place)
        try:
            ensure_schema(conn, self.place)
        except driver().Error as exc:
            conn.close()
            raise database_error(self.place, exc) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def create_session(self, session_id: str, baseline: Baseline, slot: int = 0) -> PostgresSession:
        """Create the session and its epoch 0 in one transaction; SessionExists if it exists."""
        directory = self.session_dir(session_id)
        check_slot(slot)
        start = SessionStart(session=session_id, epoch=0, slot=slot, baseline=baseline.hash())
        line, crc = encode_lines((start,), 0)
        conn = self._connect()
        try:
            with conn.transaction():
                made = conn.execute(
                    "INSERT INTO loopd_sessions (session, owner_token) VALUES (%s, 1) "
                    "ON CONFLICT DO NOTHING RETURNING owner_token",
                    (session_id,),
                ).fetchone()
                if made is None:
                    raise SessionExists(directory)
                conn.execute(
                    "INSERT INTO loopd_files (session, name, data) VALUES (%s, %s, %s)",
                    (session_id, baseline_path("", 0), baseline.to_json()),
                )
                conn.execute(
                    "INSERT INTO loopd_log_chunks (session, epoch, start, data) "
                    "VALUES (%s, 0, 0, %s)",
                    (session_id, line),
                )
        except driver().Error as exc:
            conn.close()
            raise database_error(directory, exc) from exc
        except BaseException:
            conn.close()
            raise
        state = SessionState(
            session_id=session_id,
            directory=directory,
            epoch=0,
            slot=slot,
            baseline=baseline,
            records=EpochRecords.decoded(directory, [start]),
            log_size=len(line),
            carry=None,
            log_crc=crc,
            kept_scan=KeptScan(0, None, bytearray(line)),
        )
        backend = PostgresBackend(conn, directory, session_id, 1, reconnect=self._reconnect)
        session = PostgresSession(state, backend)
        session.keep_summary()  # its first line, when even that is worth one
        return session

    def open_session(self, session_id: str, *, token: int | None = None) -> PostgresSession:
        """Claim the session and read it; SessionNotFound if absent.

        Without ``token`` the claim takes the next token; with one (an etcd owner's) the
        database's must not be newer (NotOwnerNow), and becomes it. The claim and the
        first reads go in one round trip (``opening``); when that claim takes nothing,
        the schema is checked and the claim made again statement by statement, which
        says why (or claims a session created in between).
        """
        directory = self.session_dir(session_id)
        conn = connect(self.uri, self.place)
        state: SessionState | None = None
        try:
            opening = claim_and_read(conn, session_id, token)
            if opening.token is None:
                ensure_schema(conn, self.place)
                claimed = _claim(conn, directory, session_id, token)
                backend = PostgresBackend(
                    conn, directory, session_id, claimed, reconnect=self._reconnect
                )
            else:
                backend = PostgresBackend(
                    conn, directory, session_id, opening.token, reconnect=self._reconnect
                )
                stored = opening.files.pop(SUMMARY_NAME, None)
                known = None if stored is None else summary_of_row(stored)
                with backend.preloaded(opening):
                    state = _loaded(directory, session_id, backend, known)
            if state is None:  # it reads more than the pipeline did: all in one snapshot
                with backend.snapshot():
                    known = backend.stored_summary()
                    state = load_session(
                        directory, session_id, dir_fd=backend, known=known, summarize=True
                    )
        except driver().Error as exc:
            conn.close()
            raise database_error(directory, exc) from exc
        except BaseException:
            conn.close()
            raise
        summary, state.scan_summary = state.scan_summary, None
        if summary is not None:  # a cache, for the next open of any node
            backend.put_summary(encode_summary(summary))
        return PostgresSession(state, backend)

    def open_or_create(self, session_id: str, baseline: Baseline, slot: int = 0) -> PostgresSession:
        """Open the session, creating it if absent (a create is one transaction: none half made)."""
        try:
            return self.open_session(session_id)
        except SessionNotFound:
            pass
        try:
            return self.create_session(session_id, baseline, slot)
        except SessionExists:
            return self.open_session(session_id)  # a concurrent creator won


def _loaded(
    directory: str, session_id: str, backend: PostgresBackend, known: ScanSummary | None
) -> SessionState | None:
    """The session loaded from what the open's pipeline read; None if it needs more."""
    try:
        return load_session(directory, session_id, dir_fd=backend, known=known, summarize=True)
    except NotPreloaded:
        return None


_NEWEST_STARTS: Final = (
    "SELECT c.session, substring(c.data FROM 1 FOR position('\\x0a'::bytea IN c.data)) "
    "FROM (SELECT session, max(epoch) AS epoch FROM loopd_log_chunks GROUP BY session) AS n "
    "JOIN loopd_log_chunks AS c ON c.session = n.session AND c.epoch = n.epoch AND c.start = 0"
)
_CLAIM_ATTEMPTS: Final = 3


def _claim(conn: Connection, directory: str, session_id: str, token: int | None) -> int:
    """Raise the session's owner token (to ``token``, or by one); return the new token.

    One UPDATE, its own transaction: it takes the row's lock (a write in flight, which
    holds it FOR SHARE, is waited for) and commits the new token. No row updated: the
    session was absent when it ran (without ``token`` nothing else stops it), or its
    token is newer than ``token``. The row is read again to say which; one that is there
    now and not newer was created after the UPDATE ran, and is claimed again.
    """
    for _attempt in range(_CLAIM_ATTEMPTS):
        row = conn.execute(
            "UPDATE loopd_sessions SET owner_token = coalesce(%(token)s, owner_token + 1) "
            "WHERE session = %(session)s AND owner_token <= coalesce(%(token)s, owner_token) "
            "RETURNING owner_token",
            {"token": token, "session": session_id},
        ).fetchone()
        if row is not None:
            return int(str(row[0]))
        if token is None:
            raise SessionNotFound(directory)  # a create after the UPDATE is another's
        held = conn.execute(
            "SELECT owner_token FROM loopd_sessions WHERE session = %s", (session_id,)
        ).fetchone()
        if held is None:
            raise SessionNotFound(directory)
        if int(str(held[0])) > token:
            why = f"the database holds owner token {held[0]}, newer than {token}"
            raise NotOwnerNow(directory, why)
    raise SessionNotFound(directory)  # created and gone again, each time it was looked at
