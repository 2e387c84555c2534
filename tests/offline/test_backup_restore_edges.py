"""Backups without a worker, restores that must replace nothing, repair's report: the edges."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from supervisor.client.direct import Client
from tests.harness.forge import flip_line
from tests.harness.keyed_sessions import keyed_session
from tests.harness.named_app_homes import home_with_apps
from tests.harness.support import (
    log_user_keys,
    loopd,
    running_daemon,
)
from worker import Session


def _ok(*args: str) -> str:
    done = loopd(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def test_repair_names_the_keys_it_moves_and_says_never_acknowledged_only_of_a_crash(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    log = keyed_session(home, "s1", pairs=5) / "0.jsonl"
    lines = log.read_bytes().split(b"\n")
    kept = sum(len(line) + 1 for line in lines[:8])  # through the User of the 4th request
    log.write_bytes(log.read_bytes()[: kept + 10])  # its Assistant cut mid-line
    said = _ok("repair", "--home", str(home), "s1")
    assert "(lines 8-9, the damaged last group)" in said
    assert "never acknowledged" not in said
    assert "line 8: User part 1 of 2 key=s1-0-3" in said
    assert "keys moved: s1-0-3" in said
    assert "if the damage came from a crash, none of it was acknowledged" in said
    assert "if it did not, acknowledged work may be among it" in said
    assert log_user_keys(home, "s1") == ["s1-0-0", "s1-0-1", "s1-0-2"]


def test_a_backup_of_sessions_no_worker_runs_cuts_at_the_last_whole_group_and_says_so(
    tmp_path: Path,
) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    keyed_session(home, "a", epochs=2)
    torn = keyed_session(home, "b") / "0.jsonl"
    whole = torn.read_bytes()
    with torn.open("ab") as f:
        f.write(b'{"type":"User","ti')
    (home / "sessions" / "bad id").mkdir()  # not a session: the others are backed up
    some = loopd("backup", "--home", str(home), "--all", str(dest))
    assert some.returncode == 1
    assert "loopd backup: bad id: invalid session id" in some.stderr
    assert "not backed up: 1 of the sessions (each named above)" in some.stderr
    (home / "sessions" / "bad id").rmdir()
    said = some.stdout
    assert "backed up a to" in said
    assert "its last whole group: no worker runs it" in said
    assert "the 18 bytes after it (a torn tail?) are not copied" in said
    assert (dest / "b" / "0.jsonl").read_bytes() == whole
    again = loopd("backup", "--home", str(home), "a", str(dest))
    assert again.returncode == 1
    assert f"{dest / 'a'}: already exists" in again.stderr
    other = tmp_path / "other"
    (other / "sessions").mkdir(parents=True)
    _ok("restore", "--home", str(other), str(dest), "a")
    _ok("restore", "--home", str(other), str(dest / "b"))
    assert "2 sessions, 0 refused" in _ok("verify", "--home", str(other))


def test_a_session_of_a_named_app_deleted_and_restored_runs_that_app_again(
    tmp_path: Path,
) -> None:
    home, _work = home_with_apps(tmp_path)
    dest = tmp_path / "backups"
    with running_daemon(home):
        _ok("create", "--home", str(home), "agent", "--app", "tagged")
        _ok("send", "--home", str(home), "agent", "hello", "--key", "k1")
        _ok("backup", "--home", str(home), "agent", str(dest))
        assert json.loads((dest / "agent" / "loopd-backup.json").read_text())["app"] == "tagged"
        _ok("delete", "--home", str(home), "agent")
        assert "agent" not in (home / "intent.json").read_text()
        _ok("restore", "--home", str(home), str(dest / "agent"))
        _ok("start", "--home", str(home), "agent")
        with Client(str(home)) as client:
            reply = client.send("agent", "again", key="k2")
    assert reply["tag"] == "blue"
    assert '"apps":{"agent":"tagged"}' in (home / "intent.json").read_text()


def test_a_backup_without_a_worker_refuses_damage_with_whole_groups_after_it(
    tmp_path: Path,
) -> None:
    """Only a torn last group may be left out; damage with acknowledged groups after it
    would make a copy that verifies without them."""
    home, dest = tmp_path / "home", tmp_path / "backups"
    log = keyed_session(home, "s", pairs=4) / "0.jsonl"
    flip_line(log, 3)  # the first group's last line; three whole groups follow
    before = log.read_bytes()
    done = loopd("backup", "--home", str(home), "s", str(dest))
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{log}: damaged at line 2" in done.stderr  # the first group starts there
    assert "more than a torn last group follows" in done.stderr
    assert "Nothing was copied" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (dest / "s").exists()
    assert log.read_bytes() == before


def test_a_restore_that_would_not_open_replaces_nothing_even_with_force(tmp_path: Path) -> None:
    """The copy is checked where it is staged: a healthy session is not moved to the trash
    for one that is refused, whatever its manifest says."""
    home, dest = tmp_path / "home", tmp_path / "backups"
    keyed_session(home, "s")
    _ok("backup", "--home", str(home), "s", str(dest))
    log = dest / "s" / "0.jsonl"
    log.write_bytes(log.read_bytes().replace(b"topic 0 1", b"topic 0 X"))  # the CRC breaks
    manifest_path = dest / "s" / "loopd-backup.json"
    manifest = json.loads(manifest_path.read_text())
    for entry in manifest["files"]:  # a manifest made to match the damage
        data = (dest / "s" / entry["name"]).read_bytes()
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    manifest_path.write_text(json.dumps(manifest))
    live = home / "sessions" / "s" / "0.jsonl"
    before = live.read_bytes()
    done = loopd("restore", "--home", str(home), str(dest / "s"), "--force")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not open as a session" in done.stderr
    assert "checksum mismatch" in done.stderr
    assert "nothing was replaced" in done.stderr
    assert live.read_bytes() == before
    assert not any(p.name.startswith("s.") and p.is_dir() and p.suffix != ".refused"
                   for p in (home / "trash").iterdir())  # fmt: skip
    assert "1 sessions, 0 refused" in _ok("verify", "--home", str(home))


def test_a_restore_over_a_session_a_writer_holds_is_refused_and_leaves_no_staged_copy(
    tmp_path: Path,
) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    keyed_session(home, "s")
    _ok("backup", "--home", str(home), "s", str(dest))
    with Session.open(home, "s"):  # a writer outside any daemon holds the lock
        done = loopd("restore", "--home", str(home), str(dest / "s"), "--force")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "locked" in done.stderr, done.stderr
    assert not (home / "trash").exists() or not list((home / "trash").iterdir())
    assert "1 sessions, 0 refused" in _ok("verify", "--home", str(home))


def test_a_backup_listing_a_database_sessions_scan_summary_restores_without_it(
    tmp_path: Path,
) -> None:
    """A backup of a database session taken by a loopd from before its summary was kept
    there lists the summary's row as a file, loopd.scan: checked, never restored."""
    home, dest, other = tmp_path / "home", tmp_path / "backups", tmp_path / "other"
    keyed_session(home, "s")
    _ok("backup", "--home", str(home), "s", str(dest))
    summary = b"loopdscan\n not a summary this loopd would take"
    (dest / "s" / "loopd.scan").write_bytes(summary)
    manifest_path = dest / "s" / "loopd-backup.json"
    manifest = json.loads(manifest_path.read_text())
    entry = {"name": "loopd.scan", "bytes": len(summary)}
    manifest["files"].append({**entry, "sha256": hashlib.sha256(summary).hexdigest()})
    manifest_path.write_text(json.dumps(manifest))
    (other / "sessions").mkdir(parents=True)
    _ok("restore", "--home", str(other), str(dest / "s"))
    assert not (other / "sessions" / "s" / "loopd.scan").exists()
    assert log_user_keys(other, "s") == log_user_keys(home, "s")
    assert "1 sessions, 0 refused" in _ok("verify", "--home", str(other))
    # Damaged, it is refused as any listed file is.
    (dest / "s" / "loopd.scan").write_bytes(summary + b"!")
    (tmp_path / "third" / "sessions").mkdir(parents=True)
    done = loopd("restore", "--home", str(tmp_path / "third"), str(dest / "s"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not match the manifest" in done.stderr


def test_a_restore_of_a_session_whose_app_the_home_does_not_name_restores_nothing(
    tmp_path: Path,
) -> None:
    """Restored anyway, it made every later serve of the home refuse to start (no daemon
    running), or ran under the default App after a restart (a daemon running)."""
    home, _work = home_with_apps(tmp_path)
    dest = tmp_path / "backups"
    with running_daemon(home):
        _ok("create", "--home", str(home), "agent", "--app", "tagged")
        _ok("send", "--home", str(home), "agent", "hello", "--key", "k1")
        _ok("backup", "--home", str(home), "agent", str(dest))
    other = tmp_path / "other"
    (other / "sessions").mkdir(parents=True)
    for daemon in (False, True):
        if daemon:
            with running_daemon(other):
                done = loopd("restore", "--home", str(other), str(dest / "agent"))
        else:
            done = loopd("restore", "--home", str(other), str(dest / "agent"))
        assert done.returncode == 1, done.stdout
        assert "runs App 'tagged', which loopd.toml's [apps] does not name" in done.stderr
        assert "nothing was restored" in done.stderr
        assert list((other / "sessions").iterdir()) == []
        assert (
            not (other / "intent.json").exists()
            or "agent" not in (other / "intent.json").read_text()
        )
    (other / "loopd.toml").write_text((home / "loopd.toml").read_text())
    _ok("restore", "--home", str(other), str(dest / "agent"))
    with running_daemon(other):  # the App named: served under it
        _ok("start", "--home", str(other), "agent")
        with Client(str(other)) as client:
            assert client.send("agent", "again", key="k2")["tag"] == "blue"


def test_two_restores_at_once_without_force_never_replace_one_another(tmp_path: Path) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    keyed_session(home, "s2", pairs=3)
    _ok("backup", "--home", str(home), "s2", str(dest))
    for round_ in range(6):
        other = tmp_path / f"other{round_}"
        (other / "sessions").mkdir(parents=True)
        argv = [sys.executable, "-m", "supervisor", "restore", "--home", str(other),
                str(dest / "s2")]  # fmt: skip
        both = [
            subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                stdin=subprocess.DEVNULL,
            )
            for _ in range(2)
        ]
        done = [(proc.wait(timeout=120), *proc.communicate()) for proc in both]
        assert sorted(code for code, _out, _err in done) == [0, 1], done
        said = "".join(out + err for _code, out, err in done)
        assert "moved the session that was there" not in said, said
        assert not list((other / "trash").glob("s2.*[0-9]")), said  # nothing replaced
        assert "1 sessions, 0 refused" in _ok("verify", "--home", str(other))


def test_a_backup_into_a_file_and_a_refused_staged_copy_are_named_as_they_are(
    tmp_path: Path,
) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    log = keyed_session(home, "s3", pairs=3) / "0.jsonl"
    (tmp_path / "a-file").write_text("")
    done = loopd("backup", "--home", str(home), "s3", str(tmp_path / "a-file"))
    assert done.returncode == 1
    assert done.stderr == (
        f"loopd backup: {tmp_path / 'a-file'}: not a directory (DEST is the folder the "
        "backup of ID goes in)\n"
    )
    _ok("backup", "--home", str(home), "s3", str(dest))
    copy = dest / "s3" / "0.jsonl"
    flip_line(copy, 3)
    manifest = json.loads((dest / "s3" / "loopd-backup.json").read_text())
    for entry in manifest["files"]:
        if entry["name"] == "0.jsonl":
            entry["sha256"] = hashlib.sha256(copy.read_bytes()).hexdigest()
    (dest / "s3" / "loopd-backup.json").write_text(json.dumps(manifest))
    other = tmp_path / "other"
    (other / "sessions").mkdir(parents=True)
    done = loopd("restore", "--home", str(other), str(dest / "s3"))
    assert done.returncode == 1
    kept = next((other / "trash").glob("s3.*.refused"))
    assert f"({kept / '0.jsonl'}:3: " in done.stderr, done.stderr
    assert ".restoring" not in done.stderr
    assert log.exists()


def test_a_rerun_after_a_restore_cut_short_past_its_rename_says_serve_does_not_list_it(
    tmp_path: Path,
) -> None:
    home, dest = tmp_path / "home", tmp_path / "backups"
    keyed_session(home, "s4", pairs=2)
    _ok("backup", "--home", str(home), "s4", str(dest))
    other = tmp_path / "other"
    (other / "sessions").mkdir(parents=True)
    with running_daemon(other):
        # What a restore killed right after its rename leaves: the session's files in
        # place, which the running serve was never told of.
        (other / "sessions" / "s4").mkdir()
        for name in json.loads((dest / "s4" / "loopd-backup.json").read_text())["files"]:
            data = (dest / "s4" / name["name"]).read_bytes()
            (other / "sessions" / "s4" / name["name"]).write_bytes(data)
        done = loopd("restore", "--home", str(other), str(dest / "s4"))
        assert done.returncode == 1
        assert "serve does not list it (a restore cut short after its rename?)" in done.stderr
        assert "`loopd restore --force` replaces it" in done.stderr
        _ok("restore", "--home", str(other), "--force", str(dest / "s4"))
        _ok("start", "--home", str(other), "s4")
