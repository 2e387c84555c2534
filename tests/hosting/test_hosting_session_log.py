"""Per-session logs: timestamped whole lines, rotation at the byte limit, follow across it."""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

from supervisor.hosting.log_reader import follow, last_lines
from supervisor.hosting.session_log import MAX_PARTIAL, SessionLog, log_path

STAMP = rb"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z "


def test_every_line_is_prefixed_with_a_utc_timestamp_and_partial_lines_wait(
    tmp_path: Path,
) -> None:
    path = log_path(str(tmp_path), "s1")
    log = SessionLog(path, max_bytes=1 << 20, backups=2)
    log.feed(b"one\ntw")
    assert Path(path).read_bytes().count(b"\n") == 1
    log.feed(b"o\nthree")
    log.close()  # the partial last line is written at close
    lines = Path(path).read_bytes().splitlines()
    assert [re.sub(STAMP, b"", line) for line in lines] == [b"one", b"two", b"three"]
    assert all(re.match(STAMP, line) for line in lines)


def test_the_log_rotates_at_the_byte_limit_and_keeps_only_its_backups(tmp_path: Path) -> None:
    path = log_path(str(tmp_path), "s1")
    log = SessionLog(path, max_bytes=1000, backups=2)
    for n in range(200):
        log.feed(b"line %03d\n" % n)  # 34 bytes a line with its stamp
    log.close()
    names = sorted(os.listdir(tmp_path / "logs"))
    assert names == ["s1.log", "s1.log.5", "s1.log.6"]  # rotated 6 times, the last 2 kept
    for name in names:
        size = (tmp_path / "logs" / name).stat().st_size
        assert size <= 1000
        assert size > 1000 - 34 or name == "s1.log"  # a file is rotated only when full
    newest = Path(path).read_bytes().splitlines()
    assert newest[-1].endswith(b"line 199")
    kept = last_lines(path, 1000)
    assert len(kept) == 3 * (1000 // 34) - (1000 // 34 - len(newest))
    assert kept[-1].endswith(b"line 199\n")


def test_with_no_backups_a_full_log_starts_over(tmp_path: Path) -> None:
    path = log_path(str(tmp_path), "s1")
    log = SessionLog(path, max_bytes=100, backups=0)
    for n in range(10):
        log.feed(b"%d\n" % n)
    log.close()
    assert os.listdir(tmp_path / "logs") == ["s1.log"]
    assert Path(path).stat().st_size <= 100


def test_a_line_longer_than_the_partial_limit_is_written_in_pieces(tmp_path: Path) -> None:
    path = log_path(str(tmp_path), "s1")
    log = SessionLog(path, max_bytes=1 << 30, backups=1)
    log.feed(b"x" * (2 * MAX_PARTIAL + 5))
    log.close()
    assert Path(path).read_bytes().count(b"\n") == 3


def test_last_lines_reads_into_the_backup_when_the_log_is_short(tmp_path: Path) -> None:
    path = log_path(str(tmp_path), "s1")
    log = SessionLog(path, max_bytes=200, backups=1)
    for n in range(8):
        log.feed(b"n%d\n" % n)
    log.close()
    got = [re.sub(STAMP, b"", line) for line in last_lines(path, 7)]
    assert got == [b"n%d\n" % n for n in range(1, 8)]


def test_follow_yields_new_lines_and_goes_on_across_a_rotation(tmp_path: Path) -> None:
    path = log_path(str(tmp_path), "s1")
    log = SessionLog(path, max_bytes=300, backups=1)
    log.feed(b"before\n")
    seen = b""
    stream = follow(path, keep_going=lambda: b"after-rotation" not in seen)
    log.feed(b"first\n")
    seen += next(stream)
    for n in range(20):  # several rotations while the follower is not reading
        log.feed(b"filler %02d\n" % n)
    log.feed(b"after-rotation\n")
    for chunk in stream:
        seen += chunk
    log.close()
    assert b"before" not in seen  # following starts at the end
    assert b"first" in seen
    assert b"after-rotation" in seen


def _loopd(*args: str) -> list[str]:
    return [sys.executable, "-m", "supervisor", *args]


def test_loopd_logs_prints_the_last_lines_and_follows_new_ones(tmp_path: Path) -> None:
    path = log_path(str(tmp_path), "s1")
    log = SessionLog(path, max_bytes=1 << 20, backups=1)
    log.feed(b"".join(b"old %d\n" % n for n in range(10)))
    done = subprocess.run(
        _loopd("logs", "--home", str(tmp_path), "s1", "-n", "2"),
        capture_output=True, check=True, timeout=30,
    )  # fmt: skip
    assert [re.sub(STAMP, b"", line) for line in done.stdout.splitlines()] == [b"old 8", b"old 9"]
    follower = subprocess.Popen(
        _loopd("logs", "--home", str(tmp_path), "s1", "-n", "0", "-f"), stdout=subprocess.PIPE
    )
    try:
        assert follower.stdout is not None
        deadline = time.monotonic() + 20
        line = b""
        while b"fresh" not in line and time.monotonic() < deadline:
            log.feed(b"fresh\n")  # until the follower, started meanwhile, sees one
            ready, _, _ = select.select([follower.stdout], [], [], 0.5)
            if ready:
                line = follower.stdout.readline()
        assert re.fullmatch(STAMP + rb"fresh\n", line)
    finally:
        follower.terminate()
        follower.wait(timeout=10)
        assert follower.stdout is not None
        follower.stdout.close()
        log.close()


def test_loopd_logs_of_a_session_without_a_log_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        _loopd("logs", "--home", str(tmp_path), "s1"), check=False, capture_output=True, timeout=30
    )
    assert done.returncode == 1
    assert b"no log yet" in done.stderr
