"""An open on PostgreSQL: its claim and first reads in one round trip, as checked as before.

The claim, then a snapshot of the names, the newest two logs, the newest baseline and
the key index segments, go as one libpq pipeline
(worker/store/postgres/opening.py); these tests hold it to what the statements one by
one promised: a write in flight is waited for and read, nothing is claimed in a
database of another schema, a stored log with a gap is refused, and what the pipeline
did not read is read in a snapshot. A real server (tests/harness/postgres_server.py),
a fresh database per test.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.harness.forged import rechained
from tests.harness.postgres_server import PostgresServer
from tests.harness.support import poll_until
from worker import (
    Assistant,
    Baseline,
    InvalidLog,
    NotOwnerNow,
    Session,
    SessionNotFound,
    User,
)
from worker.store.errors import LogError
from worker.store.format.records import without_checksums
from worker.store.postgres import PostgresStore, SchemaTooNew, opening
from worker.store.postgres import store as store_module
from worker.store.postgres.connection import connect

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def store(postgres_server: PostgresServer) -> PostgresStore:
    return PostgresStore(postgres_server.new_database())


def _user(n: int) -> User:
    return User(text=f"request {n}", untrusted=False, key=f"k{n}")


def _token(store: PostgresStore, session_id: str) -> int:
    with psycopg.connect(store.uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT owner_token FROM loopd_sessions WHERE session = %s", (session_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_an_open_claims_and_reads_in_one_round_trip(
    store: PostgresStore, baseline: Baseline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session.create(store, "traced", baseline) as session:
        for n in range(3):
            session.append_many([_user(n), _user(100 + n)])
        session.commit_epoch("first", baseline)  # a previous log and a key index segment
        session.append(_user(9))
    trace = tmp_path / "libpq.trace"
    fd = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def traced(uri: str, place: str) -> Any:
        conn = connect(uri, place)
        conn.pgconn.trace(fd)
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        return conn

    monkeypatch.setattr(store_module, "connect", traced)
    try:
        with Session.open(store, "traced") as opened:
            assert [r.key for r in opened.records if isinstance(r, User)] == ["k9"]
            assert opened.find_key("k101") is not None  # through the previous epoch's keys
            opened.backend.conn.pgconn.untrace()  # type: ignore[attr-defined]
    finally:
        os.close(fd)
    # libpq's trace: one line per protocol message, "F" sent by the client, "B" received.
    lines = [line.split("\t") for line in trace.read_text().splitlines() if line]
    sides = "".join(line[0] for line in lines)
    round_trips = sides.count("FB")
    assert round_trips == 1, sides  # the claim, then BEGIN, the reads and COMMIT
    sent = [line[2].strip() for line in lines if line[0] == "F"]
    assert sent.count("Sync") == 2  # the claim's own transaction, then the snapshot's
    assert sum("loopd_log_chunks" in line[-1] for line in lines if line[0] == "F") >= 2


def test_an_open_waits_for_a_write_in_flight_and_its_snapshot_holds_it(
    store: PostgresStore, baseline: Baseline
) -> None:
    owner = Session.create(store, "raced", baseline)
    owner.append(_user(0))
    sent = threading.Event()
    release = threading.Event()

    def hold() -> None:
        sent.set()
        release.wait(30)

    owner.backend.before_commit = hold  # type: ignore[attr-defined]
    writer = threading.Thread(target=owner.append, args=(_user(1),))
    writer.start()
    opened: list[Session] = []
    try:
        assert sent.wait(30)  # BEGIN and the INSERT ran: the row is held FOR SHARE
        opener = threading.Thread(target=lambda: opened.append(Session.open(store, "raced")))
        opener.start()
        with psycopg.connect(store.uri, autocommit=True) as watch:

            def claim_waits() -> bool:
                row = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'UPDATE loopd_sessions SET owner_token%'"
                ).fetchone()
                return row is not None and row[0] == 1

            poll_until(claim_waits, what="the open's claim to wait for the write's lock")
        release.set()
        writer.join(30)
        opener.join(30)
        assert not writer.is_alive()
        assert not opener.is_alive()
        (again,) = opened
        with again:
            assert [r.key for r in again.records if isinstance(r, User)] == ["k0", "k1"]
            assert again.token == 2  # type: ignore[attr-defined]
        owner.backend.before_commit = None  # type: ignore[attr-defined]
        with pytest.raises(NotOwnerNow, match="holds owner token 2, this writer's is 1"):
            owner.append(_user(2))
    finally:
        release.set()
        owner.close()


def test_an_open_in_a_database_without_the_tables_creates_them_and_finds_nothing(
    postgres_server: PostgresServer,
) -> None:
    store = PostgresStore(postgres_server.new_database())
    with pytest.raises(SessionNotFound):
        Session.open(store, "nothing")
    with pytest.raises(SessionNotFound):
        store.open_session("nothing", token=4)
    assert store.session_ids() == []


def test_an_open_in_a_database_of_a_newer_schema_claims_nothing(
    store: PostgresStore, baseline: Baseline
) -> None:
    Session.create(store, "newer", baseline).close()
    with psycopg.connect(store.uri, autocommit=True) as conn:
        conn.execute("UPDATE loopd_schema SET version = 2")
    with pytest.raises(SchemaTooNew):
        Session.open(store, "newer")
    with pytest.raises(SchemaTooNew):
        store.open_session("newer", token=9)
    assert _token(store, "newer") == 1


def test_a_stored_log_whose_chunks_leave_a_gap_is_refused_at_open(
    store: PostgresStore, baseline: Baseline
) -> None:
    with Session.create(store, "gap", baseline) as session:
        session.append(_user(0))
        session.append(_user(1))
    with psycopg.connect(store.uri, autocommit=True) as conn:
        conn.execute(
            "UPDATE loopd_log_chunks SET start = start + 1 WHERE session = 'gap' AND start = "
            "(SELECT max(start) FROM loopd_log_chunks WHERE session = 'gap')"
        )
    with pytest.raises(InvalidLog, match=r"0\.jsonl:3: a stored chunk starts at byte \d+, the log"):
        Session.open(store, "gap")


def test_what_the_pipeline_did_not_read_is_read_again_in_a_snapshot_and_refused_exactly(
    store: PostgresStore, baseline: Baseline, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session.create(store, "segments", baseline) as session:
        session.append(_user(0))
        session.commit_epoch("first", baseline)
        session.append(_user(1))
    # A pipeline that reads the baseline alone: the loader asks for the key index
    # segment, and everything is read again in a snapshot of its own.
    baseline_only = opening._FILES.replace(b" OR name LIKE '%.keys'", b"")
    assert baseline_only != opening._FILES
    monkeypatch.setattr(opening, "_FILES", baseline_only)
    with Session.open(store, "segments") as again:
        assert again.find_key("k0") is not None
        assert [r.key for r in again.records if isinstance(r, User)] == ["k1"]
    monkeypatch.undo()
    with psycopg.connect(store.uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT name FROM loopd_files WHERE session = 'segments' AND name LIKE '%.keys'"
        ).fetchone()
        assert row is not None
        conn.execute("DELETE FROM loopd_files WHERE name = %s", (row[0],))
    with pytest.raises(InvalidLog, match=rf"names {row[0]}, which is missing"):
        Session.open(store, "segments")
    assert _token(store, "segments") == 3  # the claim committed before the refusal


@pytest.mark.parametrize(
    ("line", "damage", "refusal"),
    [
        pytest.param(
            7, (b'{"type":"Assistant"', b'{"kind":"Assistant"'), "undecodable record",
            id="a-line-that-starts-with-no-type",
        ),
        pytest.param(
            6, (b'"key":"k2"', b'"key":"k0"'),
            "request key 'k0' was already applied (epoch 0, line 2)",
            id="a-key-applied-twice",
        ),
    ],
)  # fmt: skip
def test_a_damaged_record_in_the_stored_log_is_refused_at_open_with_its_line(
    store: PostgresStore, baseline: Baseline, line: int, damage: tuple[bytes, bytes], refusal: str
) -> None:
    with Session.create(store, "damaged", baseline) as session:
        for n in range(6):  # lines 2n + 2 and 2n + 3: User k<n> and its answer, one group
            session.append_many([_user(n), Assistant(text=f"answer {n}")])
    with psycopg.connect(store.uri, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data FROM loopd_log_chunks WHERE session = 'damaged' ORDER BY start"
        ).fetchall()
        lines = without_checksums(b"".join(bytes(row[0]) for row in rows)).splitlines()
        assert damage[0] in lines[line - 1]
        lines[line - 1] = lines[line - 1].replace(*damage)
        with conn.transaction():
            conn.execute("DELETE FROM loopd_log_chunks WHERE session = 'damaged'")
            conn.execute(
                "INSERT INTO loopd_log_chunks (session, epoch, start, data) "
                "VALUES ('damaged', 0, 0, %s)",
                (rechained(lines),),
            )
    with pytest.raises(LogError, match=rf"0\.jsonl:{line}: {re.escape(refusal)}"):
        Session.open(store, "damaged")
