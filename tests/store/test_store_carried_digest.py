"""Open refuses carried state that verify refuses: EpochEnd binds the next SessionStart.

The epoch commit records in its EpochEnd the digest of the carried fields the next
SessionStart must hold, computed from what the log holds; open checks it (the previous
log's last line is read anyway), so a changed carried field is refused with its place,
by open and by `loopd verify` alike. A resume after the EpochEnd carries exactly what it
recorded; logs written before the digest still open.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from tests.harness.forge import rewrite_line
from tests.harness.support import loopd
from worker import Baseline, InvalidLog, Session, SessionIOError, ToolResult, User
from worker.store.disk import durable
from worker.store.epochs.carried_state import carried_digest
from worker.store.format.records import EpochEnd, SessionStart, decode_record

BASELINE = Baseline(system="s", memory="", tools=[])
T = "2026-11-29T20:17:57.123456Z"


def _epochs(home: Path, epochs: int) -> Path:
    with Session.create(home, "s1", BASELINE) as session:
        for epoch in range(epochs):
            for n in range(3):
                key = f"e{epoch}-{n}"
                session.append_many(
                    [
                        User(time=T, text=key, key=key, untrusted=n == 1),
                        ToolResult(time=T, call=session.next_call(), tool="t", output="", ok=True),
                    ]
                )
            if epoch < epochs - 1:
                session.commit_epoch(f"summary {epoch}", BASELINE)
        return Path(session.dir)


def _record(log: Path, index: int) -> object:
    return decode_record(log.read_bytes().splitlines()[index])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("recent_keys", "{}"),
        ("next_call", 1),
        ("prior_users", 0),
        ("prior_untrusted", 7),
        ("key_index", ""),
    ],
)
def test_open_refuses_a_changed_carried_field_as_verify_does(
    home: Path, field: str, value: object
) -> None:
    directory = _epochs(home, 3)
    newest = directory / "2.jsonl"
    rewrite_line(newest, 0, **{field: value})
    with pytest.raises(InvalidLog, match="SessionStart's carried state hashes to") as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(newest), 1)
    assert f"(EpochEnd.carried, {directory / '1.jsonl'}:8)" in str(caught.value)
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 1
    assert f"{newest}:1: SessionStart" in verified.stdout


def test_open_refuses_a_changed_epoch_end_digest(home: Path) -> None:
    directory = _epochs(home, 3)
    rewrite_line(directory / "1.jsonl", -1, carried="0" * 64)
    with pytest.raises(InvalidLog, match="but the epoch commit recorded 0000") as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(directory / "2.jsonl"), 1)
    assert loopd("verify", "--home", str(home)).returncode == 1


def test_a_session_whose_epoch_ends_carry_no_digest_still_opens_and_verifies(home: Path) -> None:
    directory = _epochs(home, 4)
    for epoch in range(3):
        rewrite_line(directory / f"{epoch}.jsonl", -1, carried=None)
    with Session.open(home, "s1") as session:
        assert (session.epoch, session.prior_users, session.prior_untrusted) == (3, 9, 3)
        assert session.find_key("e0-0") is not None
    assert loopd("verify", "--home", str(home)).returncode == 0


def test_the_epoch_end_digest_is_of_the_state_the_next_session_start_carries(home: Path) -> None:
    directory = _epochs(home, 3)
    for epoch in (1, 2):
        end = _record(directory / f"{epoch - 1}.jsonl", -1)
        start = _record(directory / f"{epoch}.jsonl", 0)
        assert isinstance(end, EpochEnd)
        assert isinstance(start, SessionStart)
        assert end.carried == carried_digest(start.carried_fields)


def test_a_resume_after_the_epoch_end_carries_what_it_recorded_not_reserved_numbers(
    home: Path,
) -> None:
    directory = _epochs(home, 2)

    def fail_at_the_baseline(boundary: durable.Boundary) -> None:
        if boundary.step is durable.Step.CREATE and boundary.path.endswith("baseline.json.tmp"):
            raise OSError(errno.EIO, "injected")

    with Session.open(home, "s1") as session:
        reserved = [session.next_call() for _ in range(3)]  # handed out, never written
        assert reserved == [7, 8, 9]
        previous = durable.set_hook(fail_at_the_baseline)
        try:
            with pytest.raises(SessionIOError, match=r"2\.baseline\.json\.tmp: create failed"):
                session.commit_epoch("summary 1", BASELINE)
        finally:
            durable.set_hook(previous)
    end = _record(directory / "1.jsonl", -1)
    assert isinstance(end, EpochEnd)
    assert end.carried is not None
    with Session.open(home, "s1") as session:  # resume: the change is finished
        assert session.epoch_closed
        session.commit_epoch("an argument the resume ignores", BASELINE)
    start = _record(directory / "2.jsonl", 0)
    assert isinstance(start, SessionStart)
    assert start.next_call == 7  # what the log says, as a restart computes it
    assert carried_digest(start.carried_fields) == end.carried
    with Session.open(home, "s1") as session:
        assert (session.epoch, session.carry) == (2, "summary 1")
    assert loopd("verify", "--home", str(home)).returncode == 0


def test_open_refuses_a_closed_epoch_changed_after_its_epoch_end_was_written(home: Path) -> None:
    directory = _epochs(home, 2)
    with Session.open(home, "s1") as session:
        end = EpochEnd(next=2, summary="summary 1")
        session._append_durably([end])  # phase 1 alone, as a crash leaves it
    log = directory / "1.jsonl"
    lines = len(log.read_bytes().splitlines())
    rewrite_line(log, -1, carried="f" * 64)
    with pytest.raises(
        InvalidLog, match="the log changed after its EpochEnd was written"
    ) as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(log), lines)
    assert loopd("verify", "--home", str(home)).returncode == 1
