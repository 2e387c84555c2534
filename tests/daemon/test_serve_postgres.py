"""``loopd serve --store postgresql://...``: a real serve on a real PostgreSQL, one node.

The server (tests/harness/postgres_server.py) is one per xdist worker, a fresh database per test.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from supervisor.client import call
from supervisor.errors import ControlError
from tests.harness.etcd_server import free_port
from tests.harness.postgres_server import PostgresServer
from tests.harness.support import loopd, poll_until, running_daemon, status, wait_state
from worker import Session
from worker.store.postgres import PostgresStore


@pytest.fixture(scope="module")
def server(postgres_server: PostgresServer) -> PostgresServer:
    return postgres_server


@pytest.fixture
def uri(server: PostgresServer) -> str:
    return server.new_database()


def _keys(uri: str, session_id: str) -> list[str | None]:
    """The key of every User record of every epoch, read straight from the database's rows."""
    with psycopg.connect(uri) as conn:
        rows = conn.execute(
            "SELECT data FROM loopd_log_chunks WHERE session = %s ORDER BY epoch, start",
            (session_id,),
        ).fetchall()
    records = [json.loads(line) for (data,) in rows for line in bytes(data).splitlines()]
    return [record["key"] for record in records if record["type"] == "User"]


def _connections(uri: str) -> int:
    """Connections to the database other than this one (pg_stat_activity)."""
    with psycopg.connect(uri) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _restarted(home: Path, session_id: str, old_pid: object) -> dict[str, object]:
    def check() -> dict[str, object] | None:
        row = status(home, session_id)
        return row if row["state"] == "RUNNING" and row["pid"] != old_pid else None

    return poll_until(check, what=f"{session_id}'s restarted worker")


