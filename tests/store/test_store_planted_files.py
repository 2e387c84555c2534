"""Files planted in a session's place: FIFOs, devices, directories and links are never served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import file_digests
from tests.harness.keyed_sessions import four_record_session
from worker import (
    Baseline,
    Session,
    SessionError,
    SessionIOError,
)
from worker.store.errors import UnsafeFile


@pytest.mark.timeout(20)
@pytest.mark.parametrize("name", ["0.jsonl", "0.baseline.json"])
@pytest.mark.parametrize("kind", ["fifo", "dev-zero-link", "directory", "outside-link"])
def test_open_refuses_a_session_file_that_is_not_a_regular_file(
    home: Path, baseline: Baseline, tmp_path: Path, name: str, kind: str
) -> None:
    log = four_record_session(home, baseline, requests=1)
    target = log.parent / name
    original = target.read_bytes()
    outside = tmp_path / "outside"
    outside.write_bytes(original)
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "dev-zero-link":
        target.symlink_to("/dev/zero")
    elif kind == "directory":
        target.mkdir()
    else:
        target.symlink_to(outside)
    with pytest.raises(UnsafeFile, match=r"symbolic link|not a regular file") as caught:
        Session.open(home, "s1")
    assert caught.value.path == str(target)
    assert outside.read_bytes() == original


def test_a_session_directory_that_is_a_link_is_never_served(
    home: Path, baseline: Baseline, tmp_path: Path
) -> None:
    four_record_session(home, baseline, requests=1)
    real = home / "sessions" / "s1"
    elsewhere = tmp_path / "elsewhere"
    real.rename(elsewhere)
    real.symlink_to(elsewhere)
    before = file_digests(elsewhere)
    with pytest.raises(UnsafeFile, match="symbolic link"):
        Session.open(home, "s1")
    with pytest.raises(SessionError):
        Session.open_or_create(home, "s1", baseline)
    assert file_digests(elsewhere) == before


def test_a_planted_link_in_place_of_a_temporary_file_is_not_written_through(
    home: Path, baseline: Baseline, tmp_path: Path
) -> None:
    four_record_session(home, baseline, requests=1)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me\n")
    (home / "sessions" / "s1" / "1.baseline.json.tmp").symlink_to(victim)
    with (
        Session.open(home, "s1") as session,
        pytest.raises(SessionIOError, match="ELOOP"),
    ):
        session.commit_epoch("done", baseline)
    assert victim.read_bytes() == b"keep me\n"
