"""One write's transaction in one round trip: BEGIN, a prepared statement and COMMIT, pipelined.

psycopg's ``conn.transaction()`` sends BEGIN, the statement and COMMIT one after the
other, waiting for each reply through its generic machinery; its own ``conn.pipeline()``
still flushes and polls once per statement. Here libpq's pipeline mode is used as libpq
offers it: the three messages are queued, BEGIN and the statement flushed, the caller's
``on_sent`` called, COMMIT and a Sync flushed, and the replies read in one wait. The
transaction is the same as psycopg's: the server runs BEGIN and the statement as they
arrive (holding what the statement locks from then on) and commits only at COMMIT; this
returns once COMMIT's reply is read, and nothing of it is visible before.
"""

from __future__ import annotations

import select
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from worker.store.postgres.connection import driver

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from types import ModuleType

    from psycopg.pq.abc import PGconn, PGresult

    from worker.store.postgres.connection import Connection

# libpq's parameter formats: 0 text, 1 binary.
TEXT: Final = 0
BINARY: Final = 1

# libpq's ExecStatusType and ConnStatusType values (libpq-fe.h; psycopg's pq.ExecStatus
# and pq.ConnStatus name the same numbers), compared as plain ints on every write.
_COMMAND_OK: Final = 1
_FATAL_ERROR: Final = 7
_PIPELINE_SYNC: Final = 10
_CONNECTION_BAD: Final = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A statement prepared once per connection: its name, its SQL (``$n``), its parameters."""

    name: bytes
    sql: bytes
    types: tuple[int, ...]  # each parameter's type OID
    formats: tuple[int, ...]  # TEXT or BINARY, per parameter


def write_pipelined(
    conn: Connection,
    statement: Prepared,
    values: Sequence[bytes],
    *,
    prepare: bool,
    on_sent: Callable[[], None],
) -> int:
    """Run BEGIN, ``statement`` with ``values`` and COMMIT in one round trip; its row count.

    ``prepare``: the connection has not prepared ``statement`` yet (its Parse goes first,
    in the same round trip). ``on_sent`` is called once BEGIN and the statement are sent
    and before COMMIT is. Any failure (a statement refused, the connection lost, an
    exception from ``on_sent``) raises the driver's error, or ``on_sent``'s, and closes
    the connection: the server rolls back a transaction left open, and a write whose
    outcome is unknown leaves its session broken anyway.
    """
    psycopg = driver()
    pgconn = conn.pgconn
    try:
        pgconn.enter_pipeline_mode()
        if prepare:
            pgconn.send_prepare(statement.name, statement.sql, param_types=statement.types)
        pgconn.send_query_params(b"BEGIN", None)
        pgconn.send_query_prepared(statement.name, values, param_formats=statement.formats)
        flush(pgconn)
        on_sent()
        pgconn.send_query_params(b"COMMIT", None)
        pgconn.pipeline_sync()
        flush(pgconn)
        results = pipeline_results(pgconn, psycopg)
        pgconn.exit_pipeline_mode()
        written = _checked(results, psycopg, conn)
    except BaseException:
        conn.close()
        raise
    return written


def flush(pgconn: PGconn) -> None:
    """Send everything queued (the connection is non-blocking: wait while the socket is full)."""
    while pgconn.flush():
        _wait(pgconn.socket, select.POLLOUT)


def pipeline_results(pgconn: PGconn, psycopg: ModuleType) -> list[PGresult]:
    """Every result up to the pipeline's next Sync, in order."""
    sync, bad = _PIPELINE_SYNC, _CONNECTION_BAD
    results: list[PGresult] = []
    readable: select.poll | None = None  # one poller for every wait (a log comes in many)
    while True:
        if pgconn.is_busy():
            if readable is None:
                readable = select.poll()
                readable.register(pgconn.socket, select.POLLIN)
            readable.poll()
            pgconn.consume_input()  # OperationalError once the server has gone
            continue
        result = pgconn.get_result()
        if result is None:  # the end of one statement's results
            if pgconn.status == bad:
                raise psycopg.OperationalError("the connection was lost in a pipeline")
            continue
        if result.status == sync:
            return results
        results.append(result)


def _checked(results: list[PGresult], psycopg: ModuleType, conn: Connection) -> int:
    """The statement's row count; the first error's driver exception if any step failed."""
    for result in results:
        status = result.status
        if status == _FATAL_ERROR:
            # As psycopg raises it: the SQLSTATE's class, the server's message and fields.
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
        if status != _COMMAND_OK:
            status = psycopg.pq.ExecStatus(result.status).name
            raise psycopg.OperationalError(f"a pipelined step ended {status}")
    commit = results[-1].command_status
    if commit != b"COMMIT":
        raise psycopg.OperationalError(f"COMMIT answered {commit!r}")
    return int(results[-2].command_tuples or 0)


def _wait(fd: int, event: int) -> None:
    """Block until ``fd`` is ready for ``event`` (poll: no FD_SETSIZE limit)."""
    poller = select.poll()
    poller.register(fd, event)
    poller.poll()
