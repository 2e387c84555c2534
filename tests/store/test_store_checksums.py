"""Damage that is not a crash is refused with its place: every line carries a checksum.

Each line's CRC-32 covers the log before it (the newest epoch's lines are chained), and
a sealed log is bound to what follows by the next SessionStart's record of its length
and CRC-32. A flip that keeps the JSON valid, a sealed log cut at a line boundary, a
line deleted or two swapped in the newest epoch: each is refused with ``path:line`` by
open, ``inspect``, ``verify``, and ``repair`` refuses to touch it; a worker never serves
it. Logs written before checksums still open, and gain them as they are written.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.support import loopd, running_daemon, wait_state
from worker import Assistant, ChecksumMismatch, Session, User
from worker.app import DefaultApp
from worker.store.epochs.carried_state import carried_digest
from worker.store.format.records import SessionStart, encode_appended, without_checksums
from worker.store.inspection import inspect_session
from worker.store.request_records import sealed_records

T = "2026-11-29T20:17:57.123456Z"


def _session(home: Path, name: str, *, epochs: int = 2, requests: int = 30) -> Path:
    """A session of ``epochs`` epochs of ``requests`` keyed requests (User + Assistant)."""
    with Session.create(home, name, DefaultApp().initial_baseline(name)) as session:
        for epoch in range(epochs):
            for n in range(requests):
                topic = f"topic {epoch * requests + n}"
                session.append_many(
                    [
                        User(time=T, text=topic, key=f"{name}-{epoch}-{n}"),
                        Assistant(time=T, text=f"about {topic}"),
                    ]
                )
            if epoch < epochs - 1:
                session.commit_epoch(f"summary {epoch}", session.baseline)
        return Path(session.dir)


def _line_of(log: Path, needle: bytes) -> int:
    """The number (from 1) of the first line of ``log`` holding ``needle``."""
    for number, line in enumerate(log.read_bytes().splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {log}")


def _flip_in_sealed(directory: Path, topic: bytes = b"28") -> tuple[Path, int]:
    """``"about topic 28"`` -> ``"about topic 2!"`` in epoch 0: still valid JSON, same length."""
    log = directory / "0.jsonl"
    text = b'"about topic ' + topic + b'"'
    line = _line_of(log, text)
    data = log.read_bytes()
    log.write_bytes(data.replace(text, text[:-2] + b'!"', 1))
    return log, line


def _cut_sealed(directory: Path) -> tuple[Path, int]:
    """Epoch 0 cut at a line boundary: its EpochEnd and the request before it gone."""
    log = directory / "0.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-3]))
    return log, len(lines) - 2


def _delete_in_newest(directory: Path) -> tuple[Path, int]:
    """A whole request (its two lines) deleted from the middle of the newest log."""
    log = directory / "1.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    del lines[11:13]  # request 5: lines 12 and 13 (SessionStart, then two lines a request)
    log.write_bytes(b"".join(lines))
    return log, 12


def _swap_in_newest(directory: Path) -> tuple[Path, int]:
    """Two whole requests swapped in the newest log (each still a whole group)."""
    log = directory / "1.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[11:13], lines[13:15] = lines[13:15], lines[11:13]
    log.write_bytes(b"".join(lines))
    return log, 12


def _duplicate_in_newest(directory: Path) -> tuple[Path, int]:
    """The last line of the newest log written twice."""
    log = directory / "1.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join([*lines, lines[-1]]))
    return log, len(lines) + 1


DAMAGE: dict[str, Callable[[Path], tuple[Path, int]]] = {
    "flip-in-sealed-epoch": _flip_in_sealed,
    "cut-sealed-epoch-at-a-line-boundary": _cut_sealed,
    "line-deleted-in-newest-epoch": _delete_in_newest,
    "pair-swapped-in-newest-epoch": _swap_in_newest,
    "line-duplicated-in-newest-epoch": _duplicate_in_newest,
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_refused_with_its_place_by_open_inspect_verify_and_repair(
    home: Path, kind: str
) -> None:
    directory = _session(home, "s1")
    log, line = DAMAGE[kind](directory)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    place = f"{log}:{line}: "

    with pytest.raises(ChecksumMismatch) as caught:
        Session.open(home, "s1")
    assert str(caught.value).startswith(place)

    inspected = loopd("inspect", "--home", str(home), "s1")
    assert inspected.returncode == 1
    assert inspected.stderr.startswith(place), inspected.stderr

    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 1
    assert f"REFUSED  s1  {place}" in verified.stdout, verified.stdout

    repaired = loopd("repair", "--home", str(home), "s1")
    assert repaired.returncode == 1
    assert "refused" in repaired.stderr
    assert place in repaired.stderr, repaired.stderr

    # Nothing was changed by reading or by the refused repair.
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before
    assert not (home / "quarantine").exists()


def test_a_worker_never_serves_a_damaged_session_its_start_goes_fatal_naming_the_line(
    home: Path,
) -> None:
    places = {}
    for kind, damage in DAMAGE.items():
        log, line = damage(_session(home, kind))
        places[kind] = f"{log}:{line}: "
    with running_daemon(home):
        for kind, place in places.items():
            row = wait_state(home, kind, "FATAL")
            assert str(row["last_error"]).startswith(place), row["last_error"]
            started = loopd("start", "--home", str(home), kind)
            assert started.returncode != 0
            assert place in started.stdout + started.stderr
            assert wait_state(home, kind, "FATAL")["last_error"] == row["last_error"]


def test_open_reads_the_older_sealed_epochs_only_through_verify_and_the_sealed_reader(
    home: Path,
) -> None:
    """Open reads the newest epoch and the one before it; older damage is verify's."""
    directory = _session(home, "s1", epochs=3, requests=20)
    log, line = _flip_in_sealed(directory, b"8")
    with Session.open(home, "s1") as session:
        assert session.epoch == 2
    verified = loopd("verify", "--home", str(home))
    assert f"REFUSED  s1  {log}:{line}: checksum mismatch" in verified.stdout
    inspected = loopd("inspect", "--home", str(home), "--all", "s1")
    assert inspected.returncode == 1
    assert inspected.stderr.startswith(f"{log}:{line}: ")
    # The reader of a sealed epoch's records (a duplicate's answer, a page) refuses it.
    with Session.open(home, "s1") as session:
        with pytest.raises(ChecksumMismatch, match=f"^{log}:{line}: "):
            sealed_records(session, 0)
        assert len(sealed_records(session, 1)) == 42


