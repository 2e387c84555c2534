"""A group commit on PostgreSQL in one round trip: the same transaction, fence and failures.

BEGIN, the fenced INSERT and COMMIT are pipelined (worker/store/postgres/pipeline.py);
these tests hold it to what the three separate statements promised. A real server
(tests/harness/postgres_server.py), a fresh database per test.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.postgres_server import PostgresServer
from tests.harness.support import poll_until
from worker import Baseline, NotOwnerNow, Session, SessionBroken, User
from worker.store.errors import SessionNotFound
from worker.store.postgres import DatabaseUnavailable, PostgresStore, pipeline
from worker.store.postgres.store import _claim

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def store(postgres_server: PostgresServer) -> PostgresStore:
    return PostgresStore(postgres_server.new_database())


@pytest.fixture
def session(store: PostgresStore, baseline: Baseline) -> Iterator[Session]:
    with Session.create(store, "piped", baseline) as opened:
        yield opened


def _user(n: int) -> User:
    return User(text=f"request {n}", untrusted=False, key=f"k{n}")


def _stored_texts(store: PostgresStore) -> list[str]:
    with Session.open(store, "piped") as again:
        return [r.text for r in again.records if isinstance(r, User)]


def test_many_group_commits_on_one_connection_read_back_in_order(
    store: PostgresStore, session: Session
) -> None:
    for n in range(12):  # past psycopg's prepare threshold, and the statement's first use
        session.append_many([_user(n), _user(100 + n)])
    session.close()
    assert _stored_texts(store) == [f"request {m}" for n in range(12) for m in (n, 100 + n)]


def test_a_group_commit_sends_begin_insert_and_commit_before_it_reads_a_reply(
    session: Session, tmp_path: Path
) -> None:
    session.append(_user(0))  # the statement's Parse went with the first one
    pgconn = session.backend.conn.pgconn  # type: ignore[attr-defined]
    trace = tmp_path / "libpq.trace"
    fd = os.open(trace, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        pgconn.trace(fd)
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        session.append(_user(1))
        pgconn.untrace()
    finally:
        os.close(fd)
    # libpq's trace: one line per protocol message, "F" sent by the client, "B" received.
    sides = [line.split("\t")[0] for line in trace.read_text().splitlines() if line]
    messages = [line.split("\t")[2].strip() for line in trace.read_text().splitlines() if line]
    assert sides.index("B") == len(sides) - sides[::-1].index("F")  # every F before any B
    assert messages.count("Sync") == 1
    assert messages[-1] == "ReadyForQuery"


def test_the_write_holds_the_session_row_until_its_commit_when_the_hook_runs(
    store: PostgresStore, session: Session
) -> None:
    held: list[bool] = []

    def row_is_held() -> bool:
        with psycopg.connect(store.uri, autocommit=True) as other:
            try:
                other.execute(
                    "SELECT 1 FROM loopd_sessions WHERE session = 'piped' FOR UPDATE NOWAIT"
                )
            except psycopg.errors.LockNotAvailable:
                return True
        return False

    def check() -> None:
        held.append(poll_until(row_is_held, what="the write to hold the session's row"))
        with psycopg.connect(store.uri, autocommit=True) as other:
            row = other.execute("SELECT count(*) FROM loopd_log_chunks").fetchone()
            assert row == (1,)  # the SessionStart alone: nothing of the write is visible

    session.backend.before_commit = check  # type: ignore[attr-defined]
    session.append(_user(1))
    assert held == [True]
    session.close()
    assert _stored_texts(store) == ["request 1"]


def test_a_claim_in_flight_is_waited_for_and_then_refuses_the_write(
    store: PostgresStore, session: Session
) -> None:
    claim = psycopg.connect(store.uri)  # not autocommit: the claim stays open until COMMIT
    outcome: list[BaseException] = []
    try:
        claim.execute("UPDATE loopd_sessions SET owner_token = owner_token + 1")

        def write() -> None:
            try:
                session.append(_user(1))
            except NotOwnerNow as exc:
                outcome.append(exc)

        writer = threading.Thread(target=write)
        writer.start()

        def waiting() -> bool:
            # From a connection of its own in autocommit: inside the claim's transaction
            # pg_stat_activity is read once and kept, so a first look taken before the
            # write blocked would be all the later ones saw.
            with psycopg.connect(store.uri, autocommit=True) as watcher:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE 'INSERT INTO loopd_log_chunks%'"
                ).fetchone()
            return row is not None and row[0] == 1

        poll_until(waiting, what="the write to wait for the claim's lock")
        claim.commit()
        writer.join(30)
        assert not writer.is_alive()
    finally:
        claim.close()
    assert len(outcome) == 1
    assert "the database holds owner token 2, this writer's is 1" in str(outcome[0])
    with pytest.raises(SessionBroken, match="another owner holds the session"):
        session.append(_user(2))
    session.close()
    assert _stored_texts(store) == []


def test_a_statement_the_database_refuses_rolls_back_and_breaks_the_session(
    store: PostgresStore, session: Session
) -> None:
    session.append(_user(1))
    with psycopg.connect(store.uri, autocommit=True) as other:
        # A chunk where the next group commit goes: its INSERT violates the primary key.
        other.execute(
            "INSERT INTO loopd_log_chunks (session, epoch, start, data) "
            "SELECT session, 0, sum(length(data)), 'x' FROM loopd_log_chunks GROUP BY session"
        )
    with pytest.raises(DatabaseUnavailable, match=r"piped: database error: duplicate key value"):
        session.append(_user(2))
    with pytest.raises(SessionBroken, match="a write's outcome is unknown"):
        session.append(_user(3))
    with psycopg.connect(store.uri, autocommit=True) as other:
        # Nothing holds the row: the failed transaction was rolled back with its connection.
        other.execute("SELECT 1 FROM loopd_sessions WHERE session = 'piped' FOR UPDATE NOWAIT")
        row = other.execute("SELECT count(*) FROM loopd_log_chunks").fetchone()
        assert row == (3,)  # the SessionStart, request 1, the planted chunk


def test_an_append_after_psycopg_rolled_back_a_fenced_transaction_still_commits(
    store: PostgresStore, session: Session
) -> None:
    backend = session.backend  # type: ignore[attr-defined]
    session.append(_user(1))  # the append's statement is prepared on the connection
    for _ in range(6):  # psycopg prepares the fence's SELECT of its own after 5 runs
        backend.check_fence()

    def refuse() -> None:
        raise psycopg.OperationalError("a write refused before its COMMIT")

    backend.before_commit = refuse
    # The rollback makes psycopg deallocate every prepared statement, the append's too.
    with pytest.raises(DatabaseUnavailable, match="a write refused before its COMMIT"):
        backend.check_fence()
    backend.before_commit = None
    session.append(_user(2))
    session.close()
    assert _stored_texts(store) == ["request 1", "request 2"]


def test_a_commit_the_server_refuses_is_not_acknowledged_and_breaks_the_session(
    store: PostgresStore, session: Session
) -> None:
    """A deferred trigger refuses the group's COMMIT (the INSERT itself ran): the append
    raises, nothing of it is stored or in memory, and the session takes no more."""
    session.append(_user(0))
    with psycopg.connect(store.uri, autocommit=True) as admin:
        admin.execute(
            "CREATE FUNCTION late() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION 'refused at commit'; END $$"
        )
        admin.execute(
            "CREATE CONSTRAINT TRIGGER t_late AFTER INSERT ON loopd_log_chunks "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION late()"
        )
    with pytest.raises(DatabaseUnavailable, match="refused at commit"):
        session.append(_user(1))
    assert [r.key for r in session.records if isinstance(r, User)] == ["k0"]
    with pytest.raises(SessionBroken):
        session.append(_user(2))
    session.close()
    with psycopg.connect(store.uri, autocommit=True) as admin:
        admin.execute("DROP TRIGGER t_late ON loopd_log_chunks")
    assert _stored_texts(store) == ["request 0"]


def test_an_open_racing_the_create_of_its_session_finds_it_absent_or_claims_it(
    store: PostgresStore, baseline: Baseline, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The create commits between the claim's UPDATE and its second look: an open is told
    the session is absent (open_or_create then opens what the other made), and a claim
    with a token takes the row, never a NotOwnerNow a worker would take as deposed."""
    store.ensure_schema()
    real = psycopg.Connection.execute

    def racing(session_id: str) -> Any:
        creator = psycopg.connect(store.uri)
        creator.execute(
            "INSERT INTO loopd_sessions (session, owner_token) VALUES (%s, 1)", (session_id,)
        )

        def execute(self: object, query: object, *args: object, **kwargs: object) -> object:
            cursor = real(self, query, *args, **kwargs)
            if isinstance(query, str) and query.startswith("UPDATE loopd_sessions SET owner"):
                creator.commit()  # the create commits right after the claim's UPDATE
            return cursor

        monkeypatch.setattr(psycopg.Connection, "execute", execute)
        return creator

    creator = racing("d")
    with pytest.raises(SessionNotFound):
        store.open_session("d")
    monkeypatch.setattr(psycopg.Connection, "execute", real)
    creator.close()
    creator = racing("e")
    with store.connection() as conn:
        assert _claim(conn, store.session_dir("e"), "e", 5) == 5
    monkeypatch.setattr(psycopg.Connection, "execute", real)
    creator.close()


