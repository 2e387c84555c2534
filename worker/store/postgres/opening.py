"""An open's claim and its first reads in one round trip (libpq's pipeline mode).

Open claims the session, then reads it in one REPEATABLE READ snapshot
(``worker.store.postgres.store``). Both go to the server together here, as two
transactions of one pipeline, and the replies are read in one wait:

1. the claim: the ``UPDATE`` of the owner token, in a transaction of its own that the
   pipeline's first Sync commits; it claims only where ``loopd_schema`` holds this
   code's version (an open needs that check anyway, and a database of another version
   is then claimed by nothing here);
2. ``BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY``, the session's names, the chunks
   of its newest two epochs' logs, the newest epoch's baseline and the key index
   segments (what an open reads of a session whose newest epoch carries its state),
   then ``COMMIT``. The server begins the snapshot once the claim committed, so it holds
   every write of an owner the claim deposed (the claim waited for one in flight); no
   lock is held while the log is sent.

What the loader asks for beyond these reads (the older epochs of a session written
before the key index) it reads in a snapshot of its own, again from the start. When
the claim updated nothing (the session is absent, the database's token is newer, the
schema is not this code's or not there), nothing read is used: the caller claims
again statement by statement, which says why.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from worker.store.postgres.connection import driver
from worker.store.postgres.pipeline import BINARY, flush, pipeline_results
from worker.store.postgres.schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from types import ModuleType

    from psycopg.pq.abc import PGresult

    from worker.store.postgres.connection import Connection

_INT8: Final = 20
_TEXT_TYPE: Final = 25
# $1: the token asked for (NULL: the next one), $2: the session, $3: the schema version.
_CLAIM: Final = (
    b"UPDATE loopd_sessions SET owner_token = coalesce($1, owner_token + 1) "
    b"WHERE session = $2 AND owner_token <= coalesce($1, owner_token) "
    b"AND (SELECT version FROM loopd_schema) = $3::integer RETURNING owner_token"
)
_BEGIN: Final = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


# The session's names, each epoch found by one probe of the primary key (a DISTINCT of
# the chunks' epochs reads every chunk); psycopg's placeholder, then libpq's.
NAMES: Final = (
    "SELECT name FROM loopd_files WHERE session = %(session)s AND name <> 'loopd.scan' "
    "UNION ALL ("
    "WITH RECURSIVE e(epoch) AS (SELECT min(epoch) FROM loopd_log_chunks "
    "WHERE session = %(session)s UNION ALL SELECT (SELECT min(epoch) FROM loopd_log_chunks "
    "WHERE session = %(session)s AND epoch > e.epoch) FROM e WHERE e.epoch IS NOT NULL) "
    "SELECT epoch::text || '.jsonl' FROM e WHERE epoch IS NOT NULL)"
)
_NAMES: Final = NAMES.replace("%(session)s", "$1").encode()
_NEWEST: Final = b"(SELECT max(epoch) FROM loopd_log_chunks WHERE session = $1)"
_NEWEST_LOG: Final = (
    b"SELECT start, data FROM loopd_log_chunks WHERE session = $1 AND epoch = "
    + _NEWEST
    + b" ORDER BY start"
)
# The log before it; none (and no scan at all) when the newest is epoch 0.
_PREVIOUS_LOG: Final = (
    b"SELECT start, data FROM loopd_log_chunks WHERE session = $1 AND epoch = "
    + _NEWEST
    + b" - 1 AND "
    + _NEWEST
    + b" > 0 ORDER BY start"
)
# The newest epoch's baseline and the key index segments (only the few its SessionStart
# names are kept, stale ones removed after each epoch change).
_FILES: Final = (
    b"SELECT name, data FROM loopd_files WHERE session = $1 AND (name = "
    + _NEWEST
    + b"::text || '.baseline.json' OR name LIKE '%.keys' OR name = 'loopd.scan')"
)


@dataclass(frozen=True, slots=True)
class Opening:
    """What the pipeline found: the token claimed (None: no claim) and what it read.

    ``logs`` holds, by name, the newest two logs' chunks (each one's start, then the
    chunks, in order; the backend checks and joins them), ``files`` the newest baseline
    and the key index segments, as far as the session has them.
    """

    token: int | None
    names: list[str]
    logs: dict[str, tuple[list[int], list[bytes]]]
    files: dict[str, bytes]


def claim_and_read(conn: Connection, session_id: str, token: int | None) -> Opening:
    """Claim ``session_id`` and read what an open reads of it, in one round trip.

    Both transactions have ended when this returns. A claim that failed or updated
    nothing is None, and the reads are not used. A read that failed raises the
    driver's error (the claim stays committed, as it did when the snapshot came
    after it), as does a lost connection.
    """
    psycopg = driver()
    pgconn = conn.pgconn
    session = session_id.encode()
    asked = None if token is None else b"%d" % token
    pgconn.enter_pipeline_mode()
    pgconn.send_query_params(
        _CLAIM, [asked, session, b"%d" % SCHEMA_VERSION], param_types=[_INT8, _TEXT_TYPE, _INT8]
    )
    pgconn.pipeline_sync()
    pgconn.send_query_params(_BEGIN, None)
    pgconn.send_query_params(_NAMES, [session], param_types=[_TEXT_TYPE])
    for statement in (_NEWEST_LOG, _PREVIOUS_LOG, _FILES):
        pgconn.send_query_params(
            statement, [session], param_types=[_TEXT_TYPE], result_format=BINARY
        )
    pgconn.send_query_params(b"COMMIT", None)
    pgconn.pipeline_sync()
    flush(pgconn)
    claim = pipeline_results(pgconn, psycopg)
    snapshot = pipeline_results(pgconn, psycopg)  # BEGIN, the four reads, COMMIT
    pgconn.exit_pipeline_mode()
    claimed = _claimed(claim, psycopg)
    if claimed is None:
        if pgconn.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            # A failed step leaves the snapshot's transaction aborted, its COMMIT not run.
            conn.execute("ROLLBACK")
        return Opening(None, [], {}, {})
    names, newest, previous, stored = _checked(snapshot, psycopg, conn)[1:5]
    found = [(names.get_value(n, 0) or b"").decode() for n in range(names.ntuples)]
    epochs = [int(name[: -len(".jsonl")]) for name in found if name.endswith(".jsonl")]
    logs: dict[str, tuple[list[int], list[bytes]]] = {}
    files: dict[str, bytes] = {}
    if epochs:
        last = max(epochs)
        for epoch, rows in ((last, newest), (last - 1, previous)):
            if rows.ntuples:
                logs[f"{epoch}.jsonl"] = _chunks(rows)
    for n in range(stored.ntuples):
        files[(stored.get_value(n, 0) or b"").decode()] = stored.get_value(n, 1) or b""
    return Opening(claimed, found, logs, files)


def _claimed(results: list[PGresult], psycopg: ModuleType) -> int | None:
    """The token the claim's UPDATE returned; None if it updated nothing or failed."""
    if len(results) != 1 or results[0].status != psycopg.pq.ExecStatus.TUPLES_OK:
        return None
    if results[0].ntuples != 1:
        return None
    return int(results[0].get_value(0, 0) or b"0")


def _checked(results: list[PGresult], psycopg: ModuleType, conn: Connection) -> list[PGresult]:
    """The snapshot's six results; the first error's driver exception if a step failed."""
    pq = psycopg.pq
    for result in results:
        if result.status == pq.ExecStatus.FATAL_ERROR:
            raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
        if result.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            status = pq.ExecStatus(result.status).name
            raise psycopg.OperationalError(f"a step of the open's snapshot ended {status}")
    if len(results) != 6:
        raise psycopg.OperationalError(f"the open's snapshot gave {len(results)} results, not 6")
    return results


def _chunks(rows: PGresult) -> tuple[list[int], list[bytes]]:
    """The starts (binary ``bigint``) and bytes of a log's chunks, in order."""
    count = range(rows.ntuples)
    starts = struct.unpack(
        f">{rows.ntuples}q", b"".join([rows.get_value(n, 0) or b"" for n in count])
    )
    return list(starts), [rows.get_value(n, 1) or b"" for n in count]
