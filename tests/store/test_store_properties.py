"""Properties: records round-trip; truncation or corruption is refused or read as it is."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import file_digests
from worker import (
    Assistant,
    Baseline,
    Record,
    Session,
    SessionError,
    ToolResult,
    Usage,
    User,
)
from worker.store.format.records import decode_record

BASELINE = Baseline(system="s", memory="", tools=[])
texts = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=40)
times = st.just("2026-11-29T20:17:57.123456Z") | texts
counts = st.integers(min_value=0, max_value=2**63)

users = st.builds(User, time=times, text=texts, untrusted=st.booleans(), key=st.none())
assistants = st.builds(Assistant, time=times, text=texts)
usages = st.builds(
    Usage, time=times, prompt_tokens=counts, completion_tokens=counts, context_tokens=counts
)
tools = st.builds(
    ToolResult, time=times, call=st.just(0), tool=texts, output=texts, ok=st.booleans()
)
record_lists = st.lists(st.one_of(users, assistants, usages, tools), max_size=25)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _numbered(records: list[Record]) -> list[Record]:
    """Give the ToolResults increasing call numbers, as a real writer would."""
    out: list[Record] = []
    call = 0
    for record in records:
        if isinstance(record, ToolResult):
            call += 1
            out.append(
                ToolResult(
                    time=record.time,
                    call=call,
                    tool=record.tool,
                    output=record.output,
                    ok=record.ok,
                )
            )
        else:
            out.append(record)
    return out


def _write(home: str, records: list[Record], chunk: int) -> Path:
    with Session.create(home, "p", BASELINE) as session:
        for start in range(0, len(records), max(chunk, 1)):
            session.append_many(records[start : start + max(chunk, 1)])
        return Path(session.log_path)


@SETTINGS
@given(records=record_lists, chunk=st.integers(min_value=1, max_value=8))
def test_any_sequence_of_valid_records_round_trips(records: list[Record], chunk: int) -> None:
    records = _numbered(records)
    with tempfile.TemporaryDirectory() as home:
        _write(home, records, chunk)
        with Session.open(home, "p") as session:
            assert list(session.records)[1:] == records


@SETTINGS
@given(records=record_lists, data=st.data())
def test_a_truncated_log_opens_with_exactly_its_whole_groups_or_is_refused(
    records: list[Record], data: st.DataObject
) -> None:
    records = _numbered(records)
    with tempfile.TemporaryDirectory() as home:
        log = _write(home, records, 4)
        original = log.read_bytes()
        lines = original.splitlines(keepends=True)
        # Where a group commit ends: after SessionStart, then after every chunk of 4.
        group_ends = {len(lines[0]): 0}
        for written in range(0, len(records), 4):
            done = min(written + 4, len(records))
            group_ends[len(b"".join(lines[: 1 + done]))] = done
        cut = data.draw(st.integers(min_value=0, max_value=len(original)), label="cut")
        log.write_bytes(original[:cut])
        before = file_digests(home)
        try:
            session = Session.open(home, "p")
        except SessionError:
            # Refused, and rightly: a cut inside a line or a group, or one that took
            # SessionStart.
            assert cut not in group_ends
        else:
            with session:
                assert cut in group_ends
                assert list(session.records)[1:] == records[: group_ends[cut]]
        assert file_digests(home) == before


@SETTINGS
@given(records=record_lists, data=st.data())
def test_a_corrupted_byte_is_refused_or_leaves_every_other_line_intact(
    records: list[Record], data: st.DataObject
) -> None:
    records = _numbered(records)
    with tempfile.TemporaryDirectory() as home:
        log = _write(home, records, 3)
        original = log.read_bytes()
        at = data.draw(st.integers(min_value=0, max_value=len(original) - 1), label="at")
        value = data.draw(st.integers(min_value=0, max_value=255), label="value")
        corrupted = original[:at] + bytes([value]) + original[at + 1 :]
        log.write_bytes(corrupted)
        before = file_digests(home)
        try:
            session = Session.open(home, "p")
        except SessionError:
            pass
        else:
            with session:
                hit = original[:at].count(b"\n")  # index of the line holding the byte
                lines = original.splitlines()
                loaded = list(session.records)
                assert len(loaded) == len(lines)
                for index, line in enumerate(lines):
                    if index != hit:
                        assert loaded[index] == decode_record(line)
        assert file_digests(home) == before
        assert os.path.getsize(log) == len(corrupted)
