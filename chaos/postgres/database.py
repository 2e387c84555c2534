"""What the seam's rig does to and reads from the database, from outside the worker.

Each case gets a schema of its own (``search_path`` in its connection string), so the
session keeps the scenario's name and a case costs a CREATE SCHEMA, not a database.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Final

from chaos.oracle.oracle import LogsView
from chaos.scenarios.scenarios import SESSION
from worker.store.format.scan_summary import ScanSummary
from worker.store.loader import load_session
from worker.store.postgres.backend import SUMMARY_NAME, PostgresBackend, summary_of_row
from worker.store.postgres.connection import connect, place_of
from worker.store.session_state import SessionState, baseline_path

if TYPE_CHECKING:
    from worker.store.postgres.connection import Connection

Chunks = frozenset[tuple[int, int]]
TERMINATE_WAIT_MS: Final = 5000
# How long the rig lets another owner's claim wait for the row before letting the write on.
CLAIM_GRACE: Final = 0.3
CLAIM_TIMEOUT: Final = 20.0


@contextmanager
def case_schema(uri: str) -> Iterator[str]:
    """A fresh schema for one case; yields the connection string that writes there."""
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415 - the driver only when used

    name = f"chaos_{uuid.uuid4().hex[:12]}"
    with _connection(uri) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        yield make_conninfo(uri, options=f"-c search_path={name}")
    finally:
        with _connection(uri) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


@contextmanager
def _connection(uri: str) -> Iterator[Connection]:
    conn = connect(uri, place_of(uri))
    try:
        yield conn
    finally:
        conn.close()


def terminate(uri: str, backend_pid: int) -> None:
    """End the server process of a worker's connection and wait until it is gone."""
    with _connection(uri) as conn:
        conn.execute("SELECT pg_terminate_backend(%s, %s)", (backend_pid, TERMINATE_WAIT_MS))


def chunks(uri: str) -> Chunks:
    """The (epoch, start) of every stored piece of the session's logs."""
    with _connection(uri) as conn:
        rows = conn.execute(
            "SELECT epoch, start FROM loopd_log_chunks WHERE session = %s", (SESSION,)
        ).fetchall()
    return frozenset((int(str(e)), int(str(s))) for e, s in rows)


class OwnerClaim:
    """Another owner's claim: the session's token raised, and the chunks it saw then.

    It runs in a thread of its own: a correct write in flight holds the session's row
    ``FOR SHARE`` and the claim's UPDATE waits for its COMMIT.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.seen: Chunks | None = None
        self.error: str | None = None
        self._thread = threading.Thread(target=self._claim, name="owner-claim", daemon=True)

    def start(self) -> bool:
        """Start the claim; True if it finished at once (nothing held the row)."""
        self._thread.start()
        self._thread.join(CLAIM_GRACE)
        return not self._thread.is_alive()

    def wait(self) -> Chunks:
        """The chunks stored when the claim committed (AssertionError if it never did)."""
        self._thread.join(CLAIM_TIMEOUT)
        if self.seen is None:
            raise AssertionError(f"the owner claim did not finish: {self.error}")
        return self.seen

    def _claim(self) -> None:
        try:
            with _connection(self.uri) as conn, conn.transaction():
                conn.execute(
                    "UPDATE loopd_sessions SET owner_token = owner_token + 1 WHERE session = %s",
                    (SESSION,),
                )
                rows = conn.execute(
                    "SELECT epoch, start FROM loopd_log_chunks WHERE session = %s", (SESSION,)
                ).fetchall()
                self.seen = frozenset((int(str(e)), int(str(s))) for e, s in rows)
        except Exception as exc:  # noqa: BLE001 - reported by wait(), in the rig's thread
            self.error = str(exc)


def read_view(uri: str) -> LogsView:
    """The session's logs and baselines as stored, parsed as the oracle parses files."""
    view = LogsView()
    with _connection(uri) as conn:
        rows = conn.execute(
            "SELECT epoch, data FROM loopd_log_chunks WHERE session = %s ORDER BY epoch, start",
            (SESSION,),
        ).fetchall()
        for epoch, data in rows:
            number = int(str(epoch))
            view.raw[number] = view.raw.get(number, b"") + _as_bytes(data)
        for number in view.raw:
            found = conn.execute(
                "SELECT data FROM loopd_files WHERE session = %s AND name = %s",
                (SESSION, baseline_path("", number)),
            ).fetchone()
            if found is not None:
                view.baselines[number] = _as_bytes(found[0])
    for number, data in view.raw.items():
        records = []
        for line in data.split(b"\n")[:-1]:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        view.epochs[number] = records
    return view


def stored_summary(uri: str) -> ScanSummary | None:
    """The scan summary the session's writers kept in the database, if one decodes."""
    with _connection(uri) as conn:
        found = conn.execute(
            "SELECT data FROM loopd_files WHERE session = %s AND name = %s",
            (SESSION, SUMMARY_NAME),
        ).fetchone()
    return None if found is None else summary_of_row(_as_bytes(found[0]))


def load_stored(uri: str) -> SessionState:
    """The session read by the store's own loader, with its history, claiming nothing."""
    place = place_of(uri)
    with _connection(uri) as conn:
        backend = PostgresBackend(conn, f"{place}/sessions/{SESSION}", SESSION, 0)
        with backend.snapshot():
            return load_session(backend.directory, SESSION, dir_fd=backend, history=True)


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes | memoryview | bytearray):
        return bytes(value)
    raise TypeError(f"a bytea column held {type(value).__name__}")
