"""The writer keeps its log's scan summary going as it appends (docs/format.md, "The scan
summary"): a restart or a failover after hours of appends scans the few lines after the
newest summary, not all that the worker wrote since its own open.
"""

from __future__ import annotations

import errno
import os
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.postgres_server import PostgresServer
from tests.harness.summary_sessions import SESSION, big_session, log_of, request, scan_fields
from tests.harness.support import poll_until
from worker.app import DefaultApp
from worker.store import session as session_module
from worker.store.disk.scan_file import MAX_BYTES, read_summary, scan_path
from worker.store.epochs import epoch_log
from worker.store.errors import SessionError, SessionIOError
from worker.store.format import scan_summary
from worker.store.format.line_scan import LineScan, scan_lines
from worker.store.format.scan_summary import ScanSummary, encode
from worker.store.postgres import PostgresStore
from worker.store.postgres.backend import summary_of_row
from worker.store.postgres.boundaries import Point, set_hook
from worker.store.session import Session


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many bytes each scan of a newest log read (the rest: a summary's)."""
    seen: list[int] = []
    original = epoch_log.scan_lines  # type: ignore[attr-defined]  # the name the loader calls

    def scan_lines_seen(
        data: bytes, known: ScanSummary | None = None, epoch: int = 0
    ) -> LineScan | None:
        scan = original(data, known, epoch)
        if scan is not None:
            seen.append(scan.scanned)
        return scan

    monkeypatch.setattr(epoch_log, "scan_lines", scan_lines_seen)
    return seen


def _holds_what_a_scan_reads(summary: ScanSummary | None, data: bytes, epoch: int) -> int:
    """Check ``summary`` covers ``data``'s first bytes and says what a scan of them reads;
    how many bytes it covers."""
    assert summary is not None
    assert summary.covers(data, epoch)
    said = summary.read()
    scan = scan_lines(data[: summary.size])
    assert said is not None
    assert scan is not None
    assert (said.types, said.calls, said.users, said.keys) == (
        scan.types, scan.calls, scan.users, scan.keys,
    )  # fmt: skip
    return summary.size


def test_a_writer_keeps_the_summary_within_its_bound_of_the_log_end(
    tmp_path: Path, scanned: list[int]
) -> None:
    home = str(tmp_path / "home")
    sizes: list[int] = []
    with Session.create(home, SESSION, DefaultApp().initial_baseline(SESSION)) as session:
        for n in range(1200):
            session.append_many(request(session, n))
            summary = read_summary(home, SESSION)
            if summary is not None and (not sizes or summary.size != sizes[-1]):
                sizes.append(summary.size)
    with open(log_of(home), "rb") as f:
        data = f.read()
    kept = read_summary(home, SESSION)
    covered = _holds_what_a_scan_reads(kept, data, 0)
    assert kept is not None
    # New summaries as the log grew, each once its tail reached its bound, none since.
    assert len(sizes) >= 3
    assert len(data) - covered < max(scan_summary.SUMMARY_AFTER, 2 * kept.weight)
    assert sizes[0] >= scan_summary.SUMMARY_AFTER
    with Session.open(home, SESSION) as session:
        assert session.find_key("k0") is not None
        assert session.find_key("k1199") is not None
    assert scanned == [len(data) - covered]  # the lines after the writer's last summary
    whole = scan_lines(data)
    assert scan_fields(scan_lines(data, kept, 0)) == scan_fields(whole)


def test_each_group_and_each_new_epoch_keeps_one_when_the_threshold_is_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scanned: list[int]
) -> None:
    """The chaos rig's setting: every group commit writes one, a new epoch's first line too."""
    monkeypatch.setattr(scan_summary, "SUMMARY_AFTER", 0)
    home = str(tmp_path / "home")
    app = DefaultApp()
    with Session.create(home, SESSION, app.initial_baseline(SESSION)) as session:
        first = read_summary(home, SESSION)
        assert first is not None
        assert (first.epoch, first.lines) == (0, 1)
        for n in range(5):
            session.append_many(request(session, n))
            with open(log_of(home), "rb") as f:
                data = f.read()
            assert _holds_what_a_scan_reads(read_summary(home, SESSION), data, 0) == len(data)
        session.commit_epoch("five requests", app.next_baseline(session, "five requests"))
        started = read_summary(home, SESSION)
        assert started is not None
        assert (started.epoch, started.size) == (1, os.path.getsize(session.log_path))
        session.append_many(request(session, 5))
        with open(session.log_path, "rb") as f:
            newest = f.read()
    assert _holds_what_a_scan_reads(read_summary(home, SESSION), newest, 1) == len(newest)
    with Session.open(home, SESSION) as session:
        assert session.find_key("k5") is not None
        assert session.find_key("k0") is not None
    assert scanned == [0]


