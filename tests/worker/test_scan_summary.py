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
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.client import Client, call
from tests.harness.forged import rechained
from tests.harness.postgres_server import PostgresServer
from worker.app import DefaultApp
from worker.offline.trash import move_to_trash
from worker.store.disk.scan_file import read_summary, scan_path
from worker.store.errors import LogError
from worker.store.format import scan_summary
from worker.store.format.line_scan import LineScan, scan_lines
from worker.store.format.records import (
    Assistant,
    EpochEnd,
    Record,
    ToolResult,
    Usage,
    User,
)
from worker.store.format.scan_summary import ScanSummary, Summarized, decode, encode
from worker.store.postgres import PostgresStore
from worker.store.session import Session

SESSION = "big"


def _fields(scan: LineScan | None) -> tuple[object, ...]:
    assert scan is not None
    return (scan.types, scan.calls, scan.users, scan.keys, scan.crc, scan.adler)


def _request(session: Session, n: int, key: str | None = None) -> list[Record]:
    return [
        User(text=f"request {n}", key=f"k{n}" if key is None else key),
        ToolResult(call=session.next_call(), tool="echo", output=f"request {n}", ok=True),
        Assistant(text=f"echo: request {n}"),
        Usage(prompt_tokens=3, completion_tokens=4, context_tokens=7),
    ]


def _big_session(home: str, requests: int = 400) -> None:
    """``requests`` keyed requests of the default App, a group each: about 140 KiB."""
    with Session.create(home, SESSION, DefaultApp().initial_baseline(SESSION)) as session:
        for n in range(requests):
            session.append_many(_request(session, n))


def _log(home: str) -> str:
    return os.path.join(home, "sessions", SESSION, "0.jsonl")


@pytest.fixture
def home() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as root:
        home = os.path.join(root, "home")
        _big_session(home)
        yield home


def test_an_open_that_scanned_the_log_keeps_a_summary_and_the_next_open_takes_it(
    home: str,
) -> None:
    with open(_log(home), "rb") as f:
        before = f.read()
    assert read_summary(home, SESSION) is None  # create and append keep none
    Session.open(home, SESSION).close()
    kept = read_summary(home, SESSION)
    assert kept is not None
    assert kept.size == len(before)
    assert kept.covers(before, 0)
    with Session.open(home, SESSION) as session:
        session.append_many(_request(session, 1000))
    with open(_log(home), "rb") as f:
        after = f.read()
    scan = scan_lines(after, read_summary(home, SESSION), 0)
    assert scan is not None
    assert scan.scanned == len(after) - len(before)
    assert _fields(scan) == _fields(scan_lines(after))
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
            ends.append(os.path.getsize(_log(home)))
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
                ends.append(os.path.getsize(_log(home)))
        with open(_log(home), "rb") as f:
            data = f.read()
    whole = _fields(scan_lines(data))
    for end in ends:
        prefix = scan_lines(data[:end])
        assert prefix is not None
        kept = prefix.summary(0, data[:end])
        assert kept is not None
        summary = decode(encode(kept))
        assert summary is not None
        assert summary.covers(data, 0)
        scan = scan_lines(data, summary, 0)
        assert _fields(scan) == whole
        assert scan is not None
        assert scan.scanned == len(data) - end


def test_a_summary_of_other_bytes_is_not_taken_and_open_reads_the_log_as_it_is(
    home: str,
) -> None:
    """A session restored from an older copy of sessions/ alone: its log holds other keys
    where the summary's lie, the same length and first line. Open reads the log's."""
    Session.open(home, SESSION).close()
    summary = read_summary(home, SESSION)
    assert summary is not None
    with open(_log(home), "rb") as f:
        lines = f.read().splitlines(keepends=True)
    # Each User's key k<n> becomes j<n> (the same length), every checksum made to match.
    other = [
        line.replace(b'"key":"k', b'"key":"j') if line.startswith(b'{"type":"User"') else line
        for line in lines
    ]
    forged = rechained([line[: line.rindex(b',"crc":')] + b"}" for line in other])
    assert len(forged) == summary.size
    assert forged.startswith(summary.first)
    assert not summary.covers(forged, 0)
    with open(_log(home), "wb") as f:
        f.write(forged)
    with Session.open(home, SESSION) as session:
        assert session.find_key("j7") is not None
        assert session.find_key("k7") is None
    assert _fields(scan_lines(forged, summary, 0)) == _fields(scan_lines(forged))


