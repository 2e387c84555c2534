"""A session's storage in PostgreSQL: the same named bytes as a directory, fenced by a token.

``loopd_files`` holds what the file store writes whole (baselines, key index segments);
``loopd_log_chunks`` holds each epoch's log as the group commits appended to it, in
order of their byte offset, so a log read here is byte for byte the file store's. Every
write is one transaction that first locks the session's row ``FOR SHARE`` and checks its
``owner_token`` is this writer's (Temporal's RangeID): a claim by a newer owner updates
that row, so it waits for a write in flight, and every later write of the deposed owner
is refused in its own transaction (NotOwnerNow) before anything of it is visible.
"""

from __future__ import annotations

import errno
import re
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from itertools import accumulate
from typing import TYPE_CHECKING, Final

from worker.store.disk.scan_file import MAX_BYTES
from worker.store.errors import InvalidLog, NotOwnerNow, SessionError, SessionIOError
from worker.store.format.scan_summary import ScanSummary, decode
from worker.store.postgres.boundaries import Point, reach
from worker.store.postgres.connection import (
    check_held,
    database_error,
    driver,
    lost_while_idle,
)
from worker.store.postgres.errors import DatabaseUnavailable, LostBeforeWrite
from worker.store.postgres.opening import NAMES
from worker.store.postgres.pipeline import BINARY, TEXT, Prepared, write_pipelined

if TYPE_CHECKING:
    from worker.store.postgres.connection import Connection
    from worker.store.postgres.opening import Opening

_LOG_NAME: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
_OWNER: Final = "SELECT owner_token FROM loopd_sessions WHERE session = %s FOR SHARE"
# The fence and the write in one statement: it inserts only where the session's row,
# locked FOR SHARE, holds this writer's token (a claim in flight is waited for, and the
# row read again once it committed). Parameters: epoch, start, data, session, token.
_APPEND: Final = Prepared(
    name=b"loopd_append",
    sql=b"INSERT INTO loopd_log_chunks (session, epoch, start, data) "
    b"SELECT session, $1, $2, $3 FROM loopd_sessions "
    b"WHERE session = $4 AND owner_token = $5 FOR SHARE",
    types=(23, 20, 17, 25, 20),  # int4, int8, bytea, text, int8
    formats=(TEXT, TEXT, BINARY, TEXT, TEXT),
)


# The newest log's scan summary (worker.store.format.kept_scan), a row of loopd_files
# under a name no file of a session has, which ``NAMES`` leaves out: no reader of the
# session's files sees it (a backup, a transfer, a fork never carries one).
SUMMARY_NAME: Final = "loopd.scan"
# Stored deflated (level 1, about 0.2 ms for 50 KB): PostgreSQL compresses any value past
# 2 KB itself, and its pglz took about 2.5 ms of the server's for a summary's partly
# repetitive bytes, on the path of the request whose group commit wrote it.
_DEFLATE_LEVEL: Final = 1
# Fenced as every write, in a transaction of its own, sent as one pipeline. It runs
# after a group commit and before its reply, so it never waits long: a lock held on
# loopd_files (a VACUUM FULL, a LOCK TABLE, the row locked) or a slow server ends it
# (its timeouts), and its COMMIT does not wait for the WAL to be flushed: a summary not
# written costs the next open a longer scan and nothing else. ``SET LOCAL``'s: for this
# transaction only.
_SUMMARY_LIMITS: Final = (
    "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true), "
    "set_config('synchronous_commit', 'off', true)"
)
SUMMARY_LOCK_WAIT: Final = "100ms"
SUMMARY_STATEMENT_TIME: Final = "2s"
_PUT_SUMMARY: Final = (
    "INSERT INTO loopd_files (session, name, data) "
    "SELECT session, %s, %b FROM loopd_sessions "
    "WHERE session = %s AND owner_token = %s FOR SHARE "
    "ON CONFLICT (session, name) DO UPDATE SET data = EXCLUDED.data"
)


class NotPreloaded(Exception):
    """A read of what an open's pipeline did not read (an older epoch's log, a file absent)."""