def test_serve_with_a_store_creates_serves_tails_and_compacts_sessions_in_the_database(
    tmp_path: Path, uri: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--store", uri) as daemon:
        call(str(home), "create", session="s1")
        reply = call(str(home), "send", session="s1", text="hello", key="k1")
        assert isinstance(reply, dict)
        assert reply["text"] == "echo: hello"
        assert not (home / "sessions" / "s1").exists()  # the database holds it
        assert PostgresStore(uri).session_ids() == ["s1"]
        assert _connections(uri) == 1  # the worker's; serve's own were closed at start
        tail = loopd("tail", "--home", str(home), "s1", "-n", "2")
        assert tail.returncode == 0, tail.stderr
        assert '"text":"echo: hello"' in tail.stdout
        compacted = call(str(home), "compact", session="s1", summary="by hand")
        assert isinstance(compacted, dict)
        assert compacted["state"]["epoch"] == 1
        restarted = call(str(home), "restart", session="s1")
        assert isinstance(restarted, dict)
        assert restarted["state"] == "RUNNING"
        again = call(str(home), "send", session="s1", text="hello", key="k1")
        assert isinstance(again, dict)
        assert again["duplicate"] is True  # found in epoch 0, from the database
        assert daemon.stop() == 0
    assert "synchronous_commit=on" in daemon.log_path.read_text()
    with Session.open(PostgresStore(uri), "s1") as session:
        assert session.epoch == 1
        assert session.carry == "by hand"


@pytest.mark.parametrize("method", ["fork", "exec"])
def test_a_sigkilled_worker_restarts_with_every_acknowledged_key_once(
    tmp_path: Path, uri: str, method: str
) -> None:
    home = tmp_path / "home"
    acknowledged = [f"k{n}" for n in range(6)]
    with running_daemon(home, "--store", uri, "--start-method", method) as daemon:
        call(str(home), "create", session="s1")
        for key in acknowledged[:3]:
            call(str(home), "send", session="s1", text=key, key=key)
        old_pid = wait_state(home, "s1", "RUNNING")["pid"]
        assert isinstance(old_pid, int)
        os.kill(old_pid, signal.SIGKILL)
        after = _restarted(home, "s1", old_pid)
        assert after["restarts"] == 1
        for key in acknowledged:  # the first three again: retries, applied once
            call(str(home), "send", session="s1", text=key, key=key)
        assert daemon.stop() == 0
    assert _keys(uri, "s1") == acknowledged


def test_a_restarted_serve_on_another_home_hosts_the_databases_sessions(
    tmp_path: Path, uri: str
) -> None:
    with running_daemon(tmp_path / "first", "--store", uri):
        call(str(tmp_path / "first"), "create", session="a")
        call(str(tmp_path / "first"), "create", session="b")
        call(str(tmp_path / "first"), "send", session="a", text="x", key="once")
    home = tmp_path / "second"
    home.mkdir()
    (home / "loopd.toml").write_text(f'store = "{uri}"\n')  # a key of loopd.toml, too
    with running_daemon(home):
        assert wait_state(home, "a", "RUNNING")["records"] == 5
        wait_state(home, "b", "RUNNING")
        retry = call(str(home), "send", session="a", text="x", key="once")
        assert isinstance(retry, dict)
        assert retry["duplicate"] is True


def test_a_write_refused_by_the_database_ends_the_worker_fatal_not_owner(
    tmp_path: Path, uri: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--store", uri):
        call(str(home), "create", session="s1")
        with Session.open(PostgresStore(uri), "s1"):  # claims it: the worker is deposed
            with pytest.raises(ControlError, match="not the owner now"):
                call(str(home), "send", session="s1", text="late", key="late")
            row = wait_state(home, "s1", "FATAL")
        assert "another process" in str(row["last_error"])
        assert row["restarts"] == 0
    assert "late" not in _keys(uri, "s1")


def test_a_database_gone_while_serving_is_a_restart_with_backoff_and_a_clear_last_error(
    tmp_path: Path, server: PostgresServer, uri: str
) -> None:
    home = tmp_path / "home"
    with running_daemon(home, "--store", uri, "--backoff-base", "0.2", "--backoff-max", "0.2"):
        call(str(home), "create", session="s1")
        with psycopg.connect(server.uri(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE {uri.rsplit('/', 1)[1]} WITH (FORCE)")
        with pytest.raises(ControlError, match="database error"):  # its outcome is unknown
            call(str(home), "send", session="s1", text="x", key="k")

        def failing() -> dict[str, object] | None:
            row = status(home, "s1")
            return row if int(str(row["restarts"])) >= 1 and row["last_error"] else None

        row = poll_until(failing, what="a restart that meets the missing database")
        assert "worker exit code 8: postgresql://postgres@127.0.0.1" in str(row["last_error"])
        assert "database error" in str(row["last_error"])
        assert "Traceback" not in (tmp_path / "home.serve.log").read_text()


def test_require_sync_replication_refuses_a_server_without_it_in_one_line(
    tmp_path: Path, uri: str
) -> None:
    home = str(tmp_path / "h")
    done = loopd("serve", "--home", home, "--store", uri, "--require-sync-replication")
    assert done.returncode == 1
    said = done.stderr.splitlines()  # what the server promises, then the refusal
    assert said[-1].startswith("loopd serve: postgresql://postgres@127.0.0.1:")
    assert "--require-sync-replication: the server does not replicate synchronously" in said[-1]
    assert "synchronous_standby_names=''" in said[-1]
    assert "Traceback" not in done.stderr


def test_an_unreachable_database_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    uri = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere?connect_timeout=5"
    done = loopd("serve", "--home", str(tmp_path / "h"), "--store", uri)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("loopd serve: --store: postgresql://postgres@127.0.0.1:")
    assert "database error" in done.stderr


def test_a_schema_newer_than_this_loopd_is_refused_at_start_in_one_line(
    tmp_path: Path, uri: str
) -> None:
    PostgresStore(uri).ensure_schema()
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("UPDATE loopd_schema SET version = 99")
    done = loopd("serve", "--home", str(tmp_path / "h"), "--store", uri)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert done.stderr.endswith("schema version 99 is newer than this loopd's (1)\n")


@pytest.mark.timeout(180)
def test_a_database_out_for_longer_than_the_restart_window_is_waited_for_not_fatal(
    tmp_path: Path,
) -> None:
    """The server stopped (as a primary is lost before its standby is promoted): the
    session is started again and again, past --max-restarts, and never FATAL; once the
    server is back, the same key is applied once and the session runs on."""
    own = PostgresServer()  # stopped and started again here: not the module's server
    try:
        own.start()
        uri = own.new_database()
        home = tmp_path / "home"
        with running_daemon(home, "--store", uri, "--max-restarts", "2",
                            "--restart-window", "60", "--start-retries", "2"):  # fmt: skip
            call(str(home), "create", session="s1")
            call(str(home), "send", session="s1", text="before", key="before")
            own.run("pg_ctl", "-D", str(own.data), "-m", "immediate", "-w", "stop")

            def many_restarts() -> dict[str, object] | None:
                row = status(home, "s1")
                assert row["state"] != "FATAL", row["last_error"]
                return row if int(str(row["restarts"])) > 4 else None

            with pytest.raises(ControlError):
                call(str(home), "send", session="s1", text="during", key="during")
            row = poll_until(many_restarts, timeout=90, what="restarts past --max-restarts")
            assert "waiting for the database" in str(row["last_error"])
            own.launch()

            def applied() -> object:
                try:
                    return call(str(home), "send", session="s1", text="during", key="during")
                except ControlError:
                    return None

            poll_until(applied, timeout=60, what="the session served again")
            assert wait_state(home, "s1", "RUNNING")["state"] == "RUNNING"
        assert _keys(uri, "s1").count("during") == 1
        assert _keys(uri, "s1").count("before") == 1
    finally:
        own.stop()


def test_an_idle_session_rides_through_its_connection_ended_by_the_database(
    tmp_path: Path, uri: str
) -> None:
    """Every connection ended by the server (a restart of the database, an operator's
    pg_terminate_backend) while the session was idle: its next send and its next read of
    an older epoch are served on a new connection, by the same worker, without an error."""
    home = tmp_path / "home"
    with running_daemon(home, "--store", uri):
        call(str(home), "create", session="s1")
        call(str(home), "send", session="s1", text="before", key="before")
        call(str(home), "compact", session="s1")  # "before" now in a sealed epoch
        pid = wait_state(home, "s1", "RUNNING")["pid"]
        with psycopg.connect(uri, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        poll_until(lambda: _connections(uri) == 0, what="every connection ended")
        again = call(str(home), "send", session="s1", text="before", key="before")
        assert isinstance(again, dict)
        assert (again["duplicate"], again["epoch"]) == (True, 0)  # read on a new connection
        with psycopg.connect(uri, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        poll_until(lambda: _connections(uri) == 0, what="every connection ended")
        call(str(home), "send", session="s1", text="after", key="after")
        assert status(home, "s1")["pid"] == pid  # the same worker: no restart
    assert _keys(uri, "s1") == ["before", "after"]


def test_a_database_that_accepts_and_never_answers_is_refused_at_start_in_time(
    tmp_path: Path,
) -> None:
    """A stopped or black-holed server accepts a connection and says nothing: serve gives
    up within the connect timeout (10 s), in one line, instead of waiting for ever."""
    hole = socket.create_server(("127.0.0.1", 0))
    try:
        port = hole.getsockname()[1]
        uri = f"postgresql://postgres@127.0.0.1:{port}/nowhere?sslmode=disable"
        done = loopd("serve", "--home", str(tmp_path / "h"), "--store", uri)
    finally:
        hole.close()
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "timeout" in done.stderr


@pytest.mark.timeout(180)
def test_serve_with_store_wait_waits_for_a_database_that_starts_after_it(tmp_path: Path) -> None:
    """A boot that starts loopd before its database: with --store-wait serve says it waits,
    then serves once the server answers."""
    own = PostgresServer()  # its port chosen, the server not started yet
    home = tmp_path / "home"
    log = tmp_path / "serve.log"
    try:
        with log.open("wb") as out:
            serve = subprocess.Popen(
                [sys.executable, "-m", "supervisor", "serve", "--home", str(home), "--store",
                 own.uri(), "--store-wait", "120"],
                stdout=out, stderr=out, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        try:
            poll_until(lambda: "waiting for it" in log.read_text(), what="serve to wait")
            own.start()
            poll_until((home / "loopd.sock").exists, timeout=60, what="the socket")
            call(str(home), "create", session="s1", timeout=60)
            call(str(home), "send", session="s1", text="hello", key="k1", timeout=60)
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=60)
        assert _keys(own.uri(), "s1") == ["k1"]
    finally:
        own.stop()


def test_serve_waiting_for_its_database_ends_at_once_on_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    uri = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    with log.open("wb") as out:
        waiting = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "serve", "--home", str(tmp_path / "h"),
             "--store", uri, "--store-wait", "120"],
            stdout=out, stderr=out, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        poll_until(lambda: "waiting for it" in log.read_text(), what="serve to wait")
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(timeout=20) == -signal.SIGTERM  # nothing started: nothing to stop
    finally:
        waiting.kill()
        waiting.wait()
