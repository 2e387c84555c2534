"""The fence is carried across an epoch commit: the next SessionStart holds the newest token.

Open reads the newest epoch only, so the SessionStart carries the older epochs' newest
Owner (``fence_token``, ``fence_node``), bound by the EpochEnd's carried digest and
checked by ``verify`` against the history. A log written before it still opens, with the
fence of its newest epoch's records, as it always did.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.forge import rewrite_line
from tests.harness.support import loopd
from worker import Baseline, InvalidLog, Session, User
from worker.store.epochs.carried_state import carried_digest, plan_next_epoch
from worker.store.errors import LogSealed, NotOwnerNow
from worker.store.fencing import write_owner
from worker.store.format.records import EpochEnd, Handoff, Owner, SessionStart, decode_record

BASELINE = Baseline(system="s", memory="", tools=[])


def _owned(home: Path, epochs: int = 2) -> Path:
    """Session ``s``: epoch 0 owned by a (5), moved to b (7); ``epochs`` epochs in all."""
    with Session.create(home, "s", BASELINE) as session:
        write_owner(session, "a", 5)
        session.append(User(text="on a", key="k-a"))
        session.append(Handoff(to="b", token=5))
        write_owner(session, "b", 7)
        session.append(User(text="on b", key="k-b"))
        for epoch in range(epochs - 1):
            session.commit_epoch(f"summary {epoch}", BASELINE)
        return Path(session.dir)


def _start(log: Path) -> SessionStart:
    start = decode_record(log.read_bytes().splitlines()[0])
    assert isinstance(start, SessionStart)
    return start


def _strip_fence(directory: Path, epoch: int) -> None:
    """Make epoch ``epoch``'s SessionStart as a loopd before the carried fence wrote it."""
    log = directory / f"{epoch}.jsonl"
    rewrite_line(log, 0, fence_token=None, fence_node=None)
    legacy = carried_digest(_start(log).carried_fields)
    rewrite_line(directory / f"{epoch - 1}.jsonl", -1, carried=legacy)


def test_the_next_session_start_carries_the_newest_owner_and_the_epoch_end_binds_it(
    home: Path,
) -> None:
    directory = _owned(home)
    start = _start(directory / "1.jsonl")
    assert (start.fence_token, start.fence_node) == (7, "b")
    end = decode_record((directory / "0.jsonl").read_bytes().splitlines()[-1])
    assert isinstance(end, EpochEnd)
    assert end.carried == carried_digest(start.carried_fields)
    assert "fence_token" in start.carried_fields
    with Session.open(home, "s") as session:
        assert (session.fence.token, session.fence.node, session.fence.sealed) == (7, "b", None)
        length = len(session.records)
        write_owner(session, "b", 7)  # its token is known: nothing to write
        assert len(session.records) == length
    assert loopd("verify", "--home", str(home)).returncode == 0


def test_a_handoff_in_an_older_epoch_still_fences_its_old_owner_after_the_commit(
    home: Path,
) -> None:
    _owned(home, epochs=3)
    with Session.open(home, "s") as session:
        with pytest.raises(NotOwnerNow, match="the log holds token 7, newer than this node's 5"):
            write_owner(session, "a", 5)  # the owner before the move, after two commits
        # The carried Owner is the current owner's: it may seal without writing it again.
        session.append(Handoff(to="c", token=7))
        with pytest.raises(LogSealed):
            session.append(User(text="after the seal"))
        with pytest.raises(LogSealed):  # a sealed log is never committed: no EpochEnd
            session.commit_epoch("summary", BASELINE)
    with Session.open(home, "s") as session:
        sealed = session.fence.sealed
        assert sealed is not None
        assert (sealed.to, sealed.token) == ("c", 7)
        with pytest.raises(LogSealed):
            write_owner(session, "b", 7)
        write_owner(session, "c", 9)
        assert (session.fence.token, session.fence.node) == (9, "c")
    assert loopd("verify", "--home", str(home)).returncode == 0


