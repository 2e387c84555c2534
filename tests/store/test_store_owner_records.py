"""Owner and Handoff: the fencing token in the log never goes backwards, a Handoff seals it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.forge import reseal
from worker import (
    Assistant,
    Baseline,
    Handoff,
    InvalidLog,
    InvalidRecord,
    LogSealed,
    NotOwnerNow,
    Owner,
    Session,
    User,
)
from worker.store.fencing import write_owner
from worker.store.format.records import encode_record
from worker.store.loader import load_session


def _session(home: Path, baseline: Baseline, token: int = 5) -> Session:
    session = Session.create(home, "s", baseline)
    session.append(Owner(node="a", token=token))
    return session


def _append_raw(home: Path, line: bytes, epoch: int = 0) -> Path:
    log = home / "sessions" / "s" / f"{epoch}.jsonl"
    with log.open("ab") as f:
        f.write(line)
    reseal(log.parent)  # written behind the store's back, checksums and all
    return log


def test_owner_and_handoff_are_read_back_as_the_fence(home: Path, baseline: Baseline) -> None:
    with _session(home, baseline) as session:
        session.append(User(text="hi"))
        session.append(Handoff(to="b", token=5))
    with Session.open(home, "s") as reopened:
        fence = reopened.fence
        assert (fence.token, fence.node) == (5, "a")
        assert fence.sealed is not None
        assert fence.sealed.to == "b"
        assert isinstance(reopened.records[-1], Handoff)


def test_append_refuses_an_owner_whose_token_goes_backwards(home: Path, baseline: Baseline) -> None:
    with (
        _session(home, baseline) as session,
        pytest.raises(InvalidRecord, match=r"Owner\.token 4 goes backwards"),
    ):
        session.append(Owner(node="b", token=4))


def test_open_refuses_a_log_whose_owner_token_goes_backwards_with_its_line(
    home: Path, baseline: Baseline
) -> None:
    _session(home, baseline).close()
    log = _append_raw(home, encode_record(Owner(node="b", token=3)))
    with pytest.raises(InvalidLog, match=f"^{log}:3: Owner.token 3 goes backwards"):
        Session.open(home, "s")


def test_append_after_a_handoff_is_refused_as_sealed(home: Path, baseline: Baseline) -> None:
    with _session(home, baseline) as session:
        session.append(Handoff(to="b", token=5))
        with pytest.raises(LogSealed, match="sealed by Handoff to 'b' \\(token 5\\)"):
            session.append(User(text="late"))
        with pytest.raises(LogSealed):
            session.append_many([User(text="late"), Assistant(text="x")])
        with pytest.raises(LogSealed):
            session.commit_epoch("summary", baseline)
        with pytest.raises(LogSealed):
            session.append(Owner(node="a", token=5))
        assert isinstance(session.records[-1], Handoff)


def test_an_owner_with_a_higher_token_reopens_a_sealed_log_for_writes(
    home: Path, baseline: Baseline
) -> None:
    with _session(home, baseline) as session:
        session.append(Handoff(to="b", token=5))
        session.append(Owner(node="b", token=9))
        session.append(User(text="after the move"))
    with Session.open(home, "s") as reopened:
        assert (reopened.fence.token, reopened.fence.node, reopened.fence.sealed) == (9, "b", None)


def test_open_refuses_a_record_written_after_a_handoff(home: Path, baseline: Baseline) -> None:
    with _session(home, baseline) as session:
        session.append(Handoff(to="b", token=5))
    log = _append_raw(home, encode_record(User(text="zombie write")))
    with pytest.raises(InvalidLog, match=f"^{log}:4: User after Handoff to 'b': the log is sealed"):
        Session.open(home, "s")


def test_open_refuses_an_owner_after_a_handoff_without_a_higher_token(
    home: Path, baseline: Baseline
) -> None:
    with _session(home, baseline) as session:
        session.append(Handoff(to="b", token=5))
    log = _append_raw(home, encode_record(Owner(node="b", token=5)))
    with pytest.raises(InvalidLog, match=f"^{log}:4: Owner.token 5 after Handoff with token 5"):
        Session.open(home, "s")


def test_a_handoff_must_carry_the_current_owners_token(home: Path, baseline: Baseline) -> None:
    with Session.create(home, "s", baseline) as session:
        with pytest.raises(InvalidRecord, match="no Owner in this epoch"):
            session.append(Handoff(to="b", token=1))
        session.append(Owner(node="a", token=2))
        with pytest.raises(InvalidRecord, match=r"Handoff\.token 3 is not the current owner"):
            session.append(Handoff(to="b", token=3))


def test_owner_in_a_group_commit_is_refused(home: Path, baseline: Baseline) -> None:
    with (
        _session(home, baseline) as session,
        pytest.raises(InvalidRecord, match="invalid Owner record: is written alone"),
    ):
        session.append_many([Owner(node="a", token=6), User(text="x")])


def test_a_framed_owner_line_is_refused_by_open(home: Path, baseline: Baseline) -> None:
    _session(home, baseline).close()
    line = encode_record(Owner(node="a", token=6))[:-2] + b',"part":1,"parts":2}\n'
    log = _append_raw(home, line)
    with pytest.raises(Exception, match=f"^{log}:3: .*Owner is written alone"):
        Session.open(home, "s")


def test_the_history_reading_refuses_a_token_that_went_backwards_across_epochs(
    home: Path, baseline: Baseline
) -> None:
    with _session(home, baseline, token=7) as session:
        session.commit_epoch("first", baseline)
    _append_raw(home, encode_record(Owner(node="b", token=3)), epoch=1)
    directory = str(home / "sessions" / "s")
    for history in (False, True):  # the newest epoch alone knows token 7 from its SessionStart
        with pytest.raises(
            InvalidLog, match=r"Owner\.token 3 goes backwards \(the log holds token 7"
        ):
            load_session(directory, "s", history=history)


def test_write_owner_appends_a_higher_token_once_and_refuses_a_log_with_a_newer_one(
    home: Path, baseline: Baseline
) -> None:
    with _session(home, baseline, token=5) as session:
        write_owner(session, "a", 5)
        assert len(session.records) == 2  # SessionStart, the first Owner: nothing added
        write_owner(session, "a", 8)
        assert session.fence.token == 8
        with pytest.raises(NotOwnerNow, match="the log holds token 8, newer than this node's 6"):
            write_owner(session, "b", 6)


def test_write_owner_after_the_nodes_own_handoff_is_refused_as_sealed(
    home: Path, baseline: Baseline
) -> None:
    with _session(home, baseline, token=5) as session:
        session.append(Handoff(to="b", token=5))
        with pytest.raises(LogSealed):
            write_owner(session, "a", 5)
        write_owner(session, "b", 9)
        assert (session.fence.node, session.fence.sealed) == ("b", None)
