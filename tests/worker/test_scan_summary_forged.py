"""A scan summary that is not of its log's bytes, or says otherwise of them, is never
taken for them and never a traceback (docs/format.md, "The scan summary")."""

from __future__ import annotations

import os
import zlib

import pytest

from tests.harness.forged import rechained
from tests.harness.summary_sessions import SESSION, big_home, big_session, log_of, scan_fields
from worker.store.disk.scan_file import read_summary, scan_path
from worker.store.errors import LogError
from worker.store.format.line_scan import scan_lines
from worker.store.format.records import EpochEnd, ToolResult
from worker.store.format.scan_summary import ScanSummary, Summarized, encode
from worker.store.session import Session

home = big_home


def test_a_summary_of_other_bytes_is_not_taken_and_open_reads_the_log_as_it_is(
    home: str,
) -> None:
    """A session restored from an older copy of sessions/ alone: its log holds other keys
    where the summary's lie, the same length and first line. Open reads the log's."""
    Session.open(home, SESSION).close()
    summary = read_summary(home, SESSION)
    assert summary is not None
    with open(log_of(home), "rb") as f:
        lines = f.read().splitlines(keepends=True)
    # Each User's key k<n> becomes j<n> (the same length), every checksum made to match.
    other = [
        line.replace(b'"key":"k', b'"key":"j') if line.startswith(b'{"type":"User"') else line
        for line in lines
    ]
    forged = rechained([line[: line.rindex(b',"crc":')] + b"}" for line in other])
    assert len(forged) == summary.size
    assert forged.startswith(summary.first)
    assert not summary.covers(forged, 0)
    with open(log_of(home), "wb") as f:
        f.write(forged)
    with Session.open(home, SESSION) as session:
        assert session.find_key("j7") is not None
        assert session.find_key("k7") is None
    assert scan_fields(scan_lines(forged, summary, 0)) == scan_fields(scan_lines(forged))


@pytest.mark.parametrize(
    "damage",
    ["flipped", "truncated", "zeros", "empty", "a directory", "a link", "another session's"],
)
def test_a_damaged_or_foreign_summary_is_no_summary(home: str, damage: str) -> None:
    Session.open(home, SESSION).close()
    path = scan_path(home, SESSION)
    with open(path, "rb") as f:
        blob = f.read()
    os.unlink(path)
    if damage == "flipped":
        blob = blob[:100] + bytes([blob[100] ^ 1]) + blob[101:]
    elif damage == "truncated":
        blob = blob[: len(blob) // 2]
    elif damage == "zeros":
        blob = bytes(len(blob))
    elif damage == "empty":
        blob = b""
    if damage == "a directory":
        os.mkdir(path)
    elif damage == "a link":
        os.symlink(os.path.join(home, "sessions", SESSION, "0.jsonl"), path)
    elif damage == "another session's":
        big_session(os.path.join(home, "other"), requests=450)
        Session.open(os.path.join(home, "other"), SESSION).close()
        os.rename(scan_path(os.path.join(home, "other"), SESSION), path)
    else:
        with open(path, "wb") as f:
            f.write(blob)
    assert read_summary(home, SESSION) is None or damage == "another session's"
    with Session.open(home, SESSION) as session:
        assert session.find_key("k399") is not None
        assert session.find_key("k400") is None
        assert len(session.records) == 1 + 4 * 400


def test_a_log_damaged_under_its_summary_is_refused_at_the_same_line_as_without_one(
    home: str,
) -> None:
    Session.open(home, SESSION).close()
    assert read_summary(home, SESSION) is not None
    with open(log_of(home), "r+b") as f:
        data = f.read()
        at = data.index(b"request 123")  # line 1 + 4 * 123 + 1: the 124th request's User
        f.seek(at)
        f.write(b"REQUEST")
    with pytest.raises(LogError) as refused:
        Session.open(home, SESSION)
    os.unlink(scan_path(home, SESSION))
    with pytest.raises(LogError) as without:
        Session.open(home, SESSION)
    assert str(refused.value) == str(without.value)
    assert f"0.jsonl:{1 + 4 * 123 + 1}:" in str(refused.value)


def _forge_summary(home: str, change: str) -> None:
    """Keep a summary whose lists say otherwise of the log's bytes (their length, first
    line, CRC-32 and Adler-32 still those bytes'): one a person or a bug could write."""
    with open(log_of(home), "rb") as f:
        data = f.read()
    scan = scan_lines(data)
    assert scan is not None
    types, calls, users, keys = list(scan.types), list(scan.calls), list(scan.users), scan.keys
    if change == "cut inside a group":  # what a kill leaves, summarized as if whole
        data = data[: data.rindex(b"\n", 0, data.rindex(b'"part":2,"parts":4')) + 1]
        lines = data.count(b"\n")
        users = [n for n in users if n <= lines]
        types, keys = types[:lines], keys[: len(users)]
        calls = calls[: types.count(ToolResult)]
    else:  # the last line an EpochEnd
        types[-1] = EpochEnd
    said = Summarized(types, calls, users, keys)
    summary = ScanSummary.of(0, data, zlib.crc32(data), zlib.adler32(data), said)
    assert summary is not None
    os.makedirs(os.path.join(home, "scans"), exist_ok=True)
    with open(scan_path(home, SESSION), "wb") as f:
        f.write(encode(summary))


def test_a_summary_of_a_log_cut_inside_a_group_is_no_summary(home: str) -> None:
    """A log cut inside a group commit is refused at it, whatever a summary says."""
    with open(log_of(home), "rb") as f:
        whole = f.read()
    _forge_summary(home, "cut inside a group")
    summary = read_summary(home, SESSION)
    assert summary is not None
    with open(log_of(home), "wb") as f:
        f.write(whole[: summary.size])
    with pytest.raises(LogError, match="incomplete group"):
        Session.open(home, SESSION)


def test_a_summary_whose_classes_say_otherwise_is_refused_at_its_line_never_a_traceback(
    home: str,
) -> None:
    _forge_summary(home, "the last line an EpochEnd")
    with pytest.raises(LogError, match=rf"0\.jsonl:{1 + 4 * 400}: holds a Usage where open read"):
        Session.open(home, SESSION)
    os.unlink(scan_path(home, SESSION))
    with Session.open(home, SESSION) as session:  # the log itself is whole
        assert session.find_key("k399") is not None
