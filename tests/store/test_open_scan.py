"""Open reads the newest log's bytes without decoding its records (issue 32).

What the scan reads must equal what decoding every line gives; anything the scan does
not know sends open to the line-by-line read, which names the line; a record is
decoded when asked for, and a line whose checksum was made to match but which is not a
record is refused at its place then (and by verify at once).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest

from tests.harness.forged import rechained
from worker import (
    Assistant,
    Baseline,
    InvalidLog,
    Session,
    ToolResult,
    Usage,
    User,
)
from worker.store.errors import LogError
from worker.store.format.epoch_records import EpochRecords
from worker.store.format.line_scan import scan_lines
from worker.store.format.records import (
    AppChanged,
    Owner,
    Schedule,
    encode_record,
    without_checksums,
)
from worker.store.inspection import inspect_session
from worker.store.loader import SessionState, load_session
from worker.store.request_records import request_records

BASELINE = Baseline(system="s", memory="", tools=[])
AT = "2030-01-01T00:00:00.000000Z"
# Keys a regular expression could misread: escapes, quotes, non-ASCII, a field's name.
KEYS = ['k"1', "k\\2", "ké3", 'k,"key":"4', "k\n5", "k\u20286"]


def _session(home: Path) -> Path:
    """A session whose newest log holds every shape the scan reads: groups of 2 to 12
    lines, lone records, keyed, unkeyed and untrusted requests, schedules, an Owner."""
    call = 0
    with Session.create(str(home), "s", BASELINE) as session:
        session.append(Owner(node="n1", token=3))
        for n in range(24):
            call += 1
            group: list[User | ToolResult | Assistant | Usage | Schedule] = [
                User(
                    text=f'request {n} ,"key":"x"',
                    untrusted=n % 3 == 0,
                    key=KEYS[n % len(KEYS)] + str(n) if n % 4 else None,
                ),
                ToolResult(call=call, tool="echo", output=f'{{"call":{n + 100}}}', ok=True),
            ]
            group += [Assistant(text="a")] * (n % 11)
            if n % 5 == 0:
                group.append(Schedule(key=f"later{n}", at=AT, text="t"))
            session.append_many(group) if len(group) > 1 else session.append(group[0])
            session.append(Usage(prompt_tokens=n, completion_tokens=1, context_tokens=n + 1))
    return home / "sessions" / "s" / "0.jsonl"


def _fields(state: SessionState) -> dict[str, object]:
    return {
        name: getattr(state, name)
        for name in state.__slots__
        if name not in ("records", "key_index")
    }


def test_open_by_the_scan_learns_what_decoding_every_line_gives(home: Path) -> None:
    log = _session(home)
    directory = str(log.parent)
    assert scan_lines(log.read_bytes()) is not None  # the scan knows every line here
    scanned = load_session(directory, "s")
    decoded = load_session(directory, "s", canonical=True)  # every line decoded and checked
    assert _fields(scanned) == _fields(decoded)
    assert isinstance(scanned.records, EpochRecords)
    # Open decoded its first and last lines and the Owner's, no other.
    assert scanned.records.undecoded == len(scanned.records) - 3
    assert list(scanned.records) == list(decoded.records)
    assert scanned.records.undecoded == 0
    assert sorted(scanned.keys) == sorted(decoded.keys)
    assert len(scanned.keys) == 18


def test_a_session_opened_by_the_scan_serves_retries_schedules_and_its_newest_usage(
    home: Path,
) -> None:
    _session(home)
    with Session.open(str(home), "s") as session:
        ref = session.find_key(KEYS[1] + "1")
        assert ref is not None
        assert session.records[ref.line - 1] == User(
            time=session.records[ref.line - 1].time, text='request 1 ,"key":"x"',
            untrusted=False, key=KEYS[1] + "1",
        )  # fmt: skip
        assert session.find_key("k\n55") is None
        records = session.records
        pending = [r for r in records if isinstance(r, Schedule)]
        assert [s.key for s in pending] == [f"later{n}" for n in range(0, 24, 5)]
        session.append(User(text="more", key=KEYS[0] + "x"))
        assert session.find_key(KEYS[0] + "x") is not None
    with Session.open(str(home), "s") as session:
        state = session._state
        assert state.records[-1] == User(time=state.records[-1].time, text="more",
                                         key=KEYS[0] + "x")  # fmt: skip
        usage = [r for r in session.records if isinstance(r, Usage)][-1]
        assert session._last_usage == usage


def test_a_checksummed_line_that_is_no_record_is_refused_at_its_place_when_read(
    home: Path,
) -> None:
    log = _session(home)
    lines = without_checksums(log.read_bytes()).splitlines()
    number = next(n for n, line in enumerate(lines, 1) if line.startswith(b'{"type":"Assistant"'))
    lines[number - 1] = lines[number - 1].replace(b'"text":"a"', b'"text":5')
    log.write_bytes(rechained(lines))
    with Session.open(str(home), "s") as session:  # open trusts a checksummed line's fields
        with pytest.raises(LogError) as refused:
            list(session.records)
        assert f"{log}:{number}: undecodable record: Assistant.text must be a string" in str(
            refused.value
        )
    with pytest.raises(LogError, match=f":{number}: undecodable record: Assistant.text"):
        inspect_session(str(home), "s", history=True)  # verify's read refuses it at once


def test_lines_the_scan_does_not_know_are_read_line_by_line_and_the_first_bad_one_named(
    home: Path,
) -> None:
    log = _session(home)
    lines = without_checksums(log.read_bytes()).splitlines()
    # A group cut in the middle of the log (its lines all checksummed): never what the
    # writer leaves, so refused where the frame breaks, as the decode always said.
    number = next(n for n, line in enumerate(lines, 1) if b'"part":2,"parts":3' in line)
    del lines[number - 1]
    log.write_bytes(rechained(lines))
    assert scan_lines(log.read_bytes()) is None
    with pytest.raises(InvalidLog, match=f":{number}: part 3 of 3 where part 2 of 3"):
        Session.open(str(home), "s")


def test_an_app_change_is_checked_and_read_from_its_line_alone(home: Path) -> None:
    log = _session(home)
    lines = without_checksums(log.read_bytes()).splitlines()
    change = AppChanged(app="m:App", from_version="1", to_version="2")
    lines.append(encode_record(change).rstrip(b"\n"))
    log.write_bytes(rechained(lines))
    assert scan_lines(log.read_bytes()) is not None
    # The SessionStart names no App, so an AppChanged from one is refused at its line.
    with pytest.raises(InvalidLog, match=f":{len(lines)}: AppChanged from 'm:App'"):
        Session.open(str(home), "s")


def test_records_near_the_end_are_read_from_the_end_and_equal_every_lines_decoding(
    home: Path,
) -> None:
    """The last lines are found from the end (a lookup of the newest Usage splits no log);
    asked for in any order, each of them and every other line is the decoded record."""
    directory = str(_session(home).parent)
    decoded = list(load_session(directory, "s", canonical=True).records)
    assert len(decoded) > 130  # more than two blocks of lines
    scanned = load_session(directory, "s").records
    assert isinstance(scanned, EpochRecords)
    tail = list(range(len(decoded) - 1, len(decoded) - 70, -1))
    for number in tail[::3] + tail:  # backwards, skipping, then again
        assert scanned[number] == decoded[number]
    assert scanned[-66] == decoded[-66]
    assert scanned[5] == decoded[5]  # the first block: every line's end found now
    assert list(scanned) == decoded


def test_request_keys_from_a_line_on_are_the_keys_of_the_users_from_that_line(
    home: Path,
) -> None:
    directory = str(_session(home).parent)
    scanned = load_session(directory, "s").records
    assert isinstance(scanned, EpochRecords)
    records = list(load_session(directory, "s", canonical=True).records)
    for start in (0, 1, 2, 40, len(records) - 5, len(records) - 1, len(records)):
        users = [r for r in records[start:] if isinstance(r, User)]
        assert scanned.request_keys(start) == [u.key for u in users if u.key is not None]
    scanned.extend(
        [
            User(text="late", key="late-key"),
            Usage(prompt_tokens=1, completion_tokens=1, context_tokens=2),
        ]
    )
    assert scanned.request_keys(len(records)) == ["late-key"]


def test_a_read_pauses_the_cyclic_gc_and_restores_it_after_a_load_or_a_refusal(
    home: Path,
) -> None:
    """The scan's passes allocate a tuple per line and the loader an entry per key: no
    collection runs among them; the collector's state is as it was afterwards."""
    log = _session(home)
    seen: list[bool] = []
    assert gc.isenabled()
    load_session(str(log.parent), "s", on_epoch=lambda _records: seen.append(gc.isenabled()))
    assert seen == [False]
    assert gc.isenabled()
    gc.disable()
    try:
        load_session(str(log.parent), "s")
        assert not gc.isenabled()
    finally:
        gc.enable()
    log.write_bytes(log.read_bytes()[:-1])  # torn: refused
    with pytest.raises(LogError):
        load_session(str(log.parent), "s")
    assert gc.isenabled()


