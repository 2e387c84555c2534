"""The store on PostgreSQL: the same bytes as the file store, fenced writes, crash and loss.

A real server (tests/harness/postgres_server.py), one per xdist worker, a fresh database per test.
"""

from __future__ import annotations

import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from tests.harness.postgres_server import PostgresServer
from tests.programs.postgres_child import SUMMARY
from worker import (
    Baseline,
    EpochEnd,
    NotOwnerNow,
    Session,
    SessionBroken,
    SessionNotFound,
    ToolResult,
    User,
)
from worker.loop.record_feed import records_page
from worker.store.loader import load_session
from worker.store.postgres import DatabaseUnavailable, PostgresStore, SchemaTooNew
from worker.store.request_records import request_records

_FIXED_NS = 1_790_000_000_123_456_000


@pytest.fixture(scope="module")
def server(postgres_server: PostgresServer) -> PostgresServer:
    return postgres_server


@pytest.fixture
def store(server: PostgresServer) -> PostgresStore:
    return PostgresStore(server.new_database())


@pytest.fixture
def fixed_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record's time is one instant, so two backends' lines can be compared byte for byte."""
    from worker.store.format import record_types

    clock = types.SimpleNamespace(time_ns=lambda: _FIXED_NS, gmtime=time.gmtime)
    monkeypatch.setattr(record_types, "time", clock)


def _turn(session: Session, n: int) -> None:
    session.append_many(
        [
            User(text=f"request {n}", untrusted=n % 3 == 0, key=f"key-{n}"),
            ToolResult(call=session.next_call(), tool="echo", output=f"out {n}", ok=True),
        ]
    )


def _write_the_same(session: Session, baseline: Baseline) -> None:
    """Four epochs of keyed groups (the key index gets segments), then one group more."""
    n = 0
    for epoch in range(4):
        for _ in range(3):
            _turn(session, n)
            n += 1
        session.commit_epoch(f"summary {epoch}", baseline)
    _turn(session, n)


def test_postgres_session_is_the_file_stores_bytes_checksums_included(
    store: PostgresStore, tmp_path: Path, baseline: Baseline, fixed_clock: None
) -> None:
    home = tmp_path / "home"
    with Session.create(home, "same", baseline) as on_disk:
        _write_the_same(on_disk, baseline)
    with Session.create(store, "same", baseline) as in_db:
        _write_the_same(in_db, baseline)
    directory = home / "sessions" / "same"
    with Session.open(store, "same") as reopened:
        backend = reopened.backend  # type: ignore[attr-defined]
        names = sorted(backend.names())
        assert names == sorted(p.name for p in directory.iterdir())
        assert "0-3.keys" in names
        for name in names:
            assert backend.read(name, name) == (directory / name).read_bytes(), name
        # verify's reading (every epoch, every carried field, canonical lines) passes.
        with backend.snapshot():
            state = load_session(reopened.dir, "same", dir_fd=backend, history=True, canonical=True)
        assert state.epoch == 4
        assert reopened.carry == "summary 3"


def test_open_or_create_creates_once_then_opens_under_a_new_token(
    store: PostgresStore, baseline: Baseline
) -> None:
    with Session.open_or_create(store, "either", baseline) as first:
        _turn(first, 1)
        token = first.token  # type: ignore[attr-defined]
    with Session.open_or_create(store, "either", baseline) as again:
        assert [r.key for r in again.records if isinstance(r, User)] == ["key-1"]
        assert again.token == token + 1  # type: ignore[attr-defined]


def test_find_key_finds_every_epochs_keys_after_commits_and_a_reopen(
    store: PostgresStore, baseline: Baseline
) -> None:
    with Session.create(store, "keys", baseline) as session:
        _write_the_same(session, baseline)
    with Session.open(store, "keys") as session:
        for n in range(13):
            found = session.find_key(f"key-{n}")
            assert found is not None, n
            assert found.epoch == min(n // 3, 4)
        assert session.find_key("key-never-sent") is None


def test_a_sealed_epochs_request_is_read_from_the_database_for_a_retry_and_a_page(
    store: PostgresStore, baseline: Baseline
) -> None:
    # A retry whose key is in a sealed epoch is answered from that epoch's log, and a
    # page of an older epoch is served: both read the log where the session keeps it
    # (they once looked for a file named by the session's URI, and failed).
    with Session.create(store, "sealed", baseline) as session:
        _write_the_same(session, baseline)
    with Session.open(store, "sealed") as session:
        ref = session.find_key("key-1")
        assert ref is not None
        assert ref.epoch == 0
        found = request_records(session, ref)
        assert [type(r).__name__ for r in found] == ["User", "ToolResult"]
        assert isinstance(found[0], User)
        assert found[0].text == "request 1"
        page = records_page(session, {"epoch": 2})
        assert (page["epoch"], page["current"]) == (2, 4)
        records = page["records"]
        assert isinstance(records, list)
        assert [r["type"] for r in records][:3] == ["SessionStart", "User", "ToolResult"]
        assert records[1]["text"] == "request 6"


def test_resume_after_a_sigkill_between_the_phases_uses_the_recorded_summary(
    store: PostgresStore, baseline: Baseline
) -> None:
    with Session.create(store, "crash", baseline) as session:
        _turn(session, 1)
    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.programs.postgres_child",
            store.uri,
            "crash",
            "between-phases",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    with Session.open(store, "crash") as session:
        assert session.epoch == 0
        assert session.epoch_closed
        session.commit_epoch("a second summary that must be ignored", baseline)
        assert session.epoch == 1
        assert session.carry == SUMMARY
        log = session.backend.read("0.jsonl", "0.jsonl")  # type: ignore[attr-defined]
    assert log.count(b'"type":"EpochEnd"') == 1
    with Session.open(store, "crash") as session:
        assert session.carry == SUMMARY


def test_a_deposed_owners_write_is_refused_in_its_transaction_and_never_visible(
    store: PostgresStore, baseline: Baseline
) -> None:
    Session.create(store, "fenced", baseline).close()
    old = Session.open(store, "fenced")
    new = Session.open(store, "fenced")
    try:
        assert new.token > old.token  # type: ignore[attr-defined]
        with pytest.raises(NotOwnerNow, match=r"fenced: not the owner now: the database holds"):
            old.append(User(text="from the deposed owner", untrusted=False, key="old"))
        assert old.broken is not None
        with pytest.raises(SessionBroken, match="another owner holds the session"):
            old.append(User(text="again", untrusted=False, key="old-2"))
        with pytest.raises(SessionBroken):
            old.commit_epoch("deposed", baseline)
        new.append(User(text="from the owner", untrusted=False, key="new"))
    finally:
        old.close()
        new.close()
    with Session.open(store, "fenced") as session:
        texts = [r.text for r in session.records if isinstance(r, User)]
        assert texts == ["from the owner"]
        assert not any(isinstance(r, EpochEnd) for r in session.records)


def test_a_deposed_owners_epoch_commit_is_refused_in_both_phases(
    store: PostgresStore, baseline: Baseline
) -> None:
    Session.create(store, "commit", baseline).close()
    old = Session.open(store, "commit")
    Session.open(store, "commit").close()  # a newer owner claims it
    try:
        with pytest.raises(NotOwnerNow):
            old.commit_epoch("phase 1 of a deposed owner", baseline)
    finally:
        old.close()
    # Phase 2 alone: the EpochEnd committed, then the owner deposed before phase 2.
    with Session.open(store, "commit") as owner:
        owner._append_durably([EpochEnd(next=1, summary="recorded", carried=None)])
        Session.open(store, "commit").close()
        with pytest.raises(NotOwnerNow):
            owner.commit_epoch("ignored", baseline)
    with Session.open(store, "commit") as session:
        assert session.epoch == 0
        assert session.epoch_closed


def test_an_older_token_than_the_databases_cannot_open(
    store: PostgresStore, baseline: Baseline
) -> None:
    Session.create(store, "tok", baseline).close()
    store.open_session("tok", token=7).close()
    with pytest.raises(NotOwnerNow, match=r"holds owner token 7, newer than 5"):
        store.open_session("tok", token=5)


def test_a_claim_with_the_databases_own_token_opens_and_an_absent_session_is_not_found(
    store: PostgresStore, baseline: Baseline
) -> None:
    Session.create(store, "same", baseline).close()
    store.open_session("same", token=7).close()
    with store.open_session("same", token=7) as again:  # a worker restarted under its token
        assert again.token == 7  # type: ignore[attr-defined]
        again.append(User(text="still the owner", untrusted=False, key="k"))
    with store.open_session("same") as next_owner:
        assert next_owner.token == 8  # type: ignore[attr-defined]
    with pytest.raises(SessionNotFound):
        store.open_session("absent", token=3)


def test_the_schema_is_created_at_first_use_and_a_newer_one_refused_in_one_line(
    server: PostgresServer, baseline: Baseline
) -> None:
    import psycopg

    uri = server.new_database()
    store = PostgresStore(uri)
    Session.create(store, "first", baseline).close()
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute("SELECT version FROM loopd_schema").fetchone()
        assert row == (1,)
        conn.execute("UPDATE loopd_schema SET version = 2")
    with pytest.raises(SchemaTooNew, match=r"schema version 2 is newer than this loopd's \(1\)$"):
        store.ensure_schema()
    with pytest.raises(SchemaTooNew) as refused:
        Session.open(store, "first")
    assert "\n" not in str(refused.value)


def test_a_connection_lost_before_commit_leaves_nothing_and_breaks_the_session(
    store: PostgresStore, server: PostgresServer, baseline: Baseline
) -> None:
    import psycopg

    session = Session.create(store, "lost", baseline)
    backend = session.backend  # type: ignore[attr-defined]
    pid = backend.conn.info.backend_pid

    def cut() -> None:
        with psycopg.connect(store.uri, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))

    backend.before_commit = cut
    try:
        with pytest.raises(DatabaseUnavailable, match=r"lost: database error: "):
            session.append(User(text="never committed", untrusted=False, key="lost-1"))
        assert len(session.records) == 1
        with pytest.raises(SessionBroken, match="a write's outcome is unknown"):
            session.append(User(text="after the loss", untrusted=False, key="lost-2"))
    finally:
        session.close()
    with Session.open(store, "lost") as reopened:
        assert len(reopened.records) == 1
        reopened.append(User(text="after a reopen", untrusted=False, key="lost-1"))


def test_importing_the_store_does_not_import_the_driver() -> None:
    code = (
        "import sys\n"
        "from worker import Session\n"
        "import worker.store.postgres\n"
        "assert 'psycopg' not in sys.modules, 'psycopg imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
