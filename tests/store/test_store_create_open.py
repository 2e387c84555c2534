"""create and open: the files they write, the ids they refuse, what open loads."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from worker import (
    Assistant,
    Baseline,
    InvalidSessionId,
    Record,
    Session,
    SessionExists,
    SessionNotFound,
    SessionStart,
    ToolResult,
    Usage,
    User,
)


def test_create_writes_baseline_and_a_log_holding_only_session_start(
    home: Path, baseline: Baseline
) -> None:
    with Session.create(home, "s1", baseline, slot=4) as session:
        directory = Path(session.dir)
    assert sorted(os.listdir(directory)) == ["0.baseline.json", "0.jsonl"]
    baseline_bytes = (directory / "0.baseline.json").read_bytes()
    assert baseline_bytes == baseline.to_json()
    lines = (directory / "0.jsonl").read_bytes().splitlines(keepends=True)
    assert len(lines) == 1
    assert lines[0].startswith(b'{"type":"SessionStart",')
    assert lines[0].endswith(b"}\n")
    start = json.loads(lines[0])
    assert start["epoch"] == 0
    assert start["slot"] == 4
    assert start["session"] == "s1"
    assert start["baseline"] == hashlib.sha256(baseline_bytes).hexdigest()


def test_baseline_bytes_are_canonical_sorted_compact_utf8_with_newline() -> None:
    b = Baseline(system="é", memory="m", tools=[{"z": 1, "a": [2]}])
    assert b.to_json() == '{"memory":"m","system":"é","tools":[{"a":[2],"z":1}]}\n'.encode()
    assert b.hash() == hashlib.sha256(b.to_json()).hexdigest()


def test_create_on_an_existing_session_raises_session_exists(
    home: Path, baseline: Baseline
) -> None:
    Session.create(home, "s1", baseline).close()
    with pytest.raises(SessionExists, match="already exists"):
        Session.create(home, "s1", baseline)


def test_create_on_an_existing_empty_directory_raises_session_exists(
    home: Path, baseline: Baseline
) -> None:
    (home / "sessions" / "s1").mkdir(parents=True)
    with pytest.raises(SessionExists):
        Session.create(home, "s1", baseline)


def test_open_without_a_first_log_raises_session_not_found(home: Path, baseline: Baseline) -> None:
    with pytest.raises(SessionNotFound):
        Session.open(home, "nobody")
    (home / "sessions" / "empty").mkdir(parents=True)
    with pytest.raises(SessionNotFound, match=r"no 0\.jsonl"):
        Session.open(home, "empty")


def test_open_or_create_finishes_a_create_cut_short_before_its_log(
    home: Path, baseline: Baseline
) -> None:
    directory = home / "sessions" / "s1"
    directory.mkdir(parents=True)
    (directory / "0.baseline.json.tmp").write_bytes(b"{half")
    with Session.open_or_create(home, "s1", baseline, slot=2) as session:
        assert session.epoch == 0
        assert session.slot == 2
    with Session.open(home, "s1") as session:
        assert len(session.records) == 1


@pytest.mark.parametrize(
    "bad_id",
    ["", "../x", "/abs", "a/b", "x\x00y", ".hidden", "-flag", "a" * 65, "sp ace", "ünï", "a\n"],
    ids=[
        "empty",
        "dotdot",
        "absolute",
        "slash",
        "nul",
        "dot",
        "dash",
        "too-long",
        "space",
        "non-ascii",
        "newline",
    ],
)
def test_invalid_ids_are_refused_before_any_path_is_touched(
    tmp_path: Path, baseline: Baseline, bad_id: str
) -> None:
    home = tmp_path / "home"
    with pytest.raises(InvalidSessionId):
        Session.create(home, bad_id, baseline)
    with pytest.raises(InvalidSessionId):
        Session.open(home, bad_id)
    assert not home.exists()


def test_ids_of_64_allowed_characters_are_accepted(home: Path, baseline: Baseline) -> None:
    session_id = "A_z.9-" + "x" * 58
    Session.create(home, session_id, baseline).close()
    with Session.open(home, session_id) as session:
        assert session.id == session_id


def test_appended_records_come_back_equal_after_reopen(home: Path, baseline: Baseline) -> None:
    written: list[Record] = [
        User(text="hi", untrusted=True, key="k1"),
        ToolResult(call=1, tool="echo", output="hi", ok=True),
        Assistant(text="hello\nworld \u2603"),
        Usage(prompt_tokens=3, completion_tokens=4, context_tokens=7),
    ]
    with Session.create(home, "s1", baseline) as session:
        session.append(written[0])
        session.append_many(written[1:])
        in_memory = list(session.records)
    with Session.open(home, "s1") as session:
        assert list(session.records) == in_memory
        assert list(session.records)[1:] == written
        assert isinstance(session.records[0], SessionStart)
        assert session.baseline == baseline
        assert session.carry is None