def test_a_user_spelled_otherwise_is_read_line_by_line_and_its_key_still_learned(
    home: Path,
) -> None:
    log = _session(home)
    lines = without_checksums(log.read_bytes()).splitlines()
    number = next(n for n, line in enumerate(lines, 1) if b'"key":"k' in line)
    key = json.loads(lines[number - 1])["key"]
    lines[number - 1] = lines[number - 1].replace(b'"key":"', b'"key": "')
    log.write_bytes(rechained(lines))
    assert scan_lines(log.read_bytes()) is None  # not the writer's spelling: not scanned
    with Session.open(str(home), "s") as session:
        ref = session.find_key(key)
        assert ref is not None
        assert ref.line == number


def test_matches_a_line_does_not_give_are_never_counted_for_another_line(home: Path) -> None:
    log = _session(home)
    lines = without_checksums(log.read_bytes()).splitlines()
    first = next(n for n, line in enumerate(lines) if line.startswith(b'{"type":"Assistant"'))
    last = max(n for n, line in enumerate(lines) if line.startswith(b'{"type":"Assistant"'))
    # One line gives a type match too many (a nested object), a later one a match too few
    # (its type escaped): the counts agree, the lines between would take their
    # neighbour's type.
    lines[first] = lines[first].replace(b'"text":"a"', b'"text":{"type":"User","key":"x"}')
    lines[last] = lines[last].replace(b'"type":"Assistant"', b'"type":"\\u0041ssistant"')
    log.write_bytes(rechained(lines))
    assert scan_lines(log.read_bytes()) is None
    with pytest.raises(LogError, match=f":{first + 1}: "):
        Session.open(str(home), "s")


