"""Open reads the newest epoch only: the epoch commit carries the older epochs' state.

What open learns from the carried state must equal what a full read of the history
gives; `loopd verify` reads the history and checks every carried field; sessions
written before the state was carried still open, and move to the new form at their
next commit; a request key of any epoch is recognised, never applied twice.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.forge import reseal
from tests.harness.support import loopd
from worker import (
    Assistant,
    Baseline,
    ChecksumMismatch,
    InvalidLog,
    Session,
    SessionStart,
    ToolResult,
    User,
)
from worker.store.format.records import decode_record, encode_record, without_checksums
from worker.store.loader import SessionState, load_session

BASELINE = Baseline(system="s", memory="", tools=[])
T = "2026-11-29T20:17:57.123456Z"

# A history: per epoch, a list of steps; a step is a request (keyed or not, trusted or
# not, with a tool call or without) or a reserved call number that is never written.
steps = st.lists(
    st.tuples(st.sampled_from(["request", "reserve"]), st.booleans(), st.booleans(), st.booleans()),
    max_size=6,
)
histories = st.lists(steps, min_size=1, max_size=5)


def _write(home: str, history: list[list[tuple[str, bool, bool, bool]]]) -> None:
    number = 0
    with Session.create(home, "h", BASELINE, slot=3) as session:
        for epoch, epoch_steps in enumerate(history):
            for kind, keyed, untrusted, tool in epoch_steps:
                if kind == "reserve":
                    session.next_call()
                    continue
                number += 1
                batch: list[User | ToolResult | Assistant] = [
                    User(time=T, text="t", untrusted=untrusted, key=f"k{number}" if keyed else None)
                ]
                if tool:
                    batch.append(
                        ToolResult(time=T, call=session.next_call(), tool="x", output="", ok=True)
                    )
                batch.append(Assistant(time=T, text="a"))
                session.append_many(batch)
            if epoch < len(history) - 1:
                session.commit_epoch(f"summary {epoch}", BASELINE)


def _view(state: SessionState) -> tuple[object, ...]:
    return (
        state.epoch,
        state.slot,
        state.carry,
        state.prior_users,
        state.prior_untrusted,
        state.next_call,
        state.records,
        {k: (ref.epoch, ref.line) for k, ref in state.keys.items() if ref.epoch >= state.epoch - 1},
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories)
def test_what_open_learns_from_the_newest_epoch_equals_a_full_read_of_the_history(
    history: list[list[tuple[str, bool, bool, bool]]],
) -> None:
    with tempfile.TemporaryDirectory() as home:
        _write(home, history)
        directory = str(Path(home) / "sessions" / "h")
        quick = load_session(directory, "h")
        full = load_session(directory, "h", history=True)
        assert quick.first_read == (len(history) - 1)
        assert full.first_read == 0
        assert _view(quick) == _view(full)
        with Session.open(home, "h") as session:
            assert session.next_call() == quick.next_call


def _epochs(home: Path, epochs: int, per_epoch: int = 3) -> Path:
    with Session.create(home, "s1", BASELINE) as session:
        for epoch in range(epochs):
            for n in range(per_epoch):
                key = f"e{epoch}-{n}"
                session.append_many(
                    [
                        User(time=T, text=key, key=key),
                        ToolResult(time=T, call=session.next_call(), tool="t", output="", ok=True),
                    ]
                )
            if epoch < epochs - 1:
                session.commit_epoch(f"summary {epoch}", BASELINE)
        return Path(session.dir)


def test_open_reads_no_older_epoch_than_the_previous_ones_last_line(home: Path) -> None:
    directory = _epochs(home, 4)
    log = directory / "1.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = b"\0" * 10 + b"\n"  # damage in the middle of an old epoch
    log.write_bytes(b"".join(lines))
    with Session.open(home, "s1") as session:
        assert (session.epoch, session.carry) == (3, "summary 2")
        assert session.prior_users == 9
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 1
    assert f"{log}:3:" in verified.stdout


def test_open_refuses_a_previous_epoch_that_does_not_end_with_its_epoch_end(home: Path) -> None:
    directory = _epochs(home, 3)
    log = directory / "1.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-1]))
    # The next epoch's SessionStart recorded the sealed log's length: the cut is named.
    with pytest.raises(ChecksumMismatch, match="lines were cut off its end") as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(log), len(lines))
    reseal(directory)  # a forger who fixed the length and CRC-32 too
    with pytest.raises(InvalidLog, match="does not end with EpochEnd") as forged:
        Session.open(home, "s1")
    assert (forged.value.path, forged.value.line) == (str(log), len(lines) - 1)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("prior_users", 5, "SessionStart.prior_users is 5, the older epochs hold 6"),
        ("prior_untrusted", 1, "SessionStart.prior_untrusted is 1, the older epochs hold 0"),
        ("next_call", 2, "SessionStart.next_call is 2, but call 6 was already used"),
        ("recent_keys", "{}", "does not match the request keys of epoch 1"),
    ],
)
def test_verify_checks_every_carried_field_against_the_history(
    home: Path, field: str, value: object, why: str
) -> None:
    directory = _epochs(home, 3)
    log = directory / "2.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    start = json.loads(lines[0])
    start[field] = value
    lines[0] = json.dumps(start, separators=(",", ":")).encode() + b"\n"
    log.write_bytes(b"".join(lines))
    reseal(directory)  # a deliberate change: the checksums are made to match
    with pytest.raises(InvalidLog, match=why) as caught:
        load_session(str(directory), "s1", history=True)
    assert (caught.value.path, caught.value.line) == (str(log), 1)
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 1
    assert why in verified.stdout


def _strip_carried(log: Path) -> None:
    """Rewrite an epoch's SessionStart as a writer from before carried state would have."""
    lines = log.read_bytes().splitlines(keepends=True)
    start = decode_record(lines[0].rstrip(b"\n"))
    assert isinstance(start, SessionStart)
    lines[0] = encode_record(
        SessionStart(
            time=start.time,
            session=start.session,
            epoch=start.epoch,
            slot=start.slot,
            baseline=start.baseline,
        )
    )
    log.write_bytes(without_checksums(b"".join(lines)))  # and before checksums