def test_a_kept_summary_that_cannot_be_written_costs_nothing(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    big_session(home, requests=10)
    with open(os.path.join(home, "scans"), "w") as f:  # a file where the directory goes
        f.write("not a directory\n")
    with Session.open(home, SESSION) as session:
        for n in range(10, 500):
            session.append_many(request(session, n))
    with Session.open(home, SESSION) as session:
        assert session.find_key("k499") is not None
    assert read_summary(home, SESSION) is None


def _stored(uri: str) -> bytes | None:
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT data FROM loopd_files WHERE session = %s AND name = 'loopd.scan'", (SESSION,)
        ).fetchone()
    return None if row is None else bytes(row[0])


def _log(uri: str) -> bytes:
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(uri, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data FROM loopd_log_chunks WHERE session = %s AND epoch = 0 ORDER BY start",
            (SESSION,),
        ).fetchall()
    return b"".join(bytes(row[0]) for row in rows)


def _each_open_scanned(uri: str, scanned: list[int]) -> Callable[[], int]:
    def opened() -> int:
        before = len(scanned)
        with Session.open(PostgresStore(uri), SESSION) as session:  # a node with no home
            assert session.find_key("k0") is not None
        return scanned[before]

    return opened


def test_a_failover_node_takes_the_summary_its_writer_kept_in_the_database(
    postgres_server: PostgresServer, scanned: list[int]
) -> None:
    uri = postgres_server.new_database()
    writer = PostgresStore(uri)
    session = writer.create_session(SESSION, DefaultApp().initial_baseline(SESSION))
    try:
        for n in range(600):
            session.append_many(request(session, n))
        assert "loopd.scan" not in session.backend.names()  # no reader of its files sees it
    finally:
        session.close()
    stored = _stored(uri)
    assert stored is not None
    data = _log(uri)
    covered = _holds_what_a_scan_reads(summary_of_row(stored), data, 0)
    assert covered >= scan_summary.SUMMARY_AFTER
    opened = _each_open_scanned(uri, scanned)
    assert opened() == len(data) - covered
    # A deposed writer's summary is refused by the fence: the database's stays.
    deposed = PostgresStore(uri).open_session(SESSION)
    newer = PostgresStore(uri).open_session(SESSION)
    deposed.backend.put_summary(b"not a summary")
    assert _stored(uri) == stored
    newer.close()
    deposed.close()
    # One that is not a summary is no summary: the log is scanned whole.
    newer = PostgresStore(uri).open_session(SESSION)
    assert newer.backend.stored_summary() is not None
    newer.backend.put_summary(b"not a summary")
    assert newer.backend.stored_summary() is None  # not a summary: none
    newer.close()
    assert opened() == len(data)


def test_an_epoch_change_whose_last_step_failed_keeps_the_new_logs_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The epoch switched, the stale index files not removed (the session serves on):
    the summary kept from then on is of the new log."""
    monkeypatch.setattr(scan_summary, "SUMMARY_AFTER", 0)
    home = str(tmp_path / "home")
    app = DefaultApp()

    def refused(*_args: object) -> None:
        raise SessionIOError(home, errno.EACCES, "unlink")

    with Session.create(home, SESSION, app.initial_baseline(SESSION)) as session:
        for n in range(5):
            session.append_many(request(session, n))
        monkeypatch.setattr(session_module, "remove_stale", refused)
        with pytest.raises(SessionIOError):
            session.commit_epoch("five", app.next_baseline(session, "five"))
        assert session.epoch == 1
        assert session.broken is None
        for n in range(5, 10):
            session.append_many(request(session, n))
        with open(session.log_path, "rb") as f:
            newest = f.read()
    assert _holds_what_a_scan_reads(read_summary(home, SESSION), newest, 1) == len(newest)


def test_a_lock_held_on_the_summarys_table_never_holds_up_a_group_commit(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summary is written after the group commit, before its reply: a lock an operator
    holds on loopd_files (a VACUUM FULL, a LOCK TABLE) ends that write, not the reply."""
    psycopg = pytest.importorskip("psycopg")
    monkeypatch.setattr(scan_summary, "SUMMARY_AFTER", 0)  # a summary after every group
    uri = postgres_server.new_database()
    session = PostgresStore(uri).create_session(SESSION, DefaultApp().initial_baseline(SESSION))
    released = threading.Event()
    locker = psycopg.connect(uri)
    try:
        locker.execute("LOCK TABLE loopd_files IN ACCESS EXCLUSIVE MODE")

        def release() -> None:
            locker.rollback()
            released.set()

        timer = threading.Timer(30, release)
        timer.start()
        try:
            for n in range(3):
                session.append_many(request(session, n))
            assert not released.is_set()  # no append waited for the lock
            assert session.broken is None
        finally:
            timer.cancel()
            if not released.is_set():
                release()
        session.append_many(request(session, 3))
    finally:
        session.close()
        locker.close()
    stored = _stored(uri)
    data = _log(uri)
    assert stored is not None
    assert _holds_what_a_scan_reads(summary_of_row(stored), data, 0) == len(data)
    with Session.open(PostgresStore(uri), SESSION) as again:
        assert [again.find_key(f"k{n}") is not None for n in range(4)] == [True] * 4


