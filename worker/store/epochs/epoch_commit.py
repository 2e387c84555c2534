"""Phase 2 of the epoch commit: the next epoch's files, then what memory learns of them.

``Session.commit_epoch`` has written (or found) the closing ``EpochEnd``; what follows
is written in an order that no crash can break (docs/format.md, "Writing"): the key
index files and the baseline, made durable by one directory fsync, before the log
whose ``SessionStart`` names their digests.
"""

from __future__ import annotations

from worker.store.baseline import Baseline
from worker.store.disk import durable
from worker.store.epochs.carried_state import NextEpoch
from worker.store.format.epoch_records import EpochRecords
from worker.store.format.records import SessionStart, encode_lines
from worker.store.key_index import write_segments
from worker.store.schedules import carried_schedules
from worker.store.session_state import SessionState, baseline_path, log_path


def write_next_epoch(
    state: SessionState, plan: NextEpoch, baseline: Baseline
) -> tuple[SessionStart, bytes, int, int]:
    """Write the files of the epoch after ``state``'s; its SessionStart, first lines, CRC-32,
    log fd.

    The SessionStart records the closing log's length and CRC-32 (``state``'s, which
    ends with its EpochEnd): the sealed log is bound to what follows.
    """
    following = state.epoch + 1
    start, line, crc = next_start(state, plan, baseline)
    new_log = log_path(state.directory, following)
    write_segments(state.directory, plan.new_segments)
    # The baseline's directory fsync makes the index files' names durable too.
    durable.write_file_atomic(baseline_path(state.directory, following), baseline.to_json())
    durable.write_file_atomic(new_log, line)
    return start, line, crc, durable.open_append(new_log)


def next_start(
    state: SessionState, plan: NextEpoch, baseline: Baseline
) -> tuple[SessionStart, bytes, int]:
    """The next epoch's SessionStart, its first lines and their CRC-32 (every backend's).

    After the SessionStart come the schedules pending in ``state``'s epoch, carried over
    unchanged (``worker.store.schedules``): one atomic file holds them all.
    """
    start = plan.start(state, baseline.hash())
    line, crc = encode_lines((start,), 0)
    carried = carried_schedules(state.records)
    if carried:
        more, crc = encode_lines(carried, crc)
        line += more
    return start, line, crc


def switch_to_next_epoch(
    state: SessionState,
    plan: NextEpoch,
    start: SessionStart,
    baseline: Baseline,
    summary: str,
    size: int,
    crc: int,
) -> None:
    """Make ``state`` the new epoch's, once its files are durable."""
    carried = carried_schedules(state.records)  # what next_start wrote after ``start``
    state.prior_users = plan.prior_users
    state.prior_untrusted = plan.prior_untrusted
    state.next_call = plan.next_call
    # The closing epoch's keys stay in memory (the new previous epoch); every older
    # one is found through the index, which now covers the closing epoch too.
    state.keys = {k: ref for k, ref in state.keys.items() if ref.epoch == state.epoch}
    state.repeats = []
    state.key_index = plan.index
    state.epoch = start.epoch
    state.baseline = baseline
    state.records = EpochRecords.decoded(log_path(state.directory, start.epoch), [start, *carried])
    state.carry = summary
    state.log_size = size
    state.log_crc = crc
    state.epoch_sizes.append(size)
