"""Which epochs a session directory holds, and reading an epoch's baseline."""

from __future__ import annotations

import errno
import os
import re
from typing import Final

from worker.store.baseline import Baseline, hash_bytes
from worker.store.disk.files import Directory, list_names, read_file
from worker.store.errors import BaselineError, InvalidLog, SessionIOError, SessionNotFound, quote
from worker.store.session_state import log_path

_LOG_NAME: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
_DIGITS_LOG: Final = re.compile(r"[0-9]+\.jsonl")
_MISSING: Final = frozenset({errno.ENOENT})


def list_epochs(session_dir: str, dir_fd: Directory | None = None) -> list[int]:
    """Return the epoch numbers that have a log, ascending; refuse gaps and odd names."""
    try:
        names = os.listdir(session_dir) if dir_fd is None else list_names(dir_fd)
    except OSError as exc:
        if exc.errno in _MISSING:
            raise SessionNotFound(session_dir) from exc
        raise SessionIOError(session_dir, exc.errno or 0, "list directory") from exc
    epochs = []
    for name in names:
        if _LOG_NAME.fullmatch(name):
            epochs.append(int(name[: -len(".jsonl")]))
        elif _DIGITS_LOG.fullmatch(name):
            raise InvalidLog(os.path.join(session_dir, name), 1, "epoch number has a leading zero")
    epochs.sort()
    if not epochs:
        raise SessionNotFound(session_dir)
    if epochs[0] != 0:
        raise InvalidLog(
            log_path(session_dir, epochs[0]), 1, "0.jsonl is missing: the log has no first epoch"
        )
    for expected, epoch in enumerate(epochs):
        if epoch != expected:
            raise InvalidLog(
                log_path(session_dir, epoch),
                1,
                f"gap in epochs: {expected}.jsonl is missing before {epoch}.jsonl",
            )
    return epochs


def load_baseline(dir_fd: Directory, path: str, expected_hash: str) -> Baseline:
    """Read, hash and parse a baseline; BaselineError if missing, unparsable or mismatched."""
    try:
        data = read_file(dir_fd, os.path.basename(path), path)
    except SessionIOError as exc:
        if exc.errno in _MISSING:
            raise BaselineError(path, "baseline file is missing") from exc
        raise
    actual = hash_bytes(data)
    if actual != expected_hash:
        raise BaselineError(
            path,
            f"baseline hashes to {actual}, SessionStart.baseline says {quote(expected_hash, 80)}",
        )
    try:
        return Baseline.from_json(data)
    except ValueError as exc:
        raise BaselineError(path, f"baseline is unparsable: {exc}") from exc
