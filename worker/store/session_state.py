"""What open learns of a session's files, and where each epoch's files are named."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from worker.store.baseline import Baseline
from worker.store.fencing import NO_FENCE, Fence
from worker.store.format.dataclass_methods import MutableValue
from worker.store.format.epoch_records import EpochRecords
from worker.store.format.kept_scan import KeptScan
from worker.store.format.scan_summary import ScanSummary
from worker.store.key_index import KeyIndex


def log_path(session_dir: str, epoch: int) -> str:
    """Return the path of epoch ``epoch``'s log."""
    return os.path.join(session_dir, f"{epoch}.jsonl")


def baseline_path(session_dir: str, epoch: int) -> str:
    """Return the path of epoch ``epoch``'s baseline."""
    return os.path.join(session_dir, f"{epoch}.baseline.json")


@dataclass(slots=True, repr=False, eq=False)
class KeyRef(MutableValue):
    """Where a request key was applied: its epoch and line (from 1) in that epoch's log."""

    epoch: int
    line: int


@dataclass(slots=True, repr=False, eq=False)
class SessionState(MutableValue):
    """Everything ``open`` learns from the files of a session."""

    session_id: str
    directory: str
    epoch: int
    slot: int
    baseline: Baseline
    records: EpochRecords
    log_size: int
    carry: str | None
    prior_users: int = 0
    prior_untrusted: int = 0
    max_call: int = 0
    # The keys of the epochs the index does not cover (the current and the previous
    # one; every epoch read, when open read the history) ...
    keys: dict[str, KeyRef] = field(default_factory=dict)
    # ... an older place of a key found again beyond the retry window, in a log written
    # before keys were exact (``keys`` holds its newest place) ...
    repeats: list[tuple[str, KeyRef]] = field(default_factory=list)
    # ... and the index of every sealed epoch before ``key_index.covers``.
    key_index: KeyIndex = field(default_factory=KeyIndex)
    epoch_sizes: list[int] = field(default_factory=list)  # of the epochs read, oldest first
    first_read: int = 0  # the oldest epoch whose log was read
    next_call: int = 1  # the next tool call number (> max_call, maybe more: reserved ones)
    fence: Fence = NO_FENCE  # Owner and Handoff of the epochs read (worker.store.fencing)
    # False when the newest SessionStart was written before the fence was carried: the
    # fence then knows only this epoch's Owner records (worker/store/epochs/carried_state.py).
    fence_known: bool = True
    log_crc: int = 0  # CRC-32 of the newest log's bytes: the next line's checksum continues it
    # Open's scan of the newest log, to keep for the next open (store.format.scan_summary);
    # None when it scanned little or the log was decoded line by line.
    scan_summary: ScanSummary | None = None
    # The newest log as the writer keeps its summary going (store.format.kept_scan);
    # None when its lines were decoded one by one (no scan, no summary).
    kept_scan: KeptScan | None = None
