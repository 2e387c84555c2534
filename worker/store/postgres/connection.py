"""One connection to the store's database: the driver imported only here, and only when used.

``from worker import Session`` never imports psycopg: a file store needs nothing beyond
the default install (docs/dependencies.md); a ``postgresql://`` store imports it at its
first connection, and says in one line how to install it when it is missing.
"""

from __future__ import annotations

import importlib
import select
from typing import TYPE_CHECKING, Final

from worker.store.postgres.errors import DatabaseUnavailable, LostBeforeWrite, PostgresNotInstalled

if TYPE_CHECKING:
    from types import ModuleType

    import psycopg

    Connection = psycopg.Connection[tuple[object, ...]]

_INSTALL: Final = "the postgres extra is not installed: pip install 'loopd[postgres]'"


def driver() -> ModuleType:
    """The psycopg module, imported now; PostgresNotInstalled if it is missing."""
    if _imported:  # once imported, asked on every write: no trip through importlib
        return _imported[0]
    try:
        module = importlib.import_module("psycopg")
    except ImportError as exc:
        raise PostgresNotInstalled("postgresql", _INSTALL) from exc
    _imported.append(module)
    return module


_imported: list[ModuleType] = []


def place_of(uri: str) -> str:
    """The store's name in messages: the URI without its password or options."""
    driver()  # PostgresNotInstalled in one line, before its submodule is looked for
    conninfo = importlib.import_module("psycopg.conninfo")
    try:
        parts = conninfo.conninfo_to_dict(uri)
    except driver().ProgrammingError as exc:
        raise DatabaseUnavailable("postgresql", f"not a libpq connection string: {exc}") from exc
    user = f"{parts['user']}@" if parts.get("user") else ""
    host = str(parts.get("host") or "localhost")
    port = f":{parts['port']}" if parts.get("port") else ""
    return f"postgresql://{user}{host}{port}/{parts.get('dbname') or ''}"


def connect(uri: str, place: str) -> Connection:
    """A new autocommit connection to ``uri``; DatabaseUnavailable if it cannot be made.

    Within CONNECT_TIMEOUT seconds unless the URI says otherwise (libpq waits for ever,
    psycopg 130 s): a database that accepts a connection and never answers (stopped,
    black-holed) is unavailable, as a refused one is, not a hang of whoever connects (a
    worker's start, killed past its deadline and counted as a failed start; serve's own
    start, deaf to SIGTERM meanwhile)."""
    psycopg = driver()
    timeout = {} if "connect_timeout" in uri else {"connect_timeout": CONNECT_TIMEOUT}
    try:
        conn: Connection = psycopg.connect(uri, autocommit=True, **timeout)
    except psycopg.Error as exc:
        raise DatabaseUnavailable(place, _one_line(exc)) from exc
    return conn


CONNECT_TIMEOUT: Final = 10


def lost_while_idle(conn: Connection) -> bool:
    """Whether the server ended ``conn`` since its last statement (a restart of the
    database, ``pg_terminate_backend``): it sent its last words (a FATAL) and closed, and
    nothing of ours is in flight. A poll of the socket, with no wait: what it holds is read
    (libpq reads the server's last words first, and meets the end of the stream on the
    next read, which the socket is still ready for); a notice leaves it alive."""
    if conn.closed:
        return True
    pgconn = conn.pgconn
    ready = select.poll()
    ready.register(pgconn.socket, select.POLLIN)
    for _read in range(2):
        if not ready.poll(0):
            return False
        try:
            pgconn.consume_input()
        except driver().OperationalError:
            return True
    return bool(conn.closed)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def database_error(place: str, exc: BaseException) -> DatabaseUnavailable:
    """The store's error for a driver error ``exc`` (raise it ``from exc``)."""
    return DatabaseUnavailable(place, _one_line(exc))


_END_OF_LOG: Final = (
    "SELECT coalesce(max(start + octet_length(data)), 0) FROM loopd_log_chunks "
    "WHERE session = %s AND epoch = %s"
)


def check_held(
    conn: Connection, place: str, session_id: str, epoch: int, size: int
) -> LostBeforeWrite | None:
    """On a new connection: None if the database holds epoch ``epoch``'s log to ``size``
    bytes, as this writer wrote it. A failover to a standby that lacked acknowledged
    writes holds less: a write at this writer's offset would leave a gap, so ``conn`` is
    closed and the refusal returned (the session breaks, and is opened again from what
    the database holds)."""
    try:
        row = conn.execute(_END_OF_LOG, (session_id, epoch)).fetchone()
    except driver().Error as exc:
        conn.close()
        why = f"the connection to the database was lost, a new one failed ({_one_line(exc)})"
        raise LostBeforeWrite(place, f"{why}: nothing of this was sent") from exc
    held = int(str(row[0])) if row is not None else 0
    if held == size:
        return None
    conn.close()
    return LostBeforeWrite(place, (
            f"after a new connection the database holds {held} bytes of epoch {epoch}'s log "
            f"where this writer wrote {size} (a failover to a server without the newest "
            "writes?): nothing of this was sent, and the session is opened again from what "
            "the database holds"
        ))  # fmt: skip
