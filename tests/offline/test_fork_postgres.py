"""``loopd fork ID NEW --store URI``: a fork of a session kept in PostgreSQL, into it, with
ID live: NEW's epochs 0..E are copies made in one transaction, and a serve on that store
serves NEW's old keys from its log while ID keeps serving (a real server and serve)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.client import Client, call
from tests.harness.postgres_server import PostgresServer
from tests.harness.support import loopd, running_daemon, wait_state
from worker.store.format.records import SessionStart
from worker.store.postgres import PostgresStore
from worker.store.postgres.transfer import read_session


@pytest.mark.timeout(120)
def test_fork_in_a_store_of_a_live_session_serves_old_keys_and_leaves_the_origin_serving(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    uri = postgres_server.new_database()
    home = tmp_path / "home"
    with running_daemon(home, "--store", uri, "--budget", "30"), Client(str(home)) as client:
        call(str(home), "create", session="a")
        outcomes = [client.send("a", "x" * 80, key=f"k{n}") for n in range(4)]
        assert [o["epoch"] for o in outcomes] == [0, 1, 2, 3]  # each request commits
        done = loopd("fork", "a", "b", "--epoch", "1", "--store", uri)
        assert done.returncode == 0, done.stderr
        assert "forked a as b in " in done.stdout
        assert "from epoch 1: epochs 0..1 copied" in done.stdout
        assert client.send("a", "z", key="k4")["duplicate"] is False  # a serves on
        again = loopd("fork", "a", "b", "--store", uri)  # NEW exists: refused, one line
        assert again.returncode == 1
        assert again.stderr.count("\n") == 1
        assert again.stderr.startswith("loopd fork: ")
    state = read_session(PostgresStore(uri), "b", history=True)
    start = state.records[0]
    assert isinstance(start, SessionStart)
    assert (state.epoch, start.session, start.forked_from) == (2, "b", "a")
    with running_daemon(home, "--store", uri), Client(str(home)) as client:
        wait_state(home, "b", "RUNNING")  # a serve on the store serves every session of it
        old = client.send("b", "x" * 80, key="k1")
        assert (old["duplicate"], old["epoch"]) == (True, 1)  # from NEW's copied log
        assert client.send("b", "y", key="k2")["duplicate"] is False  # a's epoch 2, not b's
        assert client.send("a", "z", key="k2")["duplicate"] is True
    verified = loopd("verify", "--store", uri)
    assert verified.returncode == 0, verified.stdout
    assert "2 sessions, 0 refused" in verified.stdout
