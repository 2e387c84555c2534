"""Open keeps a summary of its scan of the newest log; the next open scans only the lines
after it (docs/format.md "The scan summary"). A cache: it gives exactly what a whole scan
gives, only for the very bytes it was made of, and never a traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.client import Client, call
from tests.harness.forged import rechained
from tests.harness.postgres_server import PostgresServer
from tests.harness.summary_sessions import (
    SESSION,
    big_home,
    big_session,
    log_of,
    request,
    scan_fields,
)
from worker.app import DefaultApp
from worker.offline.trash import move_to_trash
from worker.store.disk.scan_file import read_summary, scan_path
from worker.store.format import scan_summary
from worker.store.format.line_scan import scan_lines
from worker.store.format.records import (
    Assistant,
    Record,
    ToolResult,
    Usage,
    User,
)
from worker.store.format.scan_summary import ScanSummary, decode, encode
from worker.store.loader import load_session
from worker.store.postgres import PostgresStore
from worker.store.postgres.backend import summary_of_row
from worker.store.session import Session

home = big_home


def test_an_open_that_scanned_the_log_keeps_a_summary_and_the_next_open_takes_it(
    home: str,
) -> None:
    with open(log_of(home), "rb") as f:
        before = f.read()
    assert read_summary(home, SESSION) is None  # the fixture removed what the writer kept
    Session.open(home, SESSION).close()
    kept = read_summary(home, SESSION)
    assert kept is not None
    assert kept.size == len(before)
    assert kept.covers(before, 0)
    with Session.open(home, SESSION) as session:
        session.append_many(request(session, 1000))
    with open(log_of(home), "rb") as f:
        after = f.read()
    scan = scan_lines(after, read_summary(home, SESSION), 0)
    assert scan is not None
    assert scan.scanned == len(after) - len(before)
    assert scan_fields(scan) == scan_fields(scan_lines(after))
    # A small tail keeps the summary as it is: the next open reads little past it.
    assert read_summary(home, SESSION).size == len(before)  # type: ignore[union-attr]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=st.lists(
        st.lists(
            st.sampled_from(["user", "user-none", "user-quote", "tool", "assistant", "usage"]),
            min_size=1,
            max_size=11,
        ),
        min_size=1,
        max_size=14,
    ),
)
def test_a_summary_of_any_group_boundary_gives_what_a_whole_scan_gives(
    groups: list[list[str]],
) -> None:
    with tempfile.TemporaryDirectory() as root:
        home = os.path.join(root, "home")
        ends = []
        with Session.create(home, SESSION, DefaultApp().initial_baseline(SESSION)) as session:
            ends.append(os.path.getsize(log_of(home)))
            for g, kinds in enumerate(groups):
                batch: list[Record] = []
                for i, kind in enumerate(kinds):
                    if kind.startswith("user"):
                        key = {"user": f"g{g}-{i}", "user-none": None, "user-quote": f'q"\\{g}/{i}'}
                        batch.append(User(text=f'says "{g}"\n', key=key[kind]))
                    elif kind == "tool":
                        batch.append(
                            ToolResult(call=session.next_call(), tool="t", output="o", ok=True)
                        )
                    elif kind == "assistant":
                        batch.append(Assistant(text="a"))
                    else:
                        batch.append(Usage(prompt_tokens=1, completion_tokens=2, context_tokens=3))
                session.append_many(batch)
                ends.append(os.path.getsize(log_of(home)))
        with open(log_of(home), "rb") as f:
            data = f.read()
    whole = scan_fields(scan_lines(data))
    for end in ends:
        prefix = scan_lines(data[:end])
        assert prefix is not None
        kept = prefix.summary(0, data[:end])
        assert kept is not None
        summary = decode(encode(kept))
        assert summary is not None
        assert summary.covers(data, 0)
        scan = scan_lines(data, summary, 0)
        assert scan_fields(scan) == whole
        assert scan is not None
        assert scan.scanned == len(data) - end


def test_a_summary_that_cannot_be_written_costs_nothing_but_the_next_scan(home: str) -> None:
    with open(os.path.join(home, "scans"), "w") as f:  # a file where the directory goes
        f.write("not a directory\n")
    with Session.open(home, SESSION) as session:
        session.append_many(request(session, 2000))
    with Session.open(home, SESSION) as session:
        assert session.find_key("k2000") is not None
    assert read_summary(home, SESSION) is None


def test_a_summary_is_kept_only_past_its_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory() as root:
        home = os.path.join(root, "home")
        big_session(home, requests=20)  # about 7 KiB
        Session.open(home, SESSION).close()
        assert read_summary(home, SESSION) is None
        monkeypatch.setattr(scan_summary, "SUMMARY_AFTER", 0)
        Session.open(home, SESSION).close()
        assert read_summary(home, SESSION) is not None


def _wait_running(home: str, deadline: float) -> int:
    while time.monotonic() < deadline:
        rows = call(home, "status", session=SESSION)
        assert isinstance(rows, list)
        if rows[0]["state"] == "RUNNING" and rows[0]["pid"]:
            return int(rows[0]["pid"])
        time.sleep(0.02)
    raise AssertionError("the session did not come back RUNNING")


@pytest.mark.timeout(120)
def test_a_worker_killed_and_restarted_from_its_summary_answers_old_keys_as_duplicates() -> None:
    with tempfile.TemporaryDirectory() as root:
        home = os.path.join(root, "home")
        big_session(home)
        serve = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve", "--home", home, "--stable-after", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(home, "loopd.sock")):
                assert serve.poll() is None
                assert time.monotonic() < deadline
                time.sleep(0.02)
            with Client(home) as client:
                assert client.send(SESSION, "again", key="k5")["duplicate"]
                first = read_summary(home, SESSION)  # kept by the worker's open
                assert first is not None
                for n in range(3):
                    pid = _wait_running(home, deadline)
                    client.send(SESSION, f"new {n}", key=f"new{n}")
                    os.kill(pid, signal.SIGKILL)
                    for key in ("k0", "k399", f"new{n}"):
                        reply = client.send(SESSION, "retried", key=key)
                        assert reply["duplicate"], (key, reply)
                assert read_summary(home, SESSION).size == first.size  # type: ignore[union-attr]
                fresh = client.send(SESSION, "fresh", key="fresh")
                assert not fresh.get("duplicate")
        finally:
            serve.send_signal(signal.SIGTERM)
            try:
                serve.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
            assert serve.stderr is not None
            serve.stderr.close()


def test_an_open_in_postgresql_keeps_its_summary_in_the_database_and_only_for_those_bytes(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """An open of a PostgreSQL session that scanned its log keeps the summary in the
    database, not in any node's home: the next open of any node scans the new lines; a
    log replaced in the database is read as it is."""
    psycopg = pytest.importorskip("psycopg")
    uri = postgres_server.new_database()
    store = PostgresStore(uri)
    with Session.create(store, SESSION, DefaultApp().initial_baseline(SESSION)) as session:
        for n in range(400):
            session.append_many(request(session, n))

    def stored() -> ScanSummary | None:
        with psycopg.connect(uri, autocommit=True) as conn:
            row = conn.execute("SELECT data FROM loopd_files WHERE name = 'loopd.scan'").fetchone()
        return None if row is None else summary_of_row(bytes(row[0]))

    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("DELETE FROM loopd_files WHERE name = 'loopd.scan'")  # as before any
    Session.open(store, SESSION).close()
    kept = stored()
    assert kept is not None
    with psycopg.connect(uri, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data FROM loopd_log_chunks WHERE session = %s ORDER BY start", (SESSION,)
        ).fetchall()
    assert kept.size == sum(len(bytes(row[0])) for row in rows)
    with Session.open(PostgresStore(uri), SESSION) as session:
        session.append_many(request(session, 400))
    with Session.open(PostgresStore(uri), SESSION) as session:
        assert session.find_key("k0") is not None
        assert session.find_key("k400") is not None
    assert stored().size == kept.size  # type: ignore[union-attr]  # a small tail keeps it
    assert not os.listdir(tmp_path)  # no node's home holds one
    with psycopg.connect(uri, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT data FROM loopd_log_chunks WHERE session = %s ORDER BY start", (SESSION,)
        ).fetchall()
        lines = b"".join(bytes(row[0]) for row in rows).splitlines()
        other = [line.replace(b'"key":"k', b'"key":"j') for line in lines]
        forged = rechained([line[: line.rindex(b',"crc":')] + b"}" for line in other])
        with conn.transaction():
            conn.execute("DELETE FROM loopd_log_chunks WHERE session = %s", (SESSION,))
            conn.execute(
                "INSERT INTO loopd_log_chunks (session, epoch, start, data) VALUES (%s, 0, 0, %s)",
                (SESSION, forged),
            )
    with Session.open(store, SESSION) as session:
        assert session.find_key("j0") is not None
        assert session.find_key("k0") is None


def test_a_session_moved_to_the_trash_leaves_no_summary_behind(home: str) -> None:
    Session.open(home, SESSION).close()
    assert read_summary(home, SESSION) is not None
    move_to_trash(home, SESSION)
    assert not os.path.exists(scan_path(home, SESSION))


def test_keys_of_four_byte_characters_keep_their_summary(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    with Session.create(home, SESSION, DefaultApp().initial_baseline(SESSION)) as session:
        for n in range(60):
            session.append(User(text="", key=f"{n}" + "\U0001f600" * 400))
    Session.open(home, SESSION).close()
    summary = read_summary(home, SESSION)
    with open(log_of(home), "rb") as f:
        assert summary is not None
        assert summary.covers(f.read(), 0)


def test_only_an_open_makes_a_summary_of_what_it_read(home: str) -> None:
    directory = os.path.join(home, "sessions", SESSION)
    assert load_session(directory, SESSION).scan_summary is None  # inspect, backup, ...
    assert load_session(directory, SESSION, summarize=True).scan_summary is not None