def test_a_connection_ended_during_a_summary_write_loses_no_acknowledged_key(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server ends the writer's connection as it writes a summary (between two
    statements: nothing of ours in flight): the summary and the next append go on a new
    connection, the group before stays acknowledged, and a reopen finds every key."""
    psycopg = pytest.importorskip("psycopg")
    monkeypatch.setattr(scan_summary, "SUMMARY_AFTER", 0)  # a summary after every group
    uri = postgres_server.new_database()
    session = PostgresStore(uri).create_session(SESSION, DefaultApp().initial_baseline(SESSION))
    backend = session.backend
    put = backend.put_summary

    def ended_then_put(blob: bytes) -> None:
        pid = backend._conn().info.backend_pid
        with psycopg.connect(uri, autocommit=True) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
        put(blob)

    try:
        session.append_many(request(session, 0))
        monkeypatch.setattr(backend, "put_summary", ended_then_put)
        first = backend._conn().info.backend_pid
        session.append_many(request(session, 1))  # acknowledged, its summary on a new one
        assert session.broken is None
        monkeypatch.setattr(backend, "put_summary", put)
        session.append_many(request(session, 2))
        assert session.broken is None
        assert backend._conn().info.backend_pid != first  # made again, not broken
    finally:
        session.close()
    with Session.open(PostgresStore(uri), SESSION) as again:
        for key in ("k0", "k1", "k2"):
            assert again.find_key(key) is not None, key
    data = _log(uri)
    stored = _stored(uri)
    assert stored is not None  # the reopen's, or the one before the cut
    _holds_what_a_scan_reads(summary_of_row(stored), data, 0)


def test_a_database_row_is_a_summary_only_deflated_whole_and_within_its_bound(
    tmp_path: Path,
) -> None:
    home = str(tmp_path / "home")
    big_session(home, requests=400, kept=True)
    with open(scan_path(home, SESSION), "rb") as f:
        blob = f.read()
    row = summary_of_row(zlib.compress(blob, 1))
    assert row is not None
    assert encode(row) == blob
    assert summary_of_row(blob) is None  # not deflated: not a row put_summary wrote
    assert summary_of_row(b"not a summary") is None
    assert summary_of_row(zlib.compress(b"not a summary either")) is None
    assert summary_of_row(zlib.compress(b"\0" * (MAX_BYTES + 1), 1)) is None  # a bomb
    assert summary_of_row(zlib.compress(blob)[:-2]) is None  # cut short
    assert summary_of_row(zlib.compress(blob) + b"more") is None  # more after it


def test_a_summary_due_after_a_commit_whose_database_went_away_leaves_it_acknowledged(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """COMMIT returned, then the connection ended and no new one can be made, as the
    group's summary is written: the summary is let go and the append returns (its
    requests acknowledged: never "nothing was sent" for what committed); the next append,
    with nothing sent, is the one refused."""
    psycopg = pytest.importorskip("psycopg")
    monkeypatch.setattr(scan_summary, "SUMMARY_AFTER", 0)  # a summary after every group
    uri = postgres_server.new_database()
    name = uri.rsplit("/", 1)[1]
    admin = psycopg.connect(uri.rsplit("/", 1)[0] + "/postgres", autocommit=True)
    session = PostgresStore(uri).create_session(SESSION, DefaultApp().initial_baseline(SESSION))

    def gone_after_commit(point: Point, backend_pid: int) -> None:
        if point is Point.AFTER_COMMIT:
            admin.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")
            admin.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))
            poll_until(
                lambda: (
                    admin.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend_pid,)
                    ).fetchone()
                    is None
                ),
                what="the server process to end",
            )

    try:
        session.append_many(request(session, 0))
        previous = set_hook(gone_after_commit)
        try:
            session.append_many(request(session, 1))  # acknowledged, whatever its summary
        finally:
            set_hook(previous)
        assert session.broken is None
        with pytest.raises(SessionError, match="nothing of this was sent"):
            session.append_many(request(session, 2))
    finally:
        admin.execute(f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS true")
        admin.close()
        session.close()
    with Session.open(PostgresStore(uri), SESSION) as again:
        assert again.find_key("k1") is not None
        assert again.find_key("k2") is None