@pytest.mark.parametrize(
    "changes",
    [{"fence_token": 3}, {"fence_node": "old"}, {"fence_token": None, "fence_node": None}],
)
def test_open_refuses_a_session_start_whose_carried_fence_was_changed(
    home: Path, changes: dict[str, object]
) -> None:
    directory = _owned(home)
    newest = directory / "1.jsonl"
    rewrite_line(newest, 0, **changes)
    with pytest.raises(InvalidLog, match="SessionStart's carried state hashes to") as caught:
        Session.open(home, "s")
    assert (caught.value.path, caught.value.line) == (str(newest), 1)
    assert loopd("verify", "--home", str(home)).returncode == 1


def test_verify_refuses_a_carried_fence_that_the_history_does_not_hold(home: Path) -> None:
    directory = _owned(home)
    newest = directory / "1.jsonl"
    # A consistent forgery: the EpochEnd's digest rewritten to match (open cannot tell).
    rewrite_line(newest, 0, fence_token=9, fence_node="x")
    rewrite_line(directory / "0.jsonl", -1, carried=carried_digest(_start(newest).carried_fields))
    with Session.open(home, "s") as session:
        assert session.fence.token == 9
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 1
    assert (
        f"{newest}:1: SessionStart carries the fence token 9 of 'x', the older epochs hold 7 of 'b'"
    ) in verified.stdout


def test_a_session_start_written_before_the_fence_opens_with_its_own_epochs_owners(
    home: Path,
) -> None:
    directory = _owned(home)
    _strip_fence(directory, 1)
    assert loopd("verify", "--home", str(home)).returncode == 0
    with Session.open(home, "s") as session:
        assert session.fence.token == 0  # unknown: the newest epoch holds no Owner, as before
        write_owner(session, "b", 7)
        session.commit_epoch("summary 1", BASELINE)
    start = _start(directory / "2.jsonl")  # the next commit carries the fence again
    assert (start.fence_token, start.fence_node) == (7, "b")
    with Session.open(home, "s") as session, pytest.raises(NotOwnerNow):
        write_owner(session, "a", 5)
    assert loopd("verify", "--home", str(home)).returncode == 0


def test_a_commit_begun_before_the_fence_was_carried_resumes_in_the_form_it_recorded(
    home: Path,
) -> None:
    directory = _owned(home, epochs=1)
    with Session.open(home, "s") as session:
        legacy = plan_next_epoch(session._state).without_fence()
        # Phase 1 alone, as a loopd from before the carried fence leaves it at a crash.
        session._append_durably([EpochEnd(next=1, summary="old", carried=legacy.digest)])
    with Session.open(home, "s") as session:
        assert session.epoch_closed
        session.commit_epoch("ignored", BASELINE)
    start = _start(directory / "1.jsonl")
    assert start.fence_token is None
    assert carried_digest(start.carried_fields) == legacy.digest
    with Session.open(home, "s") as session:
        assert (session.epoch, session.carry) == (1, "old")
        session.append(Owner(node="b", token=8))
    assert loopd("verify", "--home", str(home)).returncode == 0


def test_a_commit_after_a_session_start_without_the_fence_never_carries_a_fence_of_zero(
    home: Path,
) -> None:
    """Upgraded from before the carried fence, with no Owner written since: the fence is
    unknown, so the next SessionStart keeps the old form instead of carrying 0, and the
    store's own log still verifies."""
    directory = _owned(home)
    _strip_fence(directory, 1)
    with Session.open(home, "s") as session:
        session.append(User(text="after the upgrade", key="k-up"))
        session.commit_epoch("summary 1", BASELINE)
    start = _start(directory / "2.jsonl")
    assert (start.fence_token, start.fence_node) == (None, None)
    assert loopd("verify", "--home", str(home)).returncode == 0
