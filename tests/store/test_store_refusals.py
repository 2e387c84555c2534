"""open refuses torn and invalid logs with path:line: why, and changes no byte."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import file_digests
from tests.harness.forge import reseal
from worker import (
    Assistant,
    Baseline,
    BaselineError,
    InvalidLog,
    LogError,
    Session,
    SessionError,
    TornLog,
    User,
)

T = "2026-11-29T20:17:57.123456Z"


def _make(home: Path, baseline: Baseline, epochs: int = 1) -> Path:
    """A session with ``epochs`` epochs, each holding a User and an Assistant."""
    with Session.create(home, "s1", baseline) as session:
        for n in range(epochs):
            session.append_many([User(text=f"u{n}"), Assistant(text=f"a{n}")])
            if n < epochs - 1:
                session.commit_epoch(f"summary {n}", baseline)
        return Path(session.dir)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _refused(
    home: Path, directory: Path, error: type[LogError], path: Path, *, line: int, why: str
) -> None:
    before = file_digests(directory)
    with pytest.raises(error, match=why) as caught:
        Session.open(home, "s1")
    assert caught.value.path == str(path)
    assert caught.value.line == line
    assert str(caught.value) == f"{path}:{line}: {caught.value.why}"
    assert file_digests(directory) == before


def test_a_last_line_without_newline_is_refused_as_torn_with_its_path_and_line(
    home: Path, baseline: Baseline
) -> None:
    directory = _make(home, baseline)
    log = directory / "0.jsonl"
    log.write_bytes(log.read_bytes()[:-1])
    _refused(home, directory, TornLog, log, line=3, why="no newline")


def test_an_unparsable_line_in_the_middle_is_refused_with_its_line_number(
    home: Path, baseline: Baseline
) -> None:
    directory = _make(home, baseline)
    log = directory / "0.jsonl"
    lines = _lines(log)
    lines[1] = lines[1][:20] + b"\xff garbage\n"
    log.write_bytes(b"".join(lines))
    _refused(home, directory, TornLog, log, line=2, why="undecodable record")


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"type":"Nope","time":"' + T.encode() + b'"}\n', "unknown record type"),
        (b'{"type":"Assistant","time":"' + T.encode() + b'"}\n', "missing text"),
        (b'{"type":"Assistant","time":"t","text":"x","extra":1}\n', "unknown 'extra'"),
        (
            b'{"type":"Usage","time":"t","prompt_tokens":1.5,"completion_tokens":1,'
            b'"context_tokens":1}\n',
            "must be an integer",
        ),
        (b'{"time":"t","type":"Assistant","text":"x"}\n', "does not start with"),
        (b"\n", "does not start with"),
        (b"[1,2]\n", "does not start with"),
    ],
    ids=[
        "unknown-type",
        "missing-field",
        "extra-field",
        "float-count",
        "type-not-first",
        "empty-line",
        "array",
    ],
)
def test_a_line_that_is_not_a_known_record_is_refused_as_torn(
    home: Path, baseline: Baseline, line: bytes, why: str
) -> None:
    directory = _make(home, baseline)
    log = directory / "0.jsonl"
    lines = _lines(log)
    lines.insert(2, line)
    log.write_bytes(b"".join(lines))
    _refused(home, directory, TornLog, log, line=3, why=why)


def _epoch_end(next_epoch: int) -> bytes:
    return (
        json.dumps(
            {"type": "EpochEnd", "time": T, "next": next_epoch, "summary": "s"},
            separators=(",", ":"),
        ).encode()
        + b"\n"
    )


def _edit_start(field: str, value: object) -> Callable[[list[bytes]], list[bytes]]:
    def edit(lines: list[bytes]) -> list[bytes]:
        start = json.loads(lines[0])
        start[field] = value
        lines[0] = json.dumps(start, separators=(",", ":")).encode() + b"\n"
        return lines

    return edit


@pytest.mark.parametrize(
    ("edit", "line", "why"),
    [
        (lambda lines: lines[1:], 1, "not SessionStart"),
        (lambda lines: [], 1, "empty log"),
        (_edit_start("epoch", 3), 1, "SessionStart.epoch is 3"),
        (_edit_start("session", "other"), 1, "SessionStart.session is 'other'"),
        (lambda lines: [*lines[:2], _epoch_end(1), *lines[2:]], 3, "EpochEnd is not the last"),
        (lambda lines: [*lines, _epoch_end(5)], 4, "EpochEnd.next is 5, expected 1"),
        (lambda lines: [*lines, lines[0]], 4, "a second SessionStart"),
    ],
    ids=[
        "no-session-start",
        "empty",
        "wrong-epoch",
        "wrong-session",
        "epoch-end-in-middle",
        "wrong-next",
        "second-session-start",
    ],
)
def test_structural_breaks_are_refused_as_invalid_with_path_and_line(
    home: Path,
    baseline: Baseline,
    edit: Callable[[list[bytes]], list[bytes]],
    line: int,
    why: str,
) -> None:
    directory = _make(home, baseline)
    log = directory / "0.jsonl"
    log.write_bytes(b"".join(edit(_lines(log))))
    reseal(directory)  # deliberate: the checksums are made to match, the structure is not
    _refused(home, directory, InvalidLog, log, line=line, why=why)


def test_a_gap_in_epoch_numbers_is_refused_as_invalid(home: Path, baseline: Baseline) -> None:
    directory = _make(home, baseline, epochs=3)
    (directory / "1.jsonl").unlink()
    _refused(home, directory, InvalidLog, directory / "2.jsonl", line=1, why="gap in epochs")


def test_an_older_epoch_without_epoch_end_is_refused_as_invalid(
    home: Path, baseline: Baseline
) -> None:
    directory = _make(home, baseline, epochs=2)
    log = directory / "0.jsonl"
    log.write_bytes(b"".join(_lines(log)[:-1]))
    reseal(directory)  # the sealed log's length and CRC-32 made to match
    _refused(home, directory, InvalidLog, log, line=3, why="does not end with EpochEnd")


def test_a_baseline_whose_hash_differs_raises_baseline_error(
    home: Path, baseline: Baseline
) -> None:
    directory = _make(home, baseline, epochs=2)
    other = Baseline(system="changed", memory="", tools=[])
    (directory / "1.baseline.json").write_bytes(other.to_json())
    before = file_digests(directory)
    with pytest.raises(BaselineError, match=r"SessionStart\.baseline says") as caught:
        Session.open(home, "s1")
    assert caught.value.path == str(directory / "1.baseline.json")
    assert file_digests(directory) == before


def test_a_missing_baseline_raises_baseline_error(home: Path, baseline: Baseline) -> None:
    directory = _make(home, baseline)
    (directory / "0.baseline.json").unlink()
    with pytest.raises(BaselineError, match="missing"):
        Session.open(home, "s1")


def test_a_stray_tmp_file_is_ignored_by_open(home: Path, baseline: Baseline) -> None:
    directory = _make(home, baseline)
    (directory / "1.jsonl.tmp").write_bytes(b"{half a line")
    with Session.open(home, "s1") as session:
        assert session.epoch == 0
        assert len(session.records) == 3


def test_every_refusal_is_a_session_error(home: Path, baseline: Baseline) -> None:
    directory = _make(home, baseline)
    (directory / "0.jsonl").write_bytes(b"\x00\x00\x00")
    with pytest.raises(SessionError):
        Session.open(home, "s1")
    assert os.path.getsize(directory / "0.jsonl") == 3
