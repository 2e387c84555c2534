"""commit_epoch: the two phases, the carry, and resume without a second EpochEnd."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from worker import Baseline, EpochEnd, Session, SessionStart, Usage, User
from worker.store.format.records import encode_appended

NEXT = Baseline(system="sys", memory="remembered", tools=[])


def _types(path: Path) -> list[str]:
    return [json.loads(line)["type"] for line in path.read_bytes().splitlines()]


def test_commit_epoch_ends_the_old_log_and_starts_the_next_keeping_the_live_slot(
    home: Path, baseline: Baseline
) -> None:
    with Session.create(home, "s1", baseline, slot=7) as session:
        session.append(User(text="one"))
        session.commit_epoch("the first epoch", NEXT)
        directory = Path(session.dir)
        assert session.epoch == 1
        assert session.slot == 7
        assert session.carry == "the first epoch"
        assert session.baseline == NEXT
        assert [r.TYPE for r in session.records] == ["SessionStart"]
        assert session.prior_users == 1
    assert _types(directory / "0.jsonl") == ["SessionStart", "User", "EpochEnd"]
    end = json.loads((directory / "0.jsonl").read_bytes().splitlines()[-1])
    assert (end["next"], end["summary"]) == (1, "the first epoch")
    assert (directory / "1.baseline.json").read_bytes() == NEXT.to_json()
    start = json.loads((directory / "1.jsonl").read_bytes())
    assert (start["epoch"], start["slot"], start["baseline"]) == (1, 7, NEXT.hash())
    with Session.open(home, "s1") as session:
        assert (session.epoch, session.slot, session.carry) == (1, 7, "the first epoch")
        assert session.baseline == NEXT


def test_a_second_commit_leaves_one_epoch_end_in_epoch_0_and_writes_the_next_on_epoch_1(
    home: Path, baseline: Baseline
) -> None:
    with Session.create(home, "s1", baseline) as session:
        session.commit_epoch("first", baseline)
        session.append(User(text="in epoch 1", untrusted=True))
        session.commit_epoch("second", NEXT)
        directory = Path(session.dir)
        assert session.prior_users == 1
        assert session.prior_untrusted == 1
    assert _types(directory / "0.jsonl").count("EpochEnd") == 1
    assert _types(directory / "1.jsonl") == ["SessionStart", "User", "EpochEnd"]
    with Session.open(home, "s1") as session:
        assert (session.epoch, session.carry) == (2, "second")
        assert (session.prior_users, session.prior_untrusted) == (1, 1)


def _interrupted_change(home: Path, baseline: Baseline) -> Path:
    """A session whose log ends with EpochEnd and whose next epoch was never written."""
    with Session.create(home, "s1", baseline, slot=5) as session:
        session.append(Usage(prompt_tokens=1, completion_tokens=1, context_tokens=2))
        path = Path(session.log_path)
    end = EpochEnd(next=1, summary="recorded summary")
    with open(path, "ab") as f:
        f.write(encode_appended(path.read_bytes(), end))
    return path.parent


@pytest.mark.parametrize(
    "leftover",
    ["nothing", "new-baseline", "stray-tmp-log", "stray-tmp-baseline"],
)
def test_resume_after_epoch_end_uses_its_summary_and_writes_no_second_epoch_end(
    home: Path, baseline: Baseline, leftover: str
) -> None:
    directory = _interrupted_change(home, baseline)
    if leftover == "new-baseline":
        (directory / "1.baseline.json").write_bytes(NEXT.to_json())
    elif leftover == "stray-tmp-log":
        (directory / "1.jsonl.tmp").write_bytes(b'{"type":"Sess')
    elif leftover == "stray-tmp-baseline":
        (directory / "1.baseline.json.tmp").write_bytes(b"{")
    with Session.open(home, "s1") as session:
        assert session.epoch == 0
        assert session.epoch_closed
        session.commit_epoch("an ignored argument", NEXT)
        assert session.epoch == 1
        assert session.carry == "recorded summary"
        assert session.slot == 5
        assert session.last_usage() is None
    assert _types(directory / "0.jsonl").count("EpochEnd") == 1
    assert not list(directory.glob("*.tmp"))
    with Session.open(home, "s1") as session:
        assert (session.epoch, session.carry, session.slot) == (1, "recorded summary", 5)
        first = session.records[0]
        assert isinstance(first, SessionStart)
        assert first.baseline == NEXT.hash()
