"""Damage that is not a crash, through the CLI on a real home: the FATAL hint of each kind,
backup and restore, salvage, rebuilding epoch 0's baseline, delete and forget."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from supervisor.client.direct import Client
from tests.harness.forge import flip_line
from tests.harness.keyed_sessions import keyed_session
from tests.harness.support import (
    log_user_keys,
    loopd,
    poll_until,
    running_daemon,
    status,
    wait_state,
)
from worker import Baseline, Session


def test_each_kind_of_refusal_gets_its_own_next_step_and_status_drops_its_counts(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    torn = keyed_session(home, "torn")
    with (torn / "0.jsonl").open("ab") as f:
        f.write(b'{"type":"User","ti')
    flip_line(keyed_session(home, "mid") / "0.jsonl", 3)
    sealed = keyed_session(home, "sealed", epochs=2)
    data = (sealed / "0.jsonl").read_bytes()
    (sealed / "0.jsonl").write_bytes(data[:-2] + b"!\n")  # its EpochEnd, the line open reads
    (keyed_session(home, "nobase") / "0.baseline.json").unlink()
    expected = {
        "torn": ("0.jsonl:8: ", "`loopd repair --home"),
        "mid": ("0.jsonl:3: ", "or keep its intact prefix with `loopd salvage --home"),
        "sealed": ("0.jsonl:8: ", "damage in a sealed epoch's log. Next: restore"),
        "nobase": ("0.baseline.json: baseline file is missing", "--rebuild-baseline"),
    }
    with running_daemon(home):
        for name, (where, step) in expected.items():
            row = wait_state(home, name, "FATAL")
            error = str(row["last_error"])
            assert where in error, error
            assert step in error, error
            assert (row["epoch"], row["records"]) == (None, None), row
            others = {s for n, (_w, s) in expected.items() if n != name}
            assert not any(other in error for other in others), error


def _ok(*args: str) -> str:
    done = loopd(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_delete_moves_the_directory_to_trash_and_the_daemon_forgets_it_without_a_restart(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    with running_daemon(home) as daemon:
        _ok("create", "--home", str(home), "s1")
        _ok("send", "--home", str(home), "s1", "hello", "--key", "k1")
        _ok("stop", "--home", str(home), "s1")  # its intent says stopped
        _ok("start", "--home", str(home), "s1")
        (home / "logs" / "s1.log.7").write_bytes(b"an older backup of its output\n")
        assert (home / "logs" / "s1.log").exists()  # the worker wrote its start line
        said = _ok("delete", "--home", str(home), "s1")
        assert "the daemon no longer lists it" in said
        assert not (home / "sessions" / "s1").exists()
        [moved, logs] = sorted((home / "trash").iterdir())
        assert moved.name.startswith("s1.")
        assert b'"key":"k1"' in (moved / "0.jsonl").read_bytes()
        # Its output log and backups follow it: a session created again logs anew.
        assert logs.name == moved.name + ".logs"
        assert sorted(p.name for p in logs.iterdir()) == ["s1.log", "s1.log.7"]
        assert not list((home / "logs").glob("s1.log*"))
        assert f"to {logs}" in said
        gone = loopd("status", "--home", str(home), "s1")
        assert gone.returncode == 1
        assert "no session 's1'" in gone.stderr
        assert daemon.proc.poll() is None
        _ok("create", "--home", str(home), "s1")  # the id is free again
        assert wait_state(home, "s1", "RUNNING")["records"] == 1
        _ok("stop", "--home", str(home), "s1")
        # A directory moved aside by hand: forget refuses while it is there, then forgets.
        refused = loopd("forget", "--home", str(home), "s1")
        assert refused.returncode == 1
        assert "is still there" in refused.stderr
        (home / "sessions" / "s1").rename(tmp_path / "aside")
        _ok("forget", "--home", str(home), "s1")
        assert loopd("status", "--home", str(home), "s1").returncode == 1
        again = _ok("forget", "--home", str(home), "s1")  # listed no more: says so
        assert "nothing to forget: the daemon lists no session s1" in again
        _ok("create", "--home", str(home), "s1")
    assert "s1" not in (home / "intent.json").read_text()


def test_delete_and_forget_without_a_daemon_work_on_the_files_and_the_intent(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    keyed_session(home, "s1")
    keyed_session(home, "s2")
    (home / "intent.json").write_text('{"stopped":["s1","s2"],"apps":{"s1":"x"}}\n')
    with Session.open(home, "s1"):  # a writer holds it: nothing moves
        held = loopd("delete", "--home", str(home), "s1")
    assert held.returncode == 1
    assert "session is locked by process" in held.stderr
    assert (home / "sessions" / "s1" / "0.jsonl").exists()
    said = _ok("delete", "--home", str(home), "s1")
    assert "no daemon runs" in said
    assert not (home / "sessions" / "s1").exists()
    assert (home / "intent.json").read_text() == '{"stopped":["s2"]}\n'
    (home / "sessions" / "s2").rename(tmp_path / "aside")
    _ok("forget", "--home", str(home), "s2")
    assert (home / "intent.json").read_text() == '{"stopped":[]}\n'


def _keyed_load(home: Path, acked: list[str], stop: threading.Event) -> None:
    """Send keyed requests one after another; a key is acknowledged once its reply came."""
    with Client(str(home), timeout=30, retry_for=30) as client:
        n = 0
        while not stop.is_set():
            key = f"k{n}"
            client.send("s1", f"topic {n} " + "x" * 200, key=key)  # retried under its key
            acked.append(key)
            n += 1


@pytest.mark.timeout(100)
def test_a_backup_under_keyed_load_and_worker_kills_restores_every_acknowledged_key(
    tmp_path: Path,
) -> None:
    home, other = tmp_path / "home", tmp_path / "other"
    (other / "sessions").mkdir(parents=True)
    dest = tmp_path / "backups"
    serve = ("--max-restarts", "1000", "--start-retries", "1000", "--backoff-base", "0.01",
             "--backoff-max", "0.05")  # fmt: skip
    with running_daemon(home, *serve, "--budget", "2000"):
        _ok("create", "--home", str(home), "s1")
        acked: list[str] = []
        stop = threading.Event()
        load = threading.Thread(target=_keyed_load, args=(home, acked, stop))
        load.start()
        try:
            poll_until(lambda: len(acked) >= 40, what="40 acknowledged keys")
            before = list(acked)  # every key acknowledged before the backup begins
            command = ("backup", "--home", str(home), "s1", str(dest))
            taker = subprocess.Popen(
                [sys.executable, "-m", "supervisor", *command],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            kills = 0
            killed: set[object] = set()
            while taker.poll() is None and kills < 3:  # each new worker killed once
                pid = status(home, "s1")["pid"]
                if isinstance(pid, int) and pid not in killed:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                    kills += 1
                time.sleep(0.005)  # spaces the status calls out
            out, err = taker.communicate(timeout=60)
        finally:
            stop.set()
            load.join(timeout=60)
        assert taker.returncode == 0, (out, err)
        assert kills >= 1
        assert "a group boundary its worker named" in out
        assert len(acked) > len(before)  # the load went on during the backup
    epochs = len(list((dest / "s1").glob("*.jsonl")))
    assert epochs > 1, "the budget should have made the session commit epochs"
    _ok("restore", "--home", str(other), str(dest / "s1"))
    assert "0 refused" in _ok("verify", "--home", str(other))
    restored = set(log_user_keys(other, "s1"))
    assert set(before) <= restored


def test_restore_checks_the_manifest_first_and_replaces_a_live_session_only_with_force(
    tmp_path: Path,
) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    with running_daemon(home):
        _ok("create", "--home", str(home), "s1")
        _ok("send", "--home", str(home), "s1", "one", "--key", "k1")
        assert "backed up s1" in _ok("backup", "--home", str(home), "--all", str(dest))
        _ok("send", "--home", str(home), "s1", "two", "--key", "k2")
        copy = dest / "s1" / "0.jsonl"
        good = copy.read_bytes()
        copy.write_bytes(good.replace(b'"one"', b'"One"'))
        damaged = loopd("restore", "--home", str(home), str(dest), "s1", "--force")
        assert damaged.returncode == 1
        assert f"{copy}: does not match the manifest" in damaged.stderr
        copy.write_bytes(good)
        live = loopd("restore", "--home", str(home), str(dest), "s1")
        assert live.returncode == 1
        assert "session s1 is RUNNING; --force stops it" in live.stderr
        assert log_user_keys(home, "s1") == ["k1", "k2"]  # nothing changed
        listed = loopd("restore", "--home", str(home), str(dest), "s1", "--force")
        assert listed.returncode == 1  # k2 was acknowledged after the backup: it says so
        assert listed.stdout == "k2\n"
        token = listed.stderr.rsplit(" ", 1)[-1].strip()
        said = _ok("restore", "--home", str(home), str(dest), "s1", "--force", "--dropping", token)
        assert "records (1 key) acknowledged after the backup's point" in said
        assert "moved the session that was there to" in said
        assert "it verifies" in said
        [old] = (home / "trash").glob("s1.*Z")
        assert b'"key":"k2"' in (old / "0.jsonl").read_bytes()
        assert log_user_keys(home, "s1") == ["k1"]
        _ok("start", "--home", str(home), "s1")
        assert wait_state(home, "s1", "RUNNING")["records"] == len(good.splitlines())
        # Deleted, then restored while the daemon runs: it lists the session again.
        _ok("delete", "--home", str(home), "s1")
        _ok("restore", "--home", str(home), str(dest / "s1"))
        assert status(home, "s1")["state"] == "STOPPED"
        _ok("start", "--home", str(home), "s1")
        assert wait_state(home, "s1", "RUNNING")["records"] == len(good.splitlines())


def test_salvage_keeps_the_prefix_before_mid_file_damage_and_says_what_it_cut(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    log = keyed_session(home, "s1", pairs=5) / "0.jsonl"
    original = log.read_bytes()
    flip_line(log, 5)  # the Assistant of the second request: damage mid-file
    damaged = log.read_bytes()
    refused = loopd("repair", "--home", str(home), "s1")
    assert refused.returncode == 1
    assert f"{log}:4:" in refused.stderr
    assert "or keep the prefix that opens with loopd salvage" in refused.stderr
    said = _ok("salvage", "--home", str(home), "s1")
    assert f"the session was refused: {log}:5:" in said
    assert "CUT epoch 0, its lines after the prefix: lines 4-11 (8 lines)" in said
    assert "line 4: User key=s1-0-1" in said
    assert "line 5: undecodable" in said
    assert "keys cut (4): s1-0-1, s1-0-2, s1-0-3, s1-0-4 (and those of 1 undecodable" in said
    assert "acknowledged work may be among what was cut" in said
    assert "unless the damage is a torn last group a crash left" in said
    assert "kept: epoch 0, the last up to byte" in said
    kept = original.split(b"\n", 3)
    assert log.read_bytes() == b"\n".join(kept[:3]) + b"\n"
    [moved] = (home / "quarantine" / "s1").glob("*-salvage/0.jsonl.cut")
    assert log.read_bytes() + moved.read_bytes() == damaged  # nothing lost
    assert "0 refused" in _ok("verify", "--home", str(home))
    with running_daemon(home):
        assert wait_state(home, "s1", "RUNNING")["records"] == 3
    again = loopd("salvage", "--home", str(home), "s1")
    assert again.returncode == 1
    assert "opens cleanly: nothing to salvage" in again.stderr


def test_salvage_of_a_sealed_epoch_cuts_it_and_moves_every_later_epoch_whole(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    directory = keyed_session(home, "s1", epochs=3, pairs=2)
    sealed = directory / "1.jsonl"
    flip_line(sealed, 4)  # the second request of epoch 1
    assert loopd("verify", "--home", str(home)).returncode == 1
    said = _ok("salvage", "--home", str(home), "s1")
    assert f"the session was refused: {sealed}:4:" in said
    assert "kept: epochs 0-1, the last up to byte" in said
    assert "CUT epoch 1, its lines after the prefix: lines 4-6" in said
    assert "CUT epoch 2, the whole epoch: lines 1-5" in said
    assert "line 4: undecodable" in said
    assert "keys cut (2): s1-2-0, s1-2-1" in said
    assert not (directory / "2.jsonl").exists()
    [target] = (home / "quarantine" / "s1").glob("*-salvage")
    assert {p.name for p in target.iterdir()} >= {"2.jsonl", "2.baseline.json", "1.jsonl.cut"}
    assert "0 refused" in _ok("verify", "--home", str(home))
    assert log_user_keys(home, "s1") == ["s1-0-0", "s1-0-1", "s1-1-0"]
    assert "0 refused" in _ok("verify", "--home", str(home))
    with running_daemon(home):
        assert wait_state(home, "s1", "RUNNING")["epoch"] == 1


def test_a_deleted_epoch_0_baseline_is_rebuilt_when_its_hash_matches_and_refused_when_not(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    directory = keyed_session(home, "s1")
    baseline = directory / "0.baseline.json"
    original = baseline.read_bytes()
    baseline.unlink()
    assert loopd("verify", "--home", str(home)).returncode == 1
    plain = loopd("repair", "--home", str(home), "s1")  # repair alone does not do it
    assert plain.returncode == 1
    said = _ok("repair", "--rebuild-baseline", "--home", str(home), "s1")
    assert f"rebuilt {baseline} from worker.app:DefaultApp" in said
    assert "the session opens cleanly" in said
    assert baseline.read_bytes() == original
    assert "0 refused" in _ok("verify", "--home", str(home))
    again = loopd("repair", "--rebuild-baseline", "--home", str(home), "s1")
    assert again.returncode == 1
    assert "nothing to rebuild" in again.stderr
    # A session created with another baseline: the App's does not hash to it.
    with Session.create(home, "s2", Baseline(system="not the default App's", memory="")):
        pass
    other = home / "sessions" / "s2" / "0.baseline.json"
    other.unlink()
    refused = loopd("repair", "--rebuild-baseline", "--home", str(home), "s2")
    assert refused.returncode == 1
    assert f"{other}: the App's initial baseline hashes to " in refused.stderr
    assert "not the baseline this session was created with" in refused.stderr
    assert not other.exists()
    bad = loopd("repair", "--rebuild-baseline", "--app", "no.such:app", "--home", str(home), "s2")
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert "--app no.such:app: ModuleNotFoundError" in bad.stderr


def test_status_shows_no_counts_for_a_session_refused_after_it_ran(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with running_daemon(home):
        _ok("create", "--home", str(home), "s1")
        for n in range(3):
            _ok("send", "--home", str(home), "s1", f"topic {n}", "--key", f"k{n}")
        row = wait_state(home, "s1", "RUNNING")
        assert isinstance(row["records"], int)
        assert row["records"] > 3
        flip_line(home / "sessions" / "s1" / "0.jsonl", 3)  # damage no crash made
        assert isinstance(row["pid"], int)
        os.kill(row["pid"], signal.SIGKILL)  # the restart finds the log refused
        refused = wait_state(home, "s1", "FATAL")
        assert (refused["epoch"], refused["records"]) == (None, None), refused
        assert "or keep its intact prefix with `loopd salvage" in str(refused["last_error"])
        listed = _ok("status", "--home", str(home))
        assert "FATAL" in listed
