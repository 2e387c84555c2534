"""Hostile files and crafted lines: refused with their place, never followed, never a hang.

Also the durability of what open trusts: everything it read is fsynced before the
session is handed out, and a failed directory fsync is redone by the next attempt.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import file_digests
from tests.harness.forge import reseal
from tests.harness.keyed_sessions import FIXED_TIME, four_record_session
from worker import (
    Assistant,
    Baseline,
    BaselineError,
    InvalidLog,
    Session,
    SessionIOError,
    TornLog,
)
from worker.store.disk import durable
from worker.store.disk.durable import Boundary, Step
from worker.store.format.records import encode_records


@pytest.fixture
def trace() -> Iterator[list[Boundary]]:
    """Record every durable step the store takes while the test runs."""
    steps: list[Boundary] = []

    def record(boundary: Boundary) -> None:
        steps.append(boundary)

    previous = durable.set_hook(record)
    yield steps
    durable.set_hook(previous)


# -- what open trusts is durable --------------------------------------------------------


def test_open_fsyncs_the_log_baseline_directory_sessions_and_home_before_returning(
    home: Path, baseline: Baseline, trace: list[Boundary]
) -> None:
    log = four_record_session(home, baseline)
    trace.clear()
    with Session.open(home, "s1"):
        synced = [(b.step, b.path) for b in trace]
    directory = str(log.parent)
    assert synced == [
        (Step.FSYNC, str(log)),
        (Step.FSYNC, os.path.join(directory, "0.baseline.json")),
        (Step.FSYNC_DIR, directory),
        (Step.FSYNC_DIR, str(home / "sessions")),
        (Step.FSYNC_DIR, str(home)),
    ]


def test_open_that_cannot_fsync_what_it_read_refuses_to_hand_out_the_session(
    home: Path, baseline: Baseline
) -> None:
    four_record_session(home, baseline)

    def fail_directory_fsync(boundary: Boundary) -> None:
        if boundary.step is Step.FSYNC_DIR:
            raise OSError(errno.EIO, "injected")

    previous = durable.set_hook(fail_directory_fsync)
    try:
        with pytest.raises(SessionIOError, match="fsync of directory failed"):
            Session.open(home, "s1")
    finally:
        durable.set_hook(previous)
    Session.open(home, "s1").close()  # the lock was released on the way out


@pytest.mark.parametrize("failing", ["sessions", "home"])
def test_a_failed_directory_fsync_during_create_is_redone_by_the_next_attempt(
    home: Path, baseline: Baseline, trace: list[Boundary], failing: str
) -> None:
    target = str(home / "sessions") if failing == "sessions" else str(home)
    failed: list[Boundary] = []

    def fail_once(boundary: Boundary) -> None:
        trace.append(boundary)
        if boundary.step is Step.FSYNC_DIR and boundary.path == target and not failed:
            failed.append(boundary)
            raise OSError(errno.EIO, "injected")

    durable.set_hook(fail_once)
    with pytest.raises(SessionIOError):
        Session.create(home, "s1", baseline)
    assert failed
    trace.clear()
    # The worker's retry finishes the create (s1 exists, without a log); a create of
    # another session must also make the names it relies on durable.
    Session.open_or_create(home, "s1", baseline).close()
    assert (Step.FSYNC_DIR, target) in [(b.step, b.path) for b in trace]
    trace.clear()
    Session.create(home, "s2", baseline).close()
    assert (Step.FSYNC_DIR, target) in [(b.step, b.path) for b in trace]


# -- a group commit is all or nothing ---------------------------------------------------


def test_a_group_commit_frames_each_line_with_its_part_and_the_group_size(
    home: Path, baseline: Baseline
) -> None:
    log = four_record_session(home, baseline, requests=1)
    lines = [json.loads(line) for line in log.read_bytes().splitlines()]
    assert "part" not in lines[0]  # SessionStart is written alone
    assert [(r["part"], r["parts"]) for r in lines[1:]] == [(1, 4), (2, 4), (3, 4), (4, 4)]


@pytest.mark.parametrize("kept", [1, 2, 3])
def test_open_refuses_a_last_group_with_whole_lines_missing_naming_its_first_line(
    home: Path, baseline: Baseline, kept: int
) -> None:
    log = four_record_session(home, baseline)
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[: 5 + kept]))  # SessionStart, one group, a cut group
    before = file_digests(home)
    with pytest.raises(TornLog, match="incomplete group") as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(log), 6)
    assert file_digests(home) == before


def test_repair_cuts_an_incomplete_last_group_whole_and_its_key_is_not_applied(
    home: Path, baseline: Baseline
) -> None:
    from worker.offline.repair import repair_torn_tail

    log = four_record_session(home, baseline)
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:8]))  # parts 1-3 of the second request's group
    result = repair_torn_tail(home, "s1")
    assert (result.line, result.last_line) == (6, 8)
    assert result.readable[0].endswith("User part 1 of 4 key=k1")
    assert Path(result.quarantine).read_bytes() == b"".join(lines[5:8])
    with Session.open(home, "s1") as session:
        assert session.find_key("k0") is not None
        assert session.find_key("k1") is None
        assert len(session.records) == 5


def test_repair_cuts_a_last_group_whose_write_left_zeros_before_its_last_part(
    home: Path, baseline: Baseline
) -> None:
    from worker.offline.repair import repair_torn_tail

    log = four_record_session(home, baseline)
    lines = log.read_bytes().splitlines(keepends=True)
    # A disk that persisted a later part of the last write (from the newline that ends
    # its third line) and zeros before it.
    zeros = b"\0" * (len(b"".join(lines[5:8])) - 1) + b"\n"
    log.write_bytes(b"".join(lines[:5]) + zeros + lines[8])
    with pytest.raises(TornLog) as caught:
        Session.open(home, "s1")
    assert caught.value.line == 6
    result = repair_torn_tail(home, "s1")
    assert result.line == 6
    assert any("Usage part 4 of 4" in what for what in result.readable)
    with Session.open(home, "s1") as session:
        assert session.find_key("k1") is None


def test_repair_refuses_damage_followed_by_a_whole_group_and_changes_nothing(
    home: Path, baseline: Baseline
) -> None:
    from worker.offline.repair import RepairRefused, repair_torn_tail

    log = four_record_session(home, baseline, requests=3)
    lines = log.read_bytes().splitlines(keepends=True)
    lines[6] = b"\0" * (len(lines[6]) - 1) + b"\n"  # inside the second of three groups
    log.write_bytes(b"".join(lines))
    before = file_digests(home)
    with pytest.raises(RepairRefused, match="never repaired in place"):
        repair_torn_tail(home, "s1")
    assert file_digests(home) == before


def test_repair_that_would_leave_a_refused_session_changes_nothing(
    home: Path, baseline: Baseline
) -> None:
    from worker.offline.repair import RepairRefused, repair_torn_tail

    log = four_record_session(home, baseline)
    with log.open("ab") as f:
        f.write(b'{"type":"User","ti')
    (log.parent / "0.baseline.json").write_bytes(b'{"memory":"","system":"other","tools":[]}\n')
    before = file_digests(home)
    with pytest.raises(RepairRefused, match="nothing changed"):
        repair_torn_tail(home, "s1")
    assert file_digests(home) == before
    assert not (home / "quarantine").exists()


# -- only the writer's own bytes are accepted -------------------------------------------

_USER = b'{"type":"User","time":"t","text":"x","untrusted":false,"key":null}'
_ASSISTANT = b'{"type":"Assistant","time":"t","text":"x"}'


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"type":"Assistant","time":"t","text":1,"text":"x"}', "duplicate key 'text'"),
        (b'{"type":"Assistant","type":"Assistant","time":"t","text":"x"}', "duplicate key"),
        (_ASSISTANT + b"," + _ASSISTANT, "not valid JSON"),
        (b'{"type":"Assistant","time":"t", "text":"x"}', "canonical"),
        (b'{"type":"Assistant","text":"x","time":"t"}', "writer's order"),
        (b'{"type":"Assistant","time":"t","text":"\\u0078"}', "canonical"),
        (b'{"type":"Assistant","time":"t","text":"x","part":1,"parts":1}', "part must be"),
        (b'{"type":"Assistant","time":"t","text":' + b"[" * 100_000, "nested too deeply"),
        (b'{"type":"Assistant","time":"t","text":"x"} ', "canonical"),
    ],
    ids=[
        "duplicate-key",
        "duplicate-type",
        "two-records",
        "space",
        "key-order",
        "escaped-ascii",
        "group-of-one",
        "deep-nesting",
        "trailing-space",
    ],
)
@pytest.mark.parametrize("size", ["small", "large"])
def test_open_refuses_a_line_that_is_not_the_writers_own_bytes(
    home: Path, baseline: Baseline, line: bytes, why: str, size: str
) -> None:
    log = four_record_session(home, baseline, requests=1 if size == "small" else 300)
    lines = log.read_bytes().splitlines(keepends=True)
    lines.insert(5, line + b"\n")
    log.write_bytes(b"".join(lines))
    before = file_digests(home)
    with pytest.raises(TornLog, match=why) as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(log), 6)
    assert file_digests(home) == before


def test_three_lines_that_each_fail_alone_do_not_pass_together(
    home: Path, baseline: Baseline
) -> None:
    log = four_record_session(home, baseline, requests=1)
    # Joined, the duplicate keys of each line would collapse into valid records.
    crafted = [
        b'{"type":"Assistant","time":"t","text":1,"text":"x"}\n',
        b'{"type":"Assistant","time":0,"time":"t","text":"y"}\n',
        b'{"type":"User","time":"t","text":"z","untrusted":0,"untrusted":false,"key":null}\n',
    ]
    log.write_bytes(log.read_bytes() + b"".join(crafted))
    with pytest.raises(TornLog, match="duplicate key") as caught:
        Session.open(home, "s1")
    assert caught.value.line == 6


def test_open_refuses_a_request_key_applied_twice(home: Path, baseline: Baseline) -> None:
    log = four_record_session(home, baseline, requests=1)
    user = b'{"type":"User","time":"t","text":"again","untrusted":false,"key":"k0"}\n'
    log.write_bytes(log.read_bytes() + user)
    reseal(log.parent)  # a forger's line, checksummed: the key check is what refuses it
    with pytest.raises(InvalidLog, match="request key 'k0' was already applied") as caught:
        Session.open(home, "s1")
    assert caught.value.line == 6


def test_the_error_names_the_first_bad_line_even_when_the_last_is_torn(
    home: Path, baseline: Baseline
) -> None:
    log = four_record_session(home, baseline, requests=3)
    lines = log.read_bytes().splitlines(keepends=True)
    lines[3] = b"\0" * 40 + b"\n"
    log.write_bytes(b"".join(lines) + b"\0" * 30)
    with pytest.raises(TornLog) as caught:
        Session.open(home, "s1")
    assert caught.value.line == 4


def test_a_huge_bad_value_is_quoted_cut_in_the_error(home: Path, baseline: Baseline) -> None:
    log = four_record_session(home, baseline, requests=1)
    huge = b"x" * 2_000_000
    line = b'{"type":"User","time":"t","text":"x","untrusted":"' + huge + b'","key":null}\n'
    log.write_bytes(log.read_bytes() + line)
    with pytest.raises(TornLog, match=r"User\.untrusted must be a boolean") as caught:
        Session.open(home, "s1")
    assert len(str(caught.value)) < 1000
    assert "(2000000 characters)" in str(caught.value)


def test_a_deeply_nested_baseline_is_refused_as_unparsable(home: Path, baseline: Baseline) -> None:
    log = four_record_session(home, baseline, requests=1)
    nested = b'{"memory":' + b"[" * 100_000 + b"\n"
    (log.parent / "0.baseline.json").write_bytes(nested)
    # Make SessionStart name the hash of the nested file, so parsing is reached.
    from worker.store.baseline import hash_bytes

    lines = log.read_bytes().splitlines(keepends=True)
    start = json.loads(lines[0])
    start["baseline"] = hash_bytes(nested)
    lines[0] = json.dumps(start, separators=(",", ":")).encode() + b"\n"
    log.write_bytes(b"".join(lines))
    reseal(log.parent)
    with pytest.raises(BaselineError, match="nested too deeply"):
        Session.open(home, "s1")


# -- nothing but regular files, never through a link ------------------------------------


def test_encode_records_of_one_record_writes_it_unframed() -> None:
    line = encode_records([Assistant(time=FIXED_TIME, text="x")])
    assert (
        line == _ASSISTANT.replace(b'"time":"t"', b'"time":"' + FIXED_TIME.encode() + b'"') + b"\n"
    )