@pytest.mark.parametrize(
    "damage",
    ["flipped", "truncated", "zeros", "empty", "a directory", "a link", "another session's"],
)
def test_a_damaged_or_foreign_summary_is_no_summary(home: str, damage: str) -> None:
    Session.open(home, SESSION).close()
    path = scan_path(home, SESSION)
    with open(path, "rb") as f:
        blob = f.read()
    os.unlink(path)
    if damage == "flipped":
        blob = blob[:100] + bytes([blob[100] ^ 1]) + blob[101:]
    elif damage == "truncated":
        blob = blob[: len(blob) // 2]
    elif damage == "zeros":
        blob = bytes(len(blob))
    elif damage == "empty":
        blob = b""
    if damage == "a directory":
        os.mkdir(path)
    elif damage == "a link":
        os.symlink(os.path.join(home, "sessions", SESSION, "0.jsonl"), path)
    elif damage == "another session's":
        _big_session(os.path.join(home, "other"), requests=450)
        Session.open(os.path.join(home, "other"), SESSION).close()
        os.rename(scan_path(os.path.join(home, "other"), SESSION), path)
    else:
        with open(path, "wb") as f:
            f.write(blob)
    assert read_summary(home, SESSION) is None or damage == "another session's"
    with Session.open(home, SESSION) as session:
        assert session.find_key("k399") is not None
        assert session.find_key("k400") is None
        assert len(session.records) == 1 + 4 * 400


def test_a_log_damaged_under_its_summary_is_refused_at_the_same_line_as_without_one(
    home: str,
) -> None:
    Session.open(home, SESSION).close()
    assert read_summary(home, SESSION) is not None
    with open(_log(home), "r+b") as f:
        data = f.read()
        at = data.index(b"request 123")  # line 1 + 4 * 123 + 1: the 124th request's User
        f.seek(at)
        f.write(b"REQUEST")
    with pytest.raises(LogError) as refused:
        Session.open(home, SESSION)
    os.unlink(scan_path(home, SESSION))
    with pytest.raises(LogError) as without:
        Session.open(home, SESSION)
    assert str(refused.value) == str(without.value)
    assert f"0.jsonl:{1 + 4 * 123 + 1}:" in str(refused.value)


def test_a_summary_that_cannot_be_written_costs_nothing_but_the_next_scan(home: str) -> None:
    with open(os.path.join(home, "scans"), "w") as f:  # a file where the directory goes
        f.write("not a directory\n")
    with Session.open(home, SESSION) as session:
        session.append_many(_request(session, 2000))
    with Session.open(home, SESSION) as session:
        assert session.find_key("k2000") is not None
    assert read_summary(home, SESSION) is None


def test_a_summary_is_kept_only_past_its_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory() as root:
        home = os.path.join(root, "home")
        _big_session(home, requests=20)  # about 7 KiB
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
        _big_session(home)
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


def test_a_node_reopening_a_session_in_postgresql_takes_its_summary_and_only_for_those_bytes(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """A worker of a PostgreSQL session keeps its summary in its node's home: a restart
    there scans the new lines; a log replaced in the database is read as it is."""
    psycopg = pytest.importorskip("psycopg")
    uri = postgres_server.new_database()
    node = PostgresStore(uri, scans=str(tmp_path))
    with Session.create(node, SESSION, DefaultApp().initial_baseline(SESSION)) as session:
        for n in range(400):
            session.append_many(_request(session, n))
    assert read_summary(str(tmp_path), SESSION) is None
    Session.open(node, SESSION).close()
    kept = read_summary(str(tmp_path), SESSION)
    assert kept is not None
    with Session.open(node, SESSION) as session:
        session.append_many(_request(session, 400))
    with Session.open(node, SESSION) as session:
        assert session.find_key("k0") is not None
        assert session.find_key("k400") is not None
    assert read_summary(str(tmp_path), SESSION).size == kept.size  # type: ignore[union-attr]
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
    with Session.open(node, SESSION) as session:
        assert session.find_key("j0") is not None
        assert session.find_key("k0") is None


def test_a_session_moved_to_the_trash_leaves_no_summary_behind(home: str) -> None:
    Session.open(home, SESSION).close()
    assert read_summary(home, SESSION) is not None
    move_to_trash(home, SESSION)
    assert not os.path.exists(scan_path(home, SESSION))


def _forge_summary(home: str, change: str) -> None:
    """Keep a summary whose lists say otherwise of the log's bytes (their length, first
    line, CRC-32 and Adler-32 still those bytes'): one a person or a bug could write."""
    with open(_log(home), "rb") as f:
        data = f.read()
    scan = scan_lines(data)
    assert scan is not None
    types, calls, users, keys = list(scan.types), list(scan.calls), list(scan.users), scan.keys
    if change == "cut inside a group":  # what a kill leaves, summarized as if whole
        data = data[: data.rindex(b"\n", 0, data.rindex(b'"part":2,"parts":4')) + 1]
        lines = data.count(b"\n")
        users = [n for n in users if n <= lines]
        types, keys = types[:lines], keys[: len(users)]
        calls = calls[: types.count(ToolResult)]
    else:  # the last line an EpochEnd
        types[-1] = EpochEnd
    said = Summarized(types, calls, users, keys)
    summary = ScanSummary.of(0, data, zlib.crc32(data), zlib.adler32(data), said)
    assert summary is not None
    os.makedirs(os.path.join(home, "scans"), exist_ok=True)
    with open(scan_path(home, SESSION), "wb") as f:
        f.write(encode(summary))


def test_a_summary_of_a_log_cut_inside_a_group_is_no_summary(home: str) -> None:
    """A log cut inside a group commit is refused at it, whatever a summary says."""
    with open(_log(home), "rb") as f:
        whole = f.read()
    _forge_summary(home, "cut inside a group")
    summary = read_summary(home, SESSION)
    assert summary is not None
    with open(_log(home), "wb") as f:
        f.write(whole[: summary.size])
    with pytest.raises(LogError, match="incomplete group"):
        Session.open(home, SESSION)


def test_a_summary_whose_classes_say_otherwise_is_refused_at_its_line_never_a_traceback(
    home: str,
) -> None:
    _forge_summary(home, "the last line an EpochEnd")
    with pytest.raises(LogError, match=rf"0\.jsonl:{1 + 4 * 400}: holds a Usage where open read"):
        Session.open(home, SESSION)
    os.unlink(scan_path(home, SESSION))
    with Session.open(home, SESSION) as session:  # the log itself is whole
        assert session.find_key("k399") is not None
