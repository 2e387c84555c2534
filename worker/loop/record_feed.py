"""``records``: a page of the current epoch's records, served by the worker from memory.

A client asks ``{"op": "records", "since": N, "epoch": E}`` (N lines of epoch E already
seen; 0 for all; no E: the current epoch) and gets ``{"epoch", "current", "since",
"records": [...], "next", "lines"}``: the records as their JSON objects, ``next`` to ask
from, ``lines`` the epoch's length now, ``current`` the newest epoch. The current epoch
is served from memory; an older one from its sealed log, so that a follower that was
behind an epoch commit reads the rest of the old epoch before the new one. A page is
bounded in records and bytes so that it fits a frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from worker.ipc.wire import Message, WireError, optional_field
from worker.store.format.records import Record, record_document
from worker.store.request_records import sealed_records
from worker.store.session import Session

MAX_RECORDS: Final = 1000
MAX_PAGE_BYTES: Final = 256 << 10
"""Text of the records of one page, about (a frame holds 1 MiB)."""


def records_page(session: Session, message: Message) -> Message:
    """The page ``message`` asks for; WireError if its fields are wrong."""
    since = optional_field(message, "since", int) or 0
    limit = optional_field(message, "limit", int) or MAX_RECORDS
    asked_epoch = optional_field(message, "epoch", int)
    since, limit = max(0, since), max(1, limit)
    epoch = session.epoch if asked_epoch is None else asked_epoch
    records: Sequence[Record]
    if epoch == session.epoch:
        records = session.records
    elif 0 <= epoch < session.epoch:
        records = _sealed(session, epoch)
    else:
        raise WireError(f"field 'epoch' must be from 0 to {session.epoch}, got {epoch}")
    page: list[dict[str, object]] = []
    size = 0
    line = since
    while line < len(records) and len(page) < min(limit, MAX_RECORDS):
        document = record_document(records[line])
        weight = sum(len(v.encode("utf-8", "surrogatepass")) for v in document.values()
                     if isinstance(v, str)) + 64  # fmt: skip
        if weight > MAX_PAGE_BYTES:
            # One record too large for a page (a huge tool output): its type and place
            # only; `loopd inspect` reads it whole from the file.
            document = {"type": document["type"], "omitted": True, "bytes": weight}
            weight = 64
        size += weight
        if page and size > MAX_PAGE_BYTES:
            break
        page.append(document)
        line += 1
    return {
        "epoch": epoch, "current": session.epoch, "since": since, "records": page,
        "next": line, "lines": len(records),
    }  # fmt: skip


_cache: dict[tuple[str, int], list[Record]] = {}


def _sealed(session: Session, epoch: int) -> list[Record]:
    """A sealed epoch's records, read from its log (the last one asked for is kept)."""
    key = (session.dir, epoch)
    if key not in _cache:
        _cache.clear()
        _cache[key] = sealed_records(session, epoch)
    return _cache[key]
