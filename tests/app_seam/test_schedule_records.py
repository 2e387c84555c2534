"""Schedule and Unschedule records: their lines, the pending set, and its carry over epochs."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli.schedule_command import parse_at
from tests.harness.postgres_server import PostgresServer
from worker import Baseline, Session, User
from worker.ipc.wire import Message
from worker.loop.schedule_book import ScheduleBook, ScheduleRefused, normalize_at
from worker.loop.schedule_requests import ScheduledChunk
from worker.store.errors import TornLog
from worker.store.format.records import Record, Schedule, Unschedule, decode_record, encode_record
from worker.store.loader import load_session
from worker.store.schedules import format_time, parse_time, pending_schedules

AT = "2026-12-03T14:00:00.000000Z"


def test_a_schedule_line_round_trips_with_its_fields_in_order() -> None:
    record = Schedule(time=AT, key="k", at=AT, text="hi", untrusted=True)
    line = encode_record(record)
    assert line == (
        b'{"type":"Schedule","time":"2026-12-03T14:00:00.000000Z","key":"k",'
        b'"at":"2026-12-03T14:00:00.000000Z","text":"hi","untrusted":true}\n'
    )
    assert decode_record(line[:-1]) == record
    cancel = Unschedule(time=AT, key="k")
    assert decode_record(encode_record(cancel)[:-1]) == cancel


def test_a_schedule_line_without_its_at_is_refused_with_the_field_named() -> None:
    line = f'{{"type":"Schedule","time":"{AT}","key":"k","text":"t","untrusted":false}}'
    with pytest.raises(ValueError, match="missing at"):
        decode_record(line.encode())


@pytest.mark.parametrize(
    "text",
    ["2026-13-01T00:00:00.000000Z", "2026-02-30T00:00:00.000000Z", "2026-12-03T14:00:00Z", "x"],
    ids=["month-13", "feb-30", "no-micros", "word"],
)
def test_parse_time_refuses_what_is_not_the_records_format(text: str) -> None:
    assert parse_time(text) is None


def test_format_time_and_parse_time_agree() -> None:
    assert format_time(parse_time(AT) or 0.0) == AT


def test_a_schedule_is_pending_until_its_key_is_applied_or_it_is_cancelled() -> None:
    records: list[Record] = [
        Schedule(key="a", at=AT, text="1"),
        Schedule(key="b", at=AT, text="2"),
        Schedule(key="c", at=AT, text="3"),
        User(text="x", key="a"),
        Unschedule(key="b"),
        User(text="y", key="d"),
        Schedule(key="d", at=AT, text="used key"),
    ]
    assert list(pending_schedules(records)) == ["c"]


@pytest.fixture(scope="module")
def postgres(postgres_server: PostgresServer) -> PostgresServer:
    return postgres_server


def _home(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> object:
    if kind == "file":
        return tmp_path / "home"
    from worker.store.postgres import PostgresStore

    server: PostgresServer = request.getfixturevalue("postgres")
    return PostgresStore(server.new_database())


@pytest.mark.parametrize("kind", ["file", "postgres"])
def test_pending_schedules_are_carried_into_each_new_epoch_and_read_from_it_alone(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, baseline: Baseline
) -> None:
    home = _home(kind, tmp_path, request)
    with Session.create(home, "s", baseline) as session:  # type: ignore[arg-type]
        session.append_many([User(text="x", key="u1"), Schedule(key="a", at=AT, text="A")])
        session.append_many(
            [Schedule(key="b", at=AT, text="B"), Schedule(key="c", at=AT, text="C")]
        )
        session.append_many([User(text="B", key="b"), Unschedule(key="c")])
        session.commit_epoch("one", baseline)
        assert [r.TYPE for r in session.records] == ["SessionStart", "Schedule"]
        session.commit_epoch("two", baseline)  # carried again, unchanged
        carried = session.records[1]
    with Session.open(home, "s") as reopened:  # type: ignore[arg-type]
        assert reopened.epoch == 2
        assert list(pending_schedules(reopened.records)) == ["a"]
        assert reopened.records[1] == carried
        assert isinstance(carried, Schedule)
        assert carried.text == "A"
        reopened.append(User(text="A", key="a"))  # delivered: nothing left to carry
        reopened.commit_epoch("three", baseline)
        assert [r.TYPE for r in reopened.records] == ["SessionStart"]
    if kind == "file":
        state = load_session(str(tmp_path / "home" / "sessions" / "s"), "s", history=True)
        assert state.epoch == 3


def test_a_torn_carried_schedule_line_is_refused_with_its_line(
    tmp_path: Path, baseline: Baseline
) -> None:
    home = tmp_path / "home"
    with Session.create(home, "s", baseline) as session:
        session.append(Schedule(key="a", at=AT, text="A"))
        session.commit_epoch("one", baseline)
    log = home / "sessions" / "s" / "1.jsonl"
    log.write_bytes(log.read_bytes()[:-1])
    with pytest.raises(TornLog, match=r"1\.jsonl:2: "):
        Session.open(home, "s")


@pytest.mark.parametrize("at", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:30:00+01:00"])
def test_a_time_the_records_cannot_hold_is_refused_not_written(at: str) -> None:
    """A year-10000 time was written as such: no record time, it sorted first as the next
    due (the daemon armed no timer) and counted as due at once."""
    with pytest.raises(ValueError, match="is not a time from 0001 to 9999 in UTC"):
        normalize_at(at)
    with pytest.raises(ValueError, match="is not a time from 0001 to 9999 in UTC"):
        parse_at(at)
    assert normalize_at("9999-12-31T22:59:59-01:00") == "9999-12-31T23:59:59.000000Z"


def _chunk(book: ScheduleBook, *payloads: Message) -> list[object]:
    scheduled: ScheduledChunk[None] = ScheduledChunk(book, [(None, p) for p in payloads])
    return [scheduled.decided.get(i) for i in range(len(payloads))]


def test_a_schedule_of_a_key_a_request_of_its_batch_has_is_refused(tmp_path: Path) -> None:
    """Written while the batch was built, before the request, the schedule was taken as
    delivered by it: acknowledged, never delivered."""
    with Session.create(str(tmp_path), "s1", Baseline(system="s", memory="", tools=[])) as s:
        book = ScheduleBook(s)
        later = {"at": "2030-01-01T00:00:00Z", "text": "later"}
        plain, scheduled = _chunk(book, {"key": "K1", "text": "plain"},
                                  {"key": "K1", "schedule": later})  # fmt: skip
        assert plain is None  # the request is the App's
        assert isinstance(scheduled, ScheduleRefused)
        assert "a request of this batch has this key" in str(scheduled)
        assert book.pending() == {}
        # The App's turn.schedule() in such a batch.
        with pytest.raises(ValueError, match="is a request's of this batch"):
            book.stage("2030-01-01T00:00:00Z", "later", "K2", False, {"K2"})


def test_a_retried_schedule_delivered_since_is_answered_as_a_duplicate(tmp_path: Path) -> None:
    """Its answer lost, then delivered: the retry was refused, telling to pick a new key
    (an operator who did would have it done twice)."""
    with Session.create(str(tmp_path), "s1", Baseline(system="s", memory="", tools=[])) as s:
        book = ScheduleBook(s)
        past: Message = {"key": "P1", "schedule": {"at": "2020-01-01T00:00:00Z", "text": "due"}}
        [first] = _chunk(book, past)
        assert first == {"duplicate": False, "key": "P1", "at": "2020-01-01T00:00:00.000000Z"}
        book.pending()
        s.append(User(text="due", key="P1"))  # its delivery
        [again] = _chunk(book, past)
        assert again == {"duplicate": True, "key": "P1", "at": "2020-01-01T00:00:00.000000Z",
                         "delivered": True}  # fmt: skip
        s.append(User(text="plain", key="P2"))
        [refused] = _chunk(book, {**past, "key": "P2"})
        assert isinstance(refused, ScheduleRefused)  # a request's key, not a delivery's
