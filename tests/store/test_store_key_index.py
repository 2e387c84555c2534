"""Every request key of a session is found from the newest epoch alone: the key index.

Open reads the newest epoch and the index files its SessionStart names (checking their
digests); a key of any older epoch is found and confirmed against its sealed log, a new
key never is; the store refuses to write a key twice; `loopd verify` rebuilds the index
from the logs; a session written before the index opens and gains it at its next commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from tests.harness.forge import reseal
from tests.harness.support import loopd
from worker import Baseline, InvalidLog, InvalidRecord, Session, SessionStart, ToolResult, User
from worker.store import key_index
from worker.store.epochs.carried_state import carried_digest
from worker.store.errors import KeyIndexFileError
from worker.store.format.records import EpochEnd, decode_record, encode_record
from worker.store.loader import load_session

BASELINE = Baseline(system="s", memory="", tools=[])
T = "2026-11-29T20:17:57.123456Z"


def _epochs(home: Path, epochs: int, per_epoch: int = 3, name: str = "s1") -> Path:
    """A session of ``epochs`` epochs; key ``e<epoch>-<n>`` at line 2 + 2n of its epoch."""
    with Session.create(home, name, BASELINE) as session:
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


def _first(log: Path) -> SessionStart:
    start = decode_record(log.read_bytes().split(b"\n", 1)[0])
    assert isinstance(start, SessionStart)
    return start


def _rewrite_line(log: Path, index: int, **changes: object) -> None:
    """Rewrite line ``index`` of ``log`` (from 0; -1 the last) with some fields changed."""
    lines = log.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[index])
    record.pop("crc", None)  # a forger's change: the checksums are made to match (reseal)
    for name, value in changes.items():
        if value is None:
            del record[name]
        else:
            record[name] = value
    lines[index] = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    log.write_bytes(b"".join(lines))
    reseal(log.parent)


def _verify(home: Path) -> tuple[int, str]:
    ran = loopd("verify", "--home", str(home))
    return ran.returncode, ran.stdout


def test_every_key_of_thirteen_epochs_is_found_from_the_newest_epoch_and_its_index(
    home: Path,
) -> None:
    directory = _epochs(home, 13)
    # 12 sealed epochs: the ranges 0-7 and 8-11, one file each.
    assert sorted(p.name for p in directory.glob("*.keys")) == ["0-7.keys", "8-11.keys"]
    assert [s.split(":")[0] for s in str(_first(directory / "12.jsonl").key_index).split(",")] == [
        "0-7",
        "8-11",
    ]
    assert load_session(str(directory), "s1").first_read == 12
    with Session.open(home, "s1") as session:
        for epoch in range(13):
            for n in range(3):
                ref = session.find_key(f"e{epoch}-{n}")
                assert ref is not None, (epoch, n)
                assert (ref.epoch, ref.line) == (epoch, 2 + 2 * n)
        assert session.find_key("e13-0") is None
        assert session.find_key("never sent") is None
    assert _verify(home) == (0, "ok       s1  epoch 12  records 7\n1 sessions, 0 refused\n")


def test_an_epoch_commit_merges_the_ranges_below_it_and_removes_the_files_it_replaced(
    home: Path,
) -> None:
    directory = _epochs(home, 16)  # 15 sealed: 0-7, 8-11, 12-13, 14-14
    assert sorted(p.name for p in directory.glob("*.keys")) == [
        "0-7.keys", "12-13.keys", "14-14.keys", "8-11.keys",
    ]  # fmt: skip
    with Session.open(home, "s1") as session:
        session.commit_epoch("summary 15", BASELINE)  # 16 sealed: 0-15
        assert session.find_key("e3-2") is not None
    assert [p.name for p in directory.glob("*.keys")] == ["0-15.keys"]
    assert (directory / "0-15.keys").stat().st_size == 16 * 16 * 3
    with Session.open(home, "s1") as session:
        assert {session.find_key(f"e{e}-1") is not None for e in range(16)} == {True}


def test_a_hash_collision_never_answers_a_new_key_as_applied(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_index, "key_hash", lambda key: 7)  # every key collides
    _epochs(home, 5)
    with Session.open(home, "s1") as session:
        assert session.find_key("new") is None
        ref = session.find_key("e1-2")
        assert ref is not None
        assert (ref.epoch, ref.line) == (1, 6)
        session.append(User(time=T, text="new", key="new"))  # new, though its hash is known
        assert session.find_key("new") is not None


def test_the_store_refuses_to_write_a_key_applied_in_any_older_epoch(home: Path) -> None:
    _epochs(home, 5)
    with Session.open(home, "s1") as session:
        with pytest.raises(InvalidRecord, match="key 'e0-1' is already in the log"):
            session.append(User(time=T, text="again", key="e0-1"))
        session.append(User(time=T, text="new", key="e9-9"))


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("missing", "SessionStart.key_index names 0-3.keys, which is missing"),
        ("changed", "SessionStart.key_index says 0-3.keys hashes to"),
        ("emptied", "SessionStart.key_index says 0-3.keys hashes to"),
    ],
)
def test_open_and_verify_refuse_an_index_file_that_is_missing_or_changed_and_repair_rebuilds_it(
    home: Path, damage: str, why: str
) -> None:
    directory = _epochs(home, 5)
    index = directory / "0-3.keys"
    if damage == "missing":
        index.unlink()
    elif damage == "changed":
        data = bytearray(index.read_bytes())
        data[3] ^= 1
        index.write_bytes(bytes(data))
    else:
        index.write_bytes(b"")
    newest = directory / "4.jsonl"
    with pytest.raises(InvalidLog, match=why) as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(newest), 1)
    assert isinstance(caught.value, KeyIndexFileError)
    assert "`loopd repair ID` rebuilds it" in str(caught.value)
    code, out = _verify(home)
    assert code == 1
    assert f"{newest}:1: {why}" in out
    repaired = loopd("repair", "--home", str(home), "s1")
    assert repaired.returncode == 0, repaired.stderr
    assert repaired.stdout.startswith(f"rebuilt the key index from the logs ({newest}:1: {why}")
    assert f"   {index}\n" in repaired.stdout
    with Session.open(home, "s1") as session:
        assert session.find_key("e0-2") is not None
    assert _verify(home)[0] == 0


def test_verify_refuses_a_key_index_that_does_not_match_the_logs(home: Path) -> None:
    directory = _epochs(home, 3)  # 2 sealed: 0-1
    # An index without the key e1-2, named with its own digest: open trusts what the
    # SessionStart and its EpochEnd digest say; verify rebuilds it from the logs.
    shown = key_index.KeyIndex()
    entries = [key_index.entry(f"e{e}-{n}", e, 2 + 2 * n) for e in (0, 1) for n in range(3)]
    short, segments = shown.extended(2, entries[:-1])
    key_index.write_segments(str(directory), segments)
    _rewrite_line(directory / "2.jsonl", 0, key_index=short.field())
    digest = carried_digest(_first(directory / "2.jsonl").carried_fields)
    _rewrite_line(directory / "1.jsonl", -1, carried=digest)
    code, out = _verify(home)
    assert code == 1
    assert "2.jsonl:1: SessionStart.key_index does not match the request keys of epochs 0-1" in out


def test_a_session_written_before_the_index_finds_every_key_and_gains_it_at_its_next_commit(
    home: Path,
) -> None:
    directory = _epochs(home, 4)
    # As the store wrote it before the index: the four carried fields, no digest.
    for epoch in (1, 2, 3):
        _rewrite_line(
            directory / f"{epoch}.jsonl",
            0,
            key_index=None,
            prior_log_size=None,
            prior_log_crc=None,
            fence_token=None,
            fence_node=None,
        )
        _rewrite_line(directory / f"{epoch - 1}.jsonl", -1, carried=None)
    for index in directory.glob("*.keys"):
        index.unlink()
    assert load_session(str(directory), "s1").first_read == 0  # the history is read
    with Session.open(home, "s1") as session:
        ref = session.find_key("e0-1")
        assert ref is not None
        assert (ref.epoch, ref.line) == (0, 4)
        session.commit_epoch("summary 3", BASELINE)
    assert _first(directory / "4.jsonl").key_index == f"0-3:{_digest(directory / '0-3.keys')}"
    end = decode_record((directory / "3.jsonl").read_bytes().splitlines()[-1])
    assert isinstance(end, EpochEnd)
    assert end.carried is not None
    assert load_session(str(directory), "s1").first_read == 4
    with Session.open(home, "s1") as session:
        assert {session.find_key(f"e{e}-{n}") is not None for e in range(4) for n in range(3)} == {
            True
        }
    assert _verify(home)[0] == 0


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_key_applied_again_beyond_the_old_window_is_refused_by_open_and_verify(
    home: Path,
) -> None:
    directory = _epochs(home, 4)
    log = directory / "3.jsonl"
    # A line applying e0-1 again, written behind the store's back.
    with log.open("ab") as f:
        f.write(encode_record(User(time=T, text="again", key="e0-1")))
    reseal(directory)
    lines = len(log.read_bytes().splitlines())
    why = "request key 'e0-1' was already applied (epoch 0, line 4)"
    with pytest.raises(InvalidLog, match=re.escape(why)) as caught:
        Session.open(home, "s1")
    assert (caught.value.path, caught.value.line) == (str(log), lines)
    code, out = _verify(home)
    assert code == 1
    assert f"{log}:{lines}: {why}" in out


def test_a_stale_index_file_left_by_a_crash_is_removed_by_the_next_commit(home: Path) -> None:
    directory = _epochs(home, 3)
    (directory / "0-0.keys").write_bytes(b"left by a crash")
    with Session.open(home, "s1") as session:
        session.commit_epoch("summary 2", BASELINE)
    assert sorted(p.name for p in directory.glob("*.keys")) == ["0-1.keys", "2-2.keys"]
    assert not [n for n in os.listdir(directory) if n.endswith(".tmp")]
