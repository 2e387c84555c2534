"""``loopd logs``: the last lines of a session's log, and following it across rotations."""

from __future__ import annotations

import io
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final

from supervisor.hosting.session_log import backup_path

FOLLOW_INTERVAL: Final = 0.2
"""Seconds between looks at a followed file (as ``tail -f`` does without inotify)."""
_CHUNK: Final = 64 * 1024


def existing_backups(path: str) -> int:
    """How many numbered backups (``.1``, ``.2``, ...) of the log exist, without a gap."""
    n = 0
    while os.path.exists(backup_path(path, n + 1)):
        n += 1
    return n


def last_lines(path: str, count: int, backups: int | None = None) -> list[bytes]:
    """The last ``count`` lines of the log, reaching into its backups if it is short."""
    if backups is None:
        backups = existing_backups(path)
    wanted: deque[bytes] = deque(maxlen=max(count, 0))
    for name in [backup_path(path, n) for n in range(backups, 0, -1)] + [path]:
        try:
            with open(name, "rb") as file:
                # Reading whole files is bounded: a log is at most --log-max-bytes.
                wanted.extend(file.read().splitlines(keepends=True))
        except FileNotFoundError:
            continue
    return list(wanted) if count > 0 else []


def follow(
    path: str, *, from_end: bool = True, keep_going: Callable[[], bool] = lambda: True
) -> Iterator[bytes]:
    """Yield what is appended to ``path``; when it is rotated, go on with the new file.

    The file is opened (and its end found) on the call, not at the first ``next``, so
    nothing written in between is missed.
    """
    file = _open_or_none(path)
    if file is not None and from_end:
        file.seek(0, os.SEEK_END)
    return _follow(path, file, keep_going)


def _follow(path: str, file: io.FileIO | None, keep_going: Callable[[], bool]) -> Iterator[bytes]:
    try:
        while keep_going():
            if file is not None:
                data = file.read(_CHUNK)
                if data:
                    yield data
                    continue
                if _replaced(path, file.fileno()):
                    # Rotated: what the writer added to the old file between the empty
                    # read above and the rename is read now, then the new file is started.
                    while tail := file.read(_CHUNK):
                        yield tail
                    file.close()
                    file = _open_or_none(path)
                    continue
            else:
                file = _open_or_none(path)
                if file is not None:
                    continue
            time.sleep(FOLLOW_INTERVAL)
    finally:
        if file is not None:
            file.close()


def _open_or_none(path: str) -> io.FileIO | None:
    try:
        return io.FileIO(path, "rb")
    except FileNotFoundError:
        return None


def _replaced(path: str, fd: int) -> bool:
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev)
