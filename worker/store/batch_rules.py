"""What a batch must obey before a byte of it is written: call numbers, keys, the fence,
its size."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from worker.store.errors import InvalidRecord, LogSealed, quote
from worker.store.fencing import Fence, advance
from worker.store.format.records import AppChanged, Handoff, Owner, Record, ToolResult, Usage, User
from worker.store.format.records_view import typed
from worker.store.session_state import SessionState


def highest_call_after(
    state: SessionState, batch: list[Record], applied: Callable[[str], bool]
) -> int:
    """The highest tool call number once ``batch`` is in; refuse a reused number or key.

    ``applied`` says whether a key was applied in any epoch (``Session.find_key``): the
    store never writes a key twice, whatever the App looked up.
    """
    highest = state.max_call
    new_keys: set[str] = set()
    for record in batch:
        if isinstance(record, ToolResult):
            if record.call <= highest:
                raise InvalidRecord(
                    "ToolResult", f"call {record.call} reuses a number (highest is {highest})"
                )
            highest = record.call
        elif isinstance(record, User) and record.key is not None:
            if record.key in new_keys or record.key in state.keys or applied(record.key):
                raise InvalidRecord("User", f"key {quote(record.key)} is already in the log")
            new_keys.add(record.key)
    return highest


def fence_after(fence: Fence, batch: list[Record], log_path: str) -> Fence:
    """Return the fence after ``batch``; refuse it if it breaks the token rule (fencing)."""
    for record in batch:
        if isinstance(record, Owner | Handoff | AppChanged) and len(batch) > 1:
            raise InvalidRecord(record.TYPE, "is written alone, never in a group")
        if isinstance(record, Owner | Handoff) or fence.sealed is not None:
            fenced = advance(fence, record)
            if isinstance(fenced, str):
                if fence.sealed is not None:
                    raise LogSealed(log_path, fence.sealed.to, fence.sealed.token)
                raise InvalidRecord(record.TYPE, fenced)
            fence = fenced
    return fence


def newest_usage(records: Sequence[Record]) -> Usage | None:
    """The newest Usage of ``records``, or None (an epoch's: decoding only that line)."""
    epoch = typed(records)
    if epoch is not None:
        usage = epoch.last_of_type(Usage)
        return usage if isinstance(usage, Usage) else None
    for record in reversed(records):
        if isinstance(record, Usage):
            return record
    return None