def test_a_sealed_log_with_a_line_added_after_its_end_is_refused(home: Path) -> None:
    directory = _session(home, "s1", requests=3)
    log = directory / "0.jsonl"
    data = log.read_bytes()
    extra = encode_appended(data, Assistant(time=T, text="added later"))
    log.write_bytes(data + extra)
    lines = data.count(b"\n")
    with pytest.raises(ChecksumMismatch, match="bytes were added after its end") as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(log), lines + 1)


def test_every_line_the_store_writes_carries_the_crc_of_the_log_before_it(home: Path) -> None:
    directory = _session(home, "s1", requests=2)
    for name in ("0.jsonl", "1.jsonl"):
        data = (directory / name).read_bytes()
        for line in data.splitlines():
            assert line.endswith(b'"}')
            assert json.loads(line)["crc"] == line[-10:-2].decode()
    first = json.loads((directory / "1.jsonl").read_bytes().split(b"\n")[0])
    sealed = (directory / "0.jsonl").read_bytes()
    assert first["prior_log_size"] == len(sealed)
    assert first["prior_log_crc"] == f"{zlib.crc32(sealed):08x}"


def test_a_home_written_before_checksums_opens_and_gains_them_as_it_is_written(
    home: Path,
) -> None:
    directory = _session(home, "s1", requests=3)
    # As a loopd before checksums wrote it: no crc on any line, no binding and no fence in
    # SessionStart, and the EpochEnd before it binding the five fields that are left.
    for log in sorted(directory.glob("*.jsonl"), reverse=True):
        lines = without_checksums(log.read_bytes()).splitlines(keepends=True)
        start = json.loads(lines[0])
        if start.pop("prior_log_size", None) is not None:
            for name in ("prior_log_crc", "fence_token", "fence_node"):
                del start[name]
            lines[0] = json.dumps(start, separators=(",", ":")).encode() + b"\n"
            sealed = log.with_name(f"{start['epoch'] - 1}.jsonl")
            older = without_checksums(sealed.read_bytes()).splitlines(keepends=True)
            end = json.loads(older[-1])
            end["carried"] = carried_digest({name: start[name] for name in SessionStart.CARRIED})
            older[-1] = json.dumps(end, separators=(",", ":")).encode() + b"\n"
            sealed.write_bytes(b"".join(older))
        log.write_bytes(b"".join(lines))
    assert b'"crc"' not in (directory / "1.jsonl").read_bytes()
    verified = loopd("verify", "--home", str(home))
    assert verified.returncode == 0, verified.stdout
    with Session.open(home, "s1") as session:
        assert session.find_key("s1-0-1") is not None
        session.append_many([User(text="new", key="after"), Assistant(text="answer")])
        session.commit_epoch("after the upgrade", session.baseline)
    newest = (directory / "1.jsonl").read_bytes().splitlines()
    assert b'"crc"' not in newest[0]  # the old lines stay as they were
    assert newest[-1].endswith(b'"}')
    assert b',"crc":"' in newest[-1]
    assert b'"prior_log_size"' in (directory / "2.jsonl").read_bytes()
    assert loopd("verify", "--home", str(home)).returncode == 0
    # The new lines chain over the old ones: deleting an old line is refused now.
    log = directory / "1.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join([lines[0], *lines[2:]]))
    with pytest.raises(ChecksumMismatch):
        inspect_session(home, "s1", history=True)


def test_a_line_without_a_checksum_after_checksummed_lines_is_refused(home: Path) -> None:
    directory = _session(home, "s1", epochs=1, requests=3)
    log = directory / "0.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    lines[-1] = without_checksums(lines[-1])
    log.write_bytes(b"".join(lines))
    with pytest.raises(ChecksumMismatch, match="line has no checksum") as caught:
        Session.open(home, "s1")
    assert caught.value.line == len(lines)
