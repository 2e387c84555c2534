"""A new session's first files, and the directory names a create must make durable."""

from __future__ import annotations

import os

from worker.store.baseline import Baseline
from worker.store.disk import durable
from worker.store.errors import InvalidRecord, quote
from worker.store.format.epoch_records import EpochRecords
from worker.store.format.kept_scan import KeptScan
from worker.store.format.records import SessionStart, encode_lines
from worker.store.session_state import SessionState, baseline_path, log_path


def check_slot(slot: int) -> None:
    """Refuse a slot that is not an integer >= 0 (InvalidRecord)."""
    if type(slot) is not int or slot < 0:
        raise InvalidRecord("SessionStart", f"slot must be an integer >= 0, got {quote(slot)}")


def sync_parents(directory: str) -> None:
    """Make the session directory's name durable: fsync ``sessions/`` and the home."""
    sessions = os.path.dirname(directory)
    durable.fsync_dir(sessions)
    durable.fsync_dir(os.path.dirname(sessions))


def write_first_epoch(
    directory: str, session_id: str, baseline: Baseline, slot: int
) -> tuple[SessionState, int]:
    """Write epoch 0 into the locked, log-less ``directory``: its state and log's fd."""
    start = SessionStart(session=session_id, epoch=0, slot=slot, baseline=baseline.hash())
    line, crc = encode_lines((start,), 0)
    # The baseline's name is made durable before the log that names its hash,
    # so no crash can leave a log whose baseline is missing.
    durable.write_file_atomic(baseline_path(directory, 0), baseline.to_json())
    durable.write_file_atomic(log_path(directory, 0), line)
    log_fd = durable.open_append(log_path(directory, 0))
    state = SessionState(
        session_id=session_id,
        directory=directory,
        epoch=0,
        slot=slot,
        baseline=baseline,
        records=EpochRecords.decoded(log_path(directory, 0), [start]),
        log_size=len(line),
        carry=None,
        log_crc=crc,
        kept_scan=KeptScan(0, None, bytearray(line)),
    )
    return state, log_fd


def make_opened_durable(state: SessionState, log_fd: int) -> None:
    """Make everything open read and will build on durable, before anything is acknowledged.

    A worker killed before an fsync leaves bytes and names in the page cache, where the
    next one reads them; a power loss would then take what it acknowledged on top of
    them. So, as RocksDB, LevelDB and etcd recover: the newest log, its baseline, the
    session directory, ``sessions/`` and the home are fsynced first (docs/format.md).
    """
    log = log_path(state.directory, state.epoch)
    durable.fdatasync(log_fd, log)
    durable.fsync_file(baseline_path(state.directory, state.epoch))
    durable.fsync_dir(state.directory)
    sync_parents(state.directory)
