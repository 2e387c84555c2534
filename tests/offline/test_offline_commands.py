"""inspect, verify, repair and demo, run as an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import file_digests
from tests.harness.support import loopd
from worker import Assistant, Baseline, Session, User


def _session(home: Path, name: str, baseline: Baseline, epochs: int = 1) -> Path:
    with Session.create(home, name, baseline) as session:
        for n in range(epochs):
            session.append_many([User(text=f"u{n}", key=f"{name}-{n}"), Assistant(text="a")])
            if n < epochs - 1:
                session.commit_epoch(f"sum {n}", baseline)
        return Path(session.log_path)


def test_inspect_shows_epochs_counts_carry_and_next_call_as_json(
    home: Path, baseline: Baseline
) -> None:
    _session(home, "s1", baseline, epochs=2)
    shown = loopd("inspect", "--home", str(home), "s1", "--json")
    assert shown.returncode == 0, shown.stderr
    newest = json.loads(shown.stdout)
    assert [e["epoch"] for e in newest["epochs"]] == [1]  # what a worker's open reads
    shown = loopd("inspect", "--home", str(home), "s1", "--json", "--all")
    assert shown.returncode == 0, shown.stderr
    found = json.loads(shown.stdout)
    assert {k: v for k, v in found.items() if k != "epochs"} == {
        k: v for k, v in newest.items() if k != "epochs"
    }
    assert (found["epoch"], found["carry"], found["next_call"]) == (1, "sum 0", 1)
    assert found["epochs"][0]["counts"] == {
        "SessionStart": 1,
        "User": 1,
        "Assistant": 1,
        "EpochEnd": 1,
    }
    assert found["writer_live"] is False


def test_inspect_says_when_a_writer_is_live(home: Path, baseline: Baseline) -> None:
    _session(home, "s1", baseline)
    with Session.open(home, "s1"):
        shown = loopd("inspect", "--home", str(home), "s1")
    assert shown.returncode == 0, shown.stderr
    assert "writer     live" in shown.stdout


def test_inspect_and_verify_refuse_a_torn_log_with_path_line_and_change_nothing(
    home: Path, baseline: Baseline
) -> None:
    _session(home, "good", baseline)
    log = _session(home, "torn", baseline)
    log.write_bytes(log.read_bytes()[:-3])
    before = file_digests(home)
    shown = loopd("inspect", "--home", str(home), "torn")
    assert shown.returncode == 1
    assert shown.stderr.strip() == f"{log}:3: last line has no newline (torn write)"
    checked = loopd("verify", "--home", str(home))
    assert checked.returncode == 1
    assert f"REFUSED  torn  {log}:3:" in checked.stdout
    assert "ok       good" in checked.stdout
    assert file_digests(home) == before


def test_verify_checks_a_session_whose_id_ends_like_a_temporary_file(
    home: Path, baseline: Baseline
) -> None:
    log = _session(home, "nightly.tmp", baseline)
    log.write_bytes(log.read_bytes()[:-1])
    checked = loopd("verify", "--home", str(home))
    assert checked.returncode == 1
    assert f"REFUSED  nightly.tmp  {log}:3:" in checked.stdout


def test_verify_passes_a_home_of_clean_sessions(home: Path, baseline: Baseline) -> None:
    for name in ("a", "b"):
        _session(home, name, baseline, epochs=2)
    checked = loopd("verify", "--home", str(home))
    assert checked.returncode == 0, checked.stdout
    assert checked.stdout.splitlines()[-1] == "2 sessions, 0 refused"


def test_repair_moves_only_an_unterminated_last_line_into_quarantine(
    home: Path, baseline: Baseline
) -> None:
    log = _session(home, "s1", baseline)
    whole = log.read_bytes()
    log.write_bytes(whole + b'{"type":"User","te')
    repaired = loopd("repair", "--home", str(home), "s1")
    assert repaired.returncode == 0, repaired.stderr
    assert "moved 18 bytes (line 4, the damaged last group" in repaired.stdout
    assert log.read_bytes() == whole
    moved = list((home / "quarantine" / "s1").iterdir())
    assert len(moved) == 1
    assert moved[0].read_bytes() == b'{"type":"User","te'
    with Session.open(home, "s1") as session:
        assert len(session.records) == 3


@pytest.mark.parametrize("damage", ["middle-line", "clean", "locked"])
def test_repair_refuses_a_bad_middle_line_a_clean_log_and_a_held_session(
    home: Path, baseline: Baseline, damage: str
) -> None:
    log = _session(home, "s1", baseline)
    if damage == "middle-line":
        lines = log.read_bytes().splitlines(keepends=True)
        lines[1] = b"garbage\n"
        log.write_bytes(b"".join(lines) + b'{"type":"tail')
    before = file_digests(home)
    if damage == "locked":
        with Session.open(home, "s1"):
            repaired = loopd("repair", "--home", str(home), "s1")
        assert "stop its worker first" in repaired.stderr
    else:
        repaired = loopd("repair", "--home", str(home), "s1")
    assert repaired.returncode == 1
    if damage == "middle-line":
        assert f"{log}:2:" in repaired.stderr
        assert "never repaired in place" in repaired.stderr
    if damage == "clean":
        assert "nothing to repair" in repaired.stderr
    assert file_digests(home) == before
    assert not (home / "quarantine").exists()


def test_invalid_ids_get_a_clear_error_not_a_traceback(home: Path) -> None:
    (home / "sessions").mkdir(parents=True)
    shown = loopd("inspect", "--home", str(home), "../etc")
    assert shown.returncode == 1
    assert "invalid session id '../etc'" in shown.stderr
    assert "Traceback" not in shown.stderr


def _not_a_home(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A --home that is not a loopd home, and the reason the commands must give."""
    if kind == "missing":
        return tmp_path / "no-such-home", "no such directory"
    if kind == "file":
        path = tmp_path / "a-file"
        path.write_text("not a home\n")
        return path, "not a directory"
    path = tmp_path / "some-folder"
    (path / "other").mkdir(parents=True)
    return path, (
        f"not a loopd home (no sessions/ folder in it; `mkdir {path / 'sessions'}` makes an "
        "empty one, as `loopd serve` does)"
    )


@pytest.mark.parametrize("kind", ["missing", "file", "no-sessions-folder"])
def test_verify_of_a_missing_home_exits_non_zero_and_says_why(tmp_path: Path, kind: str) -> None:
    path, why = _not_a_home(tmp_path, kind)
    checked = loopd("verify", "--home", str(path))
    assert checked.returncode == 2
    assert checked.stderr == f"loopd verify: {path}: {why}\n"
    assert checked.stdout == ""


@pytest.mark.parametrize("command", ["inspect", "repair"])
@pytest.mark.parametrize("kind", ["missing", "file", "no-sessions-folder"])
def test_inspect_and_repair_of_a_missing_home_exit_non_zero_with_one_line_saying_why(
    tmp_path: Path, command: str, kind: str
) -> None:
    path, why = _not_a_home(tmp_path, kind)
    ran = loopd(command, "--home", str(path), "s1")
    assert ran.returncode == 2
    assert ran.stderr == f"loopd {command}: {path}: {why}\n"
    assert not (tmp_path / "no-such-home").exists()


def test_verify_of_an_empty_home_passes_with_zero_sessions(tmp_path: Path) -> None:
    (tmp_path / "home" / "sessions").mkdir(parents=True)
    checked = loopd("verify", "--home", str(tmp_path / "home"))
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == "0 sessions, 0 refused\n"