def test_a_refusal_while_open_reads_its_newest_usage_lets_the_lock_go(home: Path) -> None:
    log = _session(home)
    lines = without_checksums(log.read_bytes()).splitlines()
    number = max(n for n, line in enumerate(lines, 1) if line.startswith(b'{"type":"Usage"'))
    lines[number - 1] = lines[number - 1].replace(b'"prompt_tokens":', b'"prompt_tokens":-')
    lines.append(encode_record(User(text="after")).rstrip(b"\n"))
    log.write_bytes(rechained(lines))
    for _ in range(2):  # refused the same way again: nothing was left locked or open
        with pytest.raises(LogError, match=f":{number}: undecodable record"):
            Session.open(str(home), "s")


def test_a_retry_of_an_early_key_decodes_its_request_not_the_rest_of_the_epoch(
    home: Path,
) -> None:
    with Session.create(str(home), "s", BASELINE) as session:
        for n in range(400):
            session.append_many([User(text=f"r{n}", key=f"k{n}"), Assistant(text=f"a{n}")])
    with Session.open(str(home), "s") as session:
        ref = session.find_key("k1")
        assert ref is not None
        records = session._state.records
        assert isinstance(records, EpochRecords)
        before = records.undecoded
        assert [type(r) for r in request_records(session, ref)] == [User, Assistant]
        # A block of lines around the request, not the 700-odd lines after it.
        assert before - records.undecoded <= 64, before - records.undecoded
        last = session.find_key("k399")
        assert last is not None
        assert request_records(session, last)[1] == Assistant(
            time=session.records[-1].time, text="a399"
        )