def test_a_session_written_before_state_was_carried_opens_and_moves_to_it_at_its_next_commit(
    home: Path,
) -> None:
    directory = _epochs(home, 3)
    for epoch in (1, 2):
        _strip_carried(directory / f"{epoch}.jsonl")
    state = load_session(str(directory), "s1")
    assert state.first_read == 0  # the history is read, as before
    assert (state.prior_users, state.next_call) == (6, 10)
    with Session.open(home, "s1") as session:
        assert session.find_key("e0-0") is not None  # the old index covers every epoch
        session.commit_epoch("summary 2", BASELINE)
    first = decode_record((directory / "3.jsonl").read_bytes().splitlines()[0])
    assert isinstance(first, SessionStart)
    assert (first.next_call, first.prior_users, first.prior_untrusted) == (10, 9, 0)
    assert json.loads(str(first.recent_keys)) == {"e2-0": 2, "e2-1": 4, "e2-2": 6}
    quick = load_session(str(directory), "s1")
    assert quick.first_read == 3
    assert _view(quick) == _view(load_session(str(directory), "s1", history=True))


def test_a_key_of_any_epoch_is_found_from_the_newest_epoch_and_a_new_one_is_not(
    home: Path,
) -> None:
    _epochs(home, 6)
    assert load_session(str(home / "sessions" / "s1"), "s1").first_read == 5
    with Session.open(home, "s1") as session:
        for epoch in range(6):
            for n in range(3):
                ref = session.find_key(f"e{epoch}-{n}", seen_epoch=5)
                assert ref is not None
                assert (ref.epoch, ref.line) == (epoch, 2 + 2 * n)
        assert session.find_key("new", seen_epoch=0) is None  # the client's epoch is ignored
        assert session.find_key("new") is None
