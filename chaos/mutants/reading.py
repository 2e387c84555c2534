"""Mutants that break reading a session: refusals, repairs and the lock."""

from __future__ import annotations

import os

from worker import layout, loader, lock, session
from worker.errors import TornLog
from worker.records import Record


def silent_torn_tail_repair() -> None:
    original = loader.decode_log

    def decode_log(path: str, data: bytes) -> list[Record]:
        try:
            return original(path, data)
        except TornLog:
            if data.endswith(b"\n"):
                raise
            keep = data[: data.rfind(b"\n") + 1]
            os.truncate(path, len(keep))  # the bug: repair without being asked
            return original(path, keep)

    loader.decode_log = decode_log


def no_lock() -> None:
    def lock_directory(path: str, *, shared: bool = False) -> int:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    # Every module that took the name at import time.
    session.lock_directory = lock_directory  # type: ignore[attr-defined]
    layout.lock_directory = lock_directory  # type: ignore[attr-defined]
    lock.lock_directory = lock_directory