class PostgresBackend:
    """One session's rows, held by the writer whose token is ``token`` (worker.store.backend)."""

    def __init__(
        self,
        conn: Connection,
        directory: str,
        session_id: str,
        token: int,
        *,
        reconnect: Callable[[], Connection] | None = None,
    ) -> None:
        """Wrap an open connection; ``directory`` names the session in messages;
        ``reconnect`` makes a new one when the server ended this one between statements."""
        self.conn: Connection | None = conn
        self._reconnect = reconnect
        # This writer's log (its epoch, its end), which a new connection must find there.
        self.holds: Callable[[], tuple[int, int]] | None = None
        self.diverged: LostBeforeWrite | None = None
        self.directory = directory
        self.session_id = session_id
        self.token = token
        # Called inside a write's transaction, after its statements and before COMMIT
        # (the tests cut the connection there; the rig's faults use boundaries.set_hook).
        self.before_commit: Callable[[], None] | None = None
        # Whether _APPEND is prepared on this connection (None: not known after a rollback).
        self._prepared: bool | None = False
        # Inside snapshot(): the names, read once (the open asks for them twice).
        self._in_snapshot = False
        self._snapshot_names: list[str] | None = None
        # Inside preloaded(): what the open's pipeline read, and nothing else.
        self._preloaded: Opening | None = None

    def _conn(self) -> Connection:
        """The connection for the next statement: a new one if the server ended the last
        between statements (a restart: nothing of ours in flight, every write fenced by
        the token), never inside an open's snapshot or preloaded reads."""
        conn = self.conn
        if conn is None:
            raise SessionIOError(self.directory, errno.EBADF, "use of a closed store connection")
        between = not self._in_snapshot and self._preloaded is None
        if self._reconnect is not None and between and lost_while_idle(conn):
            conn.close()
            try:
                conn = self.conn = self._reconnect()
            except DatabaseUnavailable as exc:  # still away: nothing of this was sent
                why = f"the connection to the database was lost, a new one failed ({exc.why})"
                raise LostBeforeWrite(self.directory, f"{why}: nothing of this was sent") from exc
            self._prepared = False
            if self.holds is not None:  # as this writer wrote it, or nothing goes on it
                self.diverged = check_held(conn, self.directory, self.session_id, *self.holds())
                if self.diverged is not None:
                    raise self.diverged
        return conn

    def _writable(self) -> Connection:
        """The connection for a write; LostBeforeWrite if it is known lost already (a
        statement before it met the loss): then nothing of the write is sent."""
        conn = self._conn()
        if conn.closed:
            raise LostBeforeWrite(self.directory, "the connection to the database was lost "
                                  "before this write: nothing of it was sent")  # fmt: skip
        return conn

    # -- reading ------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The session's file names and ``<n>.jsonl`` for each epoch with a log."""
        if self._preloaded is not None:
            return list(self._preloaded.names)
        if self._snapshot_names is not None:
            return list(self._snapshot_names)
        rows = self._fetch(NAMES, {"session": self.session_id})
        names = [str(row[0]) for row in rows]
        if self._in_snapshot:
            self._snapshot_names = names  # a snapshot sees the same names until it ends
        return list(names)

    def read(self, name: str, path: str) -> bytes:
        """The bytes of ``name``: a file's, or an epoch log's chunks joined in order."""
        preloaded = self._preloaded
        if preloaded is not None:
            if name in preloaded.logs:
                return joined(path, *preloaded.logs[name])
            if name in preloaded.files:
                return preloaded.files[name]
            raise NotPreloaded(name)
        if _LOG_NAME.fullmatch(name):
            rows = self._fetch(
                "SELECT start, data FROM loopd_log_chunks WHERE session = %s AND epoch = %s "
                "ORDER BY start",
                (self.session_id, int(name[: -len(".jsonl")])),
                binary=True,  # bytea as its bytes: no hex text to send and decode
            )
            return joined(path, [_int(row[0]) for row in rows], [_bytes(row[1]) for row in rows])
        rows = self._fetch(
            "SELECT data FROM loopd_files WHERE session = %s AND name = %s",
            (self.session_id, name),
        )
        if not rows:
            raise SessionIOError(path, errno.ENOENT, "read")
        return _bytes(rows[0][0])

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Read everything inside as of one moment (a REPEATABLE READ transaction)."""
        conn = self._conn()
        try:
            with self._rolled_back_on_error(), conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                self._in_snapshot = True
                yield
        except driver().Error as exc:
            raise database_error(self.directory, exc) from exc
        finally:
            self._in_snapshot, self._snapshot_names = False, None

    @contextmanager
    def preloaded(self, opening: Opening) -> Iterator[None]:
        """Read only what an open's pipeline read (``opening.claim_and_read``), as of its
        snapshot; NotPreloaded for anything else (read it all again in one snapshot)."""
        self._preloaded = opening
        try:
            yield
        finally:
            self._preloaded = None

    def _fetch(
        self, query: str, args: tuple[object, ...] | dict[str, object], *, binary: bool = False
    ) -> list[tuple[object, ...]]:
        try:
            return self._conn().execute(query, args, binary=binary).fetchall()
        except driver().Error as exc:
            raise database_error(self.directory, exc) from exc

    # -- writing ------------------------------------------------------------------------

    def append_group(self, epoch: int, offset: int, data: bytes) -> None:
        """Insert one group commit's bytes at ``offset`` of ``epoch``'s log, fenced, committed.

        BEGIN, the fenced INSERT and COMMIT go in one round trip (``pipeline``); the
        boundaries are reached as in every fenced write, BEFORE_COMMIT once BEGIN and
        the INSERT are sent. No row inserted is the refusal: that transaction held
        nothing and its COMMIT made nothing visible.
        """
        conn = self._writable()
        values = (b"%d" % epoch, b"%d" % offset, data, self.session_id.encode(), b"%d" % self.token)
        try:
            if self._prepared is None:
                self._prepared = _is_prepared(conn, _APPEND)
            pid = conn.pgconn.backend_pid
            sent = partial(self._before_commit, pid)
            rows = write_pipelined(conn, _APPEND, values, prepare=not self._prepared, on_sent=sent)
            self._prepared = True
            if rows != 1:
                raise self._deposed(conn)
            reach(Point.AFTER_COMMIT, pid)
        except driver().Error as exc:
            raise database_error(self.directory, exc) from exc

    def start_epoch(self, epoch: int, files: dict[str, bytes], first_line: bytes) -> None:
        """Write ``files`` and epoch ``epoch``'s first line in one fenced transaction."""
        with self._fenced() as conn:
            for name, data in files.items():
                conn.execute(
                    "INSERT INTO loopd_files (session, name, data) VALUES (%s, %s, %s) "
                    "ON CONFLICT (session, name) DO UPDATE SET data = EXCLUDED.data",
                    (self.session_id, name, data),
                )
            conn.execute(
                "INSERT INTO loopd_log_chunks (session, epoch, start, data) VALUES (%s, %s, 0, %s)",
                (self.session_id, epoch, first_line),
            )

    def remove(self, names: list[str]) -> None:
        """Delete the files ``names`` (stale key index segments), fenced."""
        if names:
            with self._fenced() as conn:
                conn.execute(
                    "DELETE FROM loopd_files WHERE session = %s AND name = ANY(%s)",
                    (self.session_id, names),
                )

    def stored_summary(self) -> ScanSummary | None:
        """The newest log's scan summary kept in the database, if one decodes."""
        rows = self._fetch(
            "SELECT data FROM loopd_files WHERE session = %s AND name = %s",
            (self.session_id, SUMMARY_NAME),
        )
        return summary_of_row(_bytes(rows[0][0])) if rows else None

    def put_summary(self, blob: bytes) -> None:
        """Keep the newest log's scan summary where any node's open reads it; a cache: a
        write refused, failed or with no connection is let go (the next write meets why)."""
        try:
            conn = self._conn()
            stored = zlib.compress(blob, _DEFLATE_LEVEL)
            with conn.pipeline(), conn.transaction():
                conn.execute(_SUMMARY_LIMITS, (SUMMARY_LOCK_WAIT, SUMMARY_STATEMENT_TIME))
                conn.execute(_PUT_SUMMARY, (SUMMARY_NAME, stored, self.session_id, self.token))
        except (driver().Error, SessionError):  # a new connection refused too: let go
            self._prepared = None  # a rollback may have deallocated _APPEND: asked again

    def check_fence(self) -> None:
        """NotOwnerNow unless the session's owner token is still this writer's."""
        with self._fenced():
            pass

    @contextmanager
    def _fenced(self) -> Iterator[Connection]:
        """One transaction that holds the session's row shared and checks the owner's token.

        It is committed when the block ends; nothing of it is visible if the token is
        not this writer's, if a statement fails, or if the connection is lost before
        COMMIT. A COMMIT whose reply was lost has an unknown outcome: the error says so,
        and the caller breaks the session (the next open reads what is there).
        """
        conn = self._writable()
        psycopg = driver()
        try:
            with self._rolled_back_on_error(), conn.transaction():
                row = conn.execute(_OWNER, (self.session_id,)).fetchone()
                if row is None or int(str(row[0])) != self.token:
                    raise self._deposed(conn)
                yield conn
                self._before_commit(conn.info.backend_pid)
            reach(Point.AFTER_COMMIT, conn.info.backend_pid)
        except psycopg.Error as exc:
            raise database_error(self.directory, exc) from exc

    @contextmanager
    def _rolled_back_on_error(self) -> Iterator[None]:
        """Around a psycopg transaction: one rolled back may have deallocated _APPEND.

        psycopg deallocates every prepared statement of the connection when it rolls a
        transaction back (if it prepared any of its own), loopd's too.
        """
        try:
            yield
        except BaseException:
            self._prepared = None
            raise

    def _before_commit(self, backend_pid: int) -> None:
        """What runs between a write's statements and its COMMIT: the test's hook, the rig's."""
        if self.before_commit is not None:
            self.before_commit()
        reach(Point.BEFORE_COMMIT, backend_pid)

    def _deposed(self, conn: Connection) -> NotOwnerNow:
        """The refusal of a write whose fence failed, naming the token the database holds."""
        row = conn.execute(
            "SELECT owner_token FROM loopd_sessions WHERE session = %s", (self.session_id,)
        ).fetchone()
        owner = None if row is None else int(str(row[0]))
        why = f"the database holds owner token {owner}, this writer's is {self.token}"
        return NotOwnerNow(self.directory, why)

    def close(self) -> None:
        """Close the connection; idempotent."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


def summary_of_row(data: bytes) -> ScanSummary | None:
    """The scan summary a ``loopd.scan`` row holds (deflated by ``put_summary``); None for
    anything else, and for one that inflates past ``MAX_BYTES`` (no more is inflated)."""
    inflate = zlib.decompressobj()
    try:
        blob = inflate.decompress(data, MAX_BYTES + 1)
    except zlib.error:
        return None
    if not inflate.eof or inflate.unused_data or len(blob) > MAX_BYTES:
        return None
    return decode(blob)


def _is_prepared(conn: Connection, statement: Prepared) -> bool:
    """Whether the connection holds ``statement`` prepared (its name in pg_prepared_statements)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE name = %s", (statement.name.decode(),)
    ).fetchone()
    return row is not None and int(str(row[0])) > 0


def joined(path: str, starts: list[int], chunks: list[bytes]) -> bytes:
    """A log's bytes from its chunks; InvalidLog where a chunk does not start at the end."""
    if not chunks:
        raise SessionIOError(path, errno.ENOENT, "read")
    ends = list(accumulate(map(len, chunks), initial=0))
    if starts != ends[:-1]:
        n = next(n for n, start in enumerate(starts) if start != ends[n])
        raise InvalidLog(
            path,
            b"".join(chunks[:n]).count(b"\n") + 1,
            f"a stored chunk starts at byte {starts[n]}, the log so far ends at byte {ends[n]}",
        )
    return b"".join(chunks)


def _int(value: object) -> int:
    """An integer column's value."""
    if isinstance(value, int):
        return value
    raise TypeError(f"an integer column held {type(value).__name__}")


def _bytes(value: object) -> bytes:
    """A bytea column's value (psycopg returns bytes; memoryview with other loaders)."""
    if isinstance(value, bytes | memoryview | bytearray):
        return bytes(value)
    raise TypeError(f"a bytea column held {type(value).__name__}")
