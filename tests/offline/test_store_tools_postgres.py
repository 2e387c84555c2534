"""The offline tools on a PostgreSQL store: verify, inspect, and a backup moved both ways."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import psycopg
import pytest

from tests.harness.postgres_server import PostgresServer
from tests.harness.support import loopd
from worker import Baseline, Session, User
from worker.store.postgres import PostgresStore


@pytest.fixture(scope="module")
def server(postgres_server: PostgresServer) -> PostgresServer:
    return postgres_server


def _token(uri: str, session_id: str) -> int:
    with psycopg.connect(uri) as conn:
        row = conn.execute(
            "SELECT owner_token FROM loopd_sessions WHERE session = %s", (session_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_home_session_moves_to_the_database_and_back_verified_and_never_claimed(
    tmp_path: Path, server: PostgresServer
) -> None:
    uri = server.new_database()
    home = tmp_path / "home"
    (home / "sessions").mkdir(parents=True)
    baseline = Baseline(system="s", memory="", tools=[])
    with Session.create(str(home), "s1", baseline) as session:
        session.append(User(text="one", key="k1"))
        session.commit_epoch("a summary", baseline)
        session.append(User(text="two", key="k2"))
    done = loopd("backup", "--home", str(home), "s1", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    done = loopd("restore", "--store", uri, str(tmp_path / "out" / "s1"))
    assert done.returncode == 0, done.stderr
    assert "it verifies" in done.stdout
    token = _token(uri, "s1")
    done = loopd("verify", "--store", uri)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["ok       s1  epoch 1  records 2", "1 sessions, 0 refused"]
    done = loopd("inspect", "--store", uri, "s1", "--json", "--all")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["carry"] == "a summary"
    assert _token(uri, "s1") == token  # read, not claimed
    done = loopd("backup", "--store", uri, "s1", str(tmp_path / "back"))
    assert done.returncode == 0, done.stderr
    other = tmp_path / "other"
    (other / "sessions").mkdir(parents=True)
    done = loopd("restore", "--home", str(other), str(tmp_path / "back" / "s1"))
    assert done.returncode == 0, done.stderr
    for where in (home, other):
        assert (where / "sessions" / "s1" / "1.jsonl").read_bytes() == (
            home / "sessions" / "s1" / "1.jsonl"
        ).read_bytes()
    with Session.open(PostgresStore(uri), "s1") as moved:
        assert moved.find_key("k1") is not None
        assert moved.carry == "a summary"


def test_restore_into_the_store_refuses_a_session_already_there(
    tmp_path: Path, server: PostgresServer
) -> None:
    uri = server.new_database()
    Session.create(PostgresStore(uri), "s1", Baseline(system="s", memory="", tools=[])).close()
    done = loopd("backup", "--store", uri, "s1", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    done = loopd("restore", "--store", uri, str(tmp_path / "out" / "s1"))
    assert done.returncode == 1
    assert "s1" in done.stderr


def _sessions(uri: str) -> list[str]:
    with psycopg.connect(uri) as conn:
        return [str(row[0]) for row in conn.execute("SELECT session FROM loopd_sessions")]


def _tamper(backup: Path, name: str) -> None:
    """Change one byte of ``name`` in ``backup`` and write its manifest's digest anew (the
    manifest check passes; what the bytes load to does not)."""
    data = bytearray((backup / name).read_bytes())
    data[data.index(b'"text":"one"') + 9] ^= 1  # "one" -> "nne": its line's checksum fails
    (backup / name).write_bytes(bytes(data))
    manifest = json.loads((backup / "loopd-backup.json").read_text())
    for entry in manifest["files"]:
        if entry["name"] == name:
            entry["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    (backup / "loopd-backup.json").write_text(json.dumps(manifest))


def test_a_restore_into_the_store_that_would_not_load_writes_nothing(
    tmp_path: Path, server: PostgresServer
) -> None:
    uri = server.new_database()
    PostgresStore(uri).ensure_schema()
    home = tmp_path / "home"
    (home / "sessions").mkdir(parents=True)
    with Session.create(str(home), "s1", Baseline(system="s", memory="", tools=[])) as session:
        session.append(User(text="one", key="k1"))
    assert loopd("backup", "--home", str(home), "s1", str(tmp_path / "out")).returncode == 0
    backup = tmp_path / "out" / "s1"
    # Under another id: refused, naming the backup's own.
    done = loopd("restore", "--store", uri, str(backup), "other")
    assert done.returncode == 1
    assert "is a backup of session 's1', not 'other'" in done.stderr, done.stderr
    _tamper(backup, "0.jsonl")
    done = loopd("restore", "--store", uri, str(backup))
    assert done.returncode == 1
    assert "0.jsonl:2: checksum mismatch" in done.stderr, done.stderr
    assert _sessions(uri) == []  # nothing went in: a good backup restores after it
    (backup.parent / "s1").rename(tmp_path / "tampered")
    assert loopd("backup", "--home", str(home), "s1", str(tmp_path / "out")).returncode == 0
    done = loopd("restore", "--store", uri, str(backup))
    assert done.returncode == 0, done.stderr
    assert _sessions(uri) == ["s1"]


@pytest.mark.parametrize("command", ["backup", "restore", "verify"])
def test_a_malformed_store_uri_is_one_line_not_a_traceback(tmp_path: Path, command: str) -> None:
    uri = "postgresql://x/y?bogus=1"
    args = {"backup": ["s1", str(tmp_path / "d")], "restore": [str(tmp_path)], "verify": []}
    (tmp_path / "loopd-backup.json").write_text("{}")
    done = loopd(command, "--store", uri, *args[command])
    assert done.returncode in (1, 2), done
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