def test_the_pipelines_status_numbers_are_the_drivers() -> None:
    """The pipeline compares libpq's status numbers as plain ints on every write."""
    pq = psycopg.pq
    assert pipeline._COMMAND_OK == pq.ExecStatus.COMMAND_OK
    assert pipeline._FATAL_ERROR == pq.ExecStatus.FATAL_ERROR
    assert pipeline._PIPELINE_SYNC == pq.ExecStatus.PIPELINE_SYNC
    assert pipeline._CONNECTION_BAD == pq.ConnStatus.BAD


def _terminate(uri: str, pid: int) -> None:
    """End one server process's connection, as a restart of the database ends them all."""
    with psycopg.connect(uri, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    poll_until(lambda: not _alive(uri, pid), what=f"the server process {pid} to end", timeout=30)


def _alive(uri: str, pid: int) -> bool:
    with psycopg.connect(uri, autocommit=True) as admin:
        found = admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
        return found.fetchone() is not None


def test_a_connection_the_server_ended_while_idle_is_made_again_for_the_next_write_and_read(
    store: PostgresStore, session: Session, baseline: Baseline
) -> None:
    session.append(_user(0))
    session.commit_epoch("s", baseline)  # k0 now in a sealed epoch, read from the database
    uri = store.uri
    _terminate(uri, session.backend.conn.pgconn.backend_pid)  # type: ignore[attr-defined]
    assert session.find_key("k0") is not None  # a read of epoch 0 on a new connection
    _terminate(uri, session.backend.conn.pgconn.backend_pid)  # type: ignore[attr-defined]
    session.append(_user(1))  # the write goes on a new connection, fenced as ever
    assert session.broken is None
    session.close()
    with Session.open(store, "piped") as again:
        assert [r.text for r in again.records if isinstance(r, User)] == ["request 1"]
        assert again.find_key("k0") is not None


def test_a_connection_that_cannot_be_made_again_refuses_the_write_with_nothing_sent(
    store: PostgresStore, session: Session
) -> None:
    session.append(_user(0))
    uri = store.uri
    name = uri.rsplit("/", 1)[1]
    with psycopg.connect(uri.rsplit("/", 1)[0] + "/postgres", autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")
        try:
            _terminate(uri.rsplit("/", 1)[0] + "/postgres", session.backend.conn.pgconn.backend_pid)  # type: ignore[attr-defined]
            with pytest.raises(DatabaseUnavailable, match="nothing of this was sent"):
                session.append(_user(1))
            assert session.broken is not None  # the worker exits, and is started again
        finally:
            admin.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true")
    session.close()
    with Session.open(store, "piped") as again:
        assert [r.text for r in again.records if isinstance(r, User)] == ["request 0"]


def test_a_new_connection_to_a_database_holding_less_than_was_written_writes_nothing(
    store: PostgresStore, session: Session
) -> None:
    """A failover to a server without the newest acknowledged group (simulated: its row
    deleted while the connection is ended): a write at this writer's offset would leave a
    gap, so none is made, and the session breaks (the worker reopens what is there)."""
    session.append(_user(0))
    session.append(_user(1))
    uri = store.uri
    with psycopg.connect(uri, autocommit=True) as admin:
        admin.execute(
            "DELETE FROM loopd_log_chunks WHERE session = 'piped' AND start = "
            "(SELECT max(start) FROM loopd_log_chunks WHERE session = 'piped')"
        )
    _terminate(uri, session.backend.conn.pgconn.backend_pid)  # type: ignore[attr-defined]
    with pytest.raises(DatabaseUnavailable, match=r"holds .* where this writer wrote"):
        session.append(_user(2))
    assert session.broken is not None
    session.close()
    with Session.open(store, "piped") as again:  # no gap: what the database held, whole
        assert [r.text for r in again.records if isinstance(r, User)] == ["request 0"]
