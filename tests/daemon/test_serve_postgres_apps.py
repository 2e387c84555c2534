"""App versions of sessions in PostgreSQL: ``loopd status`` names each one's App and
version (as its worker reports them, or as serve read them at start for one no worker
has run), the older-version count sees them, and ``loopd upgrade`` moves them (a real
server and serve)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.client import call
from tests.harness.postgres_server import PostgresServer
from tests.harness.support import loopd, running_daemon, status, wait_state
from worker.app import DEFAULT_APP
from worker.app.version import app_version

APP = '''
from worker.app import DefaultApp

version = {version!r}


class VersionedApp(DefaultApp):
    """The echo App; its module says which version it is."""
'''
TARGET = "vapp:VersionedApp"


@pytest.fixture(scope="module")
def server(postgres_server: PostgresServer) -> PostgresServer:
    return postgres_server


@pytest.fixture
def uri(server: PostgresServer) -> str:
    return server.new_database()


def _deploy(source: Path, version: str) -> None:
    # Each version string has its own length: a .pyc is trusted by source size and mtime.
    (source / "vapp.py").write_text(APP.format(version=version))


def _older(home: Path) -> dict[str, object]:
    found = call(str(home), "app_versions", timeout=60)
    assert isinstance(found, dict)
    return {row["session"]: row["older"] for row in found["sessions"]}


@pytest.mark.timeout(180)
def test_a_database_sessions_row_names_its_app_version_and_upgrade_moves_it(
    tmp_path: Path, uri: str
) -> None:
    source, home = tmp_path / "src", tmp_path / "home"
    source.mkdir()
    home.mkdir()
    _deploy(source, "1")
    (home / "loopd.toml").write_text(f'[apps.ver]\napp = "{TARGET}"\npath = [{str(source)!r}]\n')
    with running_daemon(home, "--store", uri):
        assert loopd("create", "--home", str(home), "s1", "--app", "ver").returncode == 0
        call(str(home), "send", session="s1", text="hello", key="k1")
        row = status(home, "s1")
        assert (row["app"], row["app_version"]) == (TARGET, "1")
        assert _older(home) == {"s1": False}
        _deploy(source, "2.0")
        assert _older(home) == {"s1": True}
        upgraded = loopd("upgrade", "--home", str(home))
        assert upgraded.returncode == 0, upgraded.stderr
        assert "upgraded  s1: version 1 -> 2.0, now in epoch 1" in upgraded.stdout
        row = status(home, "s1")
        assert (row["epoch"], row["app"], row["app_version"]) == (1, TARGET, "2.0")
        assert _older(home) == {"s1": False}


@pytest.mark.timeout(180)
def test_a_hibernated_database_session_and_a_fork_no_worker_ran_show_their_app_version(
    tmp_path: Path, uri: str
) -> None:
    home = tmp_path / "home"
    named = (DEFAULT_APP, app_version(DEFAULT_APP))
    with running_daemon(home, "--store", uri, "--budget", "30"):
        call(str(home), "create", session="a")
        for n in range(3):  # each request commits: epochs 0..2 sealed, 3 open
            call(str(home), "send", session="a", text="x" * 80, key=f"k{n}")
    done = loopd("fork", "a", "b", "--epoch", "1", "--store", uri)
    assert done.returncode == 0, done.stderr
    with running_daemon(home, "--store", uri, "--idle-stop", "60"):
        for session in ("a", "b"):  # resting: no worker has said anything yet
            row = wait_state(home, session, "IDLE")
            assert (row["pid"], row["app"], row["app_version"]) == (None, *named), session
        assert _older(home) == {"a": False, "b": False}
        again = call(str(home), "send", session="b", text="x" * 80, key="k1")
        assert isinstance(again, dict)
        assert (again["duplicate"], again["epoch"]) == (True, 1)  # from b's copied log
        row = wait_state(home, "b", "RUNNING")
        assert (row["epoch"], row["app"], row["app_version"]) == (2, *named)
