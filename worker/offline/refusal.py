"""What kind of damage a refused session has: each kind has its own next step.

Open raises the first problem it finds (``path:line: why``); the operator's next step
depends on where it is and what it is, not only on its text:

- ``torn_tail``: the newest log's last group is damaged, as a crash mid-write leaves it
  (``loopd repair`` moves it aside);
- ``newest``: damage inside the newest log that is not a torn tail (a deleted, reordered
  or flipped line): restore from a backup, or ``loopd salvage`` keeps the intact prefix;
- ``sealed``: damage in a sealed (older) epoch's log: restore from a backup;
- ``missing_baseline``: epoch 0's baseline is missing (``loopd repair --rebuild-baseline``
  rebuilds it from the App when its hash matches the one in SessionStart);
- ``baseline``: another baseline problem (restore from a backup);
- ``key_index``: a key index file (``loopd repair`` rebuilds the index from the logs);
- ``unsafe``: a file of the session is a link, a FIFO or a device.
"""

from __future__ import annotations

import os
from typing import Final

from worker.offline.repair import RepairRefused, find_cut
from worker.store.disk.files import open_directory, read_file
from worker.store.errors import (
    BaselineError,
    KeyIndexFileError,
    LogError,
    SessionError,
    SessionIOError,
    TornLog,
    UnsafeFile,
)
from worker.store.loader import baseline_path, list_epochs, log_path

KINDS: Final = (
    "torn_tail",
    "newest",
    "sealed",
    "missing_baseline",
    "baseline",
    "key_index",
    "unsafe",
    "other",
)


def refusal_kind(directory: str, problem: SessionError) -> str:
    """The kind of ``problem`` (one of ``KINDS``), which open raised for ``directory``.

    Reads the directory's listing and, for damage in the newest log, that log again (the
    session is being refused: this runs once, never on a served path).
    """
    if isinstance(problem, KeyIndexFileError):
        return "key_index"
    if isinstance(problem, UnsafeFile):
        return "unsafe"
    if isinstance(problem, BaselineError):
        if problem.path == baseline_path(directory, 0) and problem.why.endswith("missing"):
            return "missing_baseline"
        return "baseline"
    if not isinstance(problem, LogError):
        return "other"
    try:
        fd = open_directory(directory)
    except SessionError:
        return "other"
    try:
        epochs = list_epochs(directory, fd)
        newest = log_path(directory, epochs[-1])
        if problem.path != newest:
            return "sealed"
        data = read_file(fd, os.path.basename(newest), newest)
    except (SessionError, SessionIOError):
        return "other"
    finally:
        os.close(fd)
    if not isinstance(problem, TornLog):
        return "newest"
    try:
        find_cut(newest, data, problem)
    except RepairRefused:
        return "newest"
    return "torn_tail"
