"""The records one request wrote, found by its key's place: for a duplicate's reply.

A request's records are its ``User`` line and what follows it up to the next request
(the next ``User``) or the next record the store writes alone. The current epoch's are
in memory; an older epoch's are read from its sealed log (only when a retry asks).
"""

from __future__ import annotations

from collections.abc import Sequence

from worker.store.epochs.sealed_logs import read_sealed
from worker.store.errors import InvalidLog
from worker.store.format.records import EpochEnd, Handoff, Owner, Record, SessionStart, User
from worker.store.session import Session
from worker.store.session_state import KeyRef, log_path

_ENDS_A_REQUEST = (User, SessionStart, EpochEnd, Owner, Handoff)


def sealed_records(session: Session, epoch: int) -> list[Record]:
    """The records of a sealed epoch of ``session``, read from its log where the session
    keeps it (TornLog, InvalidLog).

    Its checksums, length and CRC-32 are checked first: a damaged sealed log is
    refused (ChecksumMismatch), never served.
    """
    return read_sealed(session.dir, epoch, session.files()).records


def request_records(session: Session, ref: KeyRef) -> list[Record]:
    """The records of the request applied at ``ref`` (its User first)."""
    if ref.epoch == session.epoch:
        records: Sequence[Record] = session.records
        path = session.log_path
    else:
        path = log_path(session.dir, ref.epoch)
        records = sealed_records(session, ref.epoch)
    if not 1 <= ref.line <= len(records) or not isinstance(records[ref.line - 1], User):
        raise InvalidLog(path, ref.line, "the request's line is not a User record")
    found = [records[ref.line - 1]]
    # By index, not by slice: the current epoch's records are decoded on demand (a few
    # lines at a time), and a slice would decode every line to the epoch's end.
    for index in range(ref.line, len(records)):
        record = records[index]
        if isinstance(record, _ENDS_A_REQUEST):
            break
        found.append(record)
    return found
