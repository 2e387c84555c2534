"""append: durability before memory, call numbers, usage, and what failed I/O leaves."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.forge import reseal
from worker import (
    Assistant,
    Baseline,
    EpochClosed,
    InvalidRecord,
    Session,
    SessionBroken,
    SessionIOError,
    ToolResult,
    Usage,
    User,
)


def _tool(session: Session) -> ToolResult:
    return ToolResult(call=session.next_call(), tool="echo", output="x", ok=True)


def test_next_call_is_1_on_a_new_session_and_continues_after_reopen_and_epochs(
    home: Path, baseline: Baseline
) -> None:
    with Session.create(home, "s1", baseline) as session:
        assert session.next_call() == 1
        session.append(ToolResult(call=1, tool="echo", output="", ok=True))
        session.append(ToolResult(call=5, tool="echo", output="", ok=True))
    with Session.open(home, "s1") as session:
        assert session.next_call() == 6
        session.append(ToolResult(call=6, tool="echo", output="", ok=True))
        session.commit_epoch("first", baseline)
        assert session.next_call() == 7
        assert session.next_call() == 8  # handed out numbers are never handed out again
    with Session.open(home, "s1") as session:
        assert session.epoch == 1
        assert session.next_call() == 7


def test_a_reused_call_number_is_refused_and_nothing_is_written(
    home: Path, baseline: Baseline
) -> None:
    with Session.create(home, "s1", baseline) as session:
        session.append(ToolResult(call=1, tool="echo", output="", ok=True))
        size = os.path.getsize(session.log_path)
        with pytest.raises(InvalidRecord, match="reuses"):
            session.append(ToolResult(call=1, tool="echo", output="", ok=True))
        assert os.path.getsize(session.log_path) == size
        assert len(session.records) == 2


def test_a_repeated_request_key_is_refused(home: Path, baseline: Baseline) -> None:
    with Session.create(home, "s1", baseline) as session:
        session.append(User(text="a", key="k"))
        with pytest.raises(InvalidRecord, match="already in the log"):
            session.append(User(text="b", key="k"))
        session.commit_epoch("s", baseline)
        with pytest.raises(InvalidRecord, match="already in the log"):
            session.append(User(text="c", key="k"))
        ref = session.find_key("k")
        assert ref is not None
        assert (ref.epoch, ref.line) == (0, 2)


def test_last_usage_is_the_newest_usage_and_none_after_an_epoch_change(
    home: Path, baseline: Baseline
) -> None:
    with Session.create(home, "s1", baseline) as session:
        assert session.last_usage() is None
        first = Usage(prompt_tokens=1, completion_tokens=1, context_tokens=2)
        second = Usage(prompt_tokens=2, completion_tokens=2, context_tokens=4)
        session.append(first)
        session.append_many([Assistant(text="a"), second, Assistant(text="b")])
        assert session.last_usage() == second
    with Session.open(home, "s1") as session:
        assert session.last_usage() == second
        session.commit_epoch("done", baseline)
        assert session.last_usage() is None


def test_append_after_epoch_end_raises_epoch_closed(home: Path, baseline: Baseline) -> None:
    with Session.create(home, "s1", baseline) as session:
        path = session.log_path
    with open(path, "ab") as f:
        f.write(
            b'{"type":"EpochEnd","time":"2026-11-29T00:00:00.000000Z","next":1,"summary":"s"}\n'
        )
    reseal(Path(path).parent)
    with Session.open(home, "s1") as session:
        with pytest.raises(EpochClosed, match="closed by EpochEnd"):
            session.append(User(text="late"))
        assert session.epoch_closed


def test_invalid_records_are_refused_before_anything_is_written(
    home: Path, baseline: Baseline
) -> None:
    with Session.create(home, "s1", baseline) as session:
        size = os.path.getsize(session.log_path)
        with pytest.raises(InvalidRecord, match="must be an integer >= 1"):
            session.append(ToolResult(call=0, tool="t", output="", ok=True))
        with pytest.raises(InvalidRecord, match="not valid Unicode"):
            session.append(Assistant(text="\ud800"))
        with pytest.raises(InvalidRecord, match="must be a boolean"):
            session.append(User(text="x", untrusted=1))  # type: ignore[arg-type]
        assert os.path.getsize(session.log_path) == size
        assert len(session.records) == 1


# -- injected failures at the seam the store calls (os.write, os.fdatasync) ----------


def _fail_for_fd(
    monkeypatch: pytest.MonkeyPatch, name: str, fd: int, error: int, *, partial: bool = False
) -> None:
    """Make ``os.<name>`` fail with ``error`` for ``fd`` only (after a short write if asked)."""
    real: Callable[..., int | None] = getattr(os, name)
    calls = {"n": 0}

    def failing(target: int, *args: object) -> int | None:
        if target != fd:
            return real(target, *args)
        calls["n"] += 1
        if partial and calls["n"] == 1:
            data = bytes(args[0])  # type: ignore[call-overload]
            return real(target, data[: len(data) // 2])  # a short write, as on a full disk
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, name, failing)


@pytest.mark.parametrize(
    ("partial", "error"),
    [(False, errno.ENOSPC), (True, errno.ENOSPC), (False, errno.EIO)],
    ids=["enospc", "short-write-then-enospc", "eio"],
)
def test_a_failed_write_leaves_the_record_out_of_memory_and_the_file_at_its_old_length(
    home: Path, baseline: Baseline, monkeypatch: pytest.MonkeyPatch, partial: bool, error: int
) -> None:
    with Session.create(home, "s1", baseline) as session:
        session.append(User(text="kept"))
        size = os.path.getsize(session.log_path)
        fd = session._log_fd
        assert fd is not None
        with monkeypatch.context() as patch:
            _fail_for_fd(patch, "write", fd, error, partial=partial)
            with pytest.raises(SessionIOError) as caught:
                session.append(User(text="lost", key="k"))
        assert caught.value.path == session.log_path
        assert caught.value.errno == error
        assert session.log_path in str(caught.value)
        assert os.path.getsize(session.log_path) == size
        assert [r.text for r in session.records[1:]] == ["kept"]  # type: ignore[union-attr]
        assert session.find_key("k") is None
        # A failed write that was cut back cleanly leaves the session usable.
        session.append(User(text="after"))
    with Session.open(home, "s1") as session:
        assert [r.text for r in session.records[1:]] == ["kept", "after"]  # type: ignore[union-attr]


def test_a_failed_fdatasync_cuts_the_file_back_and_breaks_the_session(
    home: Path, baseline: Baseline, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session.create(home, "s1", baseline) as session:
        session.append(User(text="kept"))
        size = os.path.getsize(session.log_path)
        fd = session._log_fd
        assert fd is not None
        with monkeypatch.context() as patch:
            _fail_for_fd(patch, "fdatasync", fd, errno.EIO)
            with pytest.raises(SessionIOError, match=r"fdatasync failed: \[EIO\]") as caught:
                session.append_many([User(text="lost"), _tool(session)])
        assert caught.value.path == session.log_path
        assert os.path.getsize(session.log_path) == size
        assert len(session.records) == 2
        assert session.broken is not None
        # Never retried and trusted: every later append is refused, even with fsync healthy.
        with pytest.raises(SessionBroken, match="fdatasync failed"):
            session.append(User(text="retry"))
        assert os.path.getsize(session.log_path) == size
    with Session.open(home, "s1") as session:
        assert len(session.records) == 2


def test_a_write_that_cannot_be_cut_back_breaks_the_session(
    home: Path, baseline: Baseline, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Session.create(home, "s1", baseline) as session:
        fd = session._log_fd
        assert fd is not None
        with monkeypatch.context() as patch:
            _fail_for_fd(patch, "write", fd, errno.ENOSPC, partial=True)
            _fail_for_fd(patch, "ftruncate", fd, errno.EIO)
            with pytest.raises(SessionIOError, match="write failed"):
                session.append(User(text="lost"))
        with pytest.raises(SessionBroken, match="could not be cut back"):
            session.append(User(text="next"))
