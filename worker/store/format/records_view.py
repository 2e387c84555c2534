"""A read-only view of a session's records, handed out without copying them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from worker.store.format.epoch_records import EpochRecords
from worker.store.format.records import Record


class RecordsView(Sequence[Record]):
    """A read-only view of the current epoch's records (no copy)."""

    __slots__ = ("_records",)

    def __init__(self, records: Sequence[Record]) -> None:
        self._records = records

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Record]: ...
    def __getitem__(self, index: int | slice) -> Record | Sequence[Record]:
        return self._records[index]

    def __len__(self) -> int:
        return len(self._records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self._records)

    def __reversed__(self) -> Iterator[Record]:
        return reversed(self._records)

    def __repr__(self) -> str:
        return f"RecordsView({self._records!r})"


def typed(records: Sequence[Record]) -> EpochRecords | None:
    """The epoch's records behind ``records`` (itself or a view of it), to ask by type
    without decoding every line; None for a plain sequence."""
    if isinstance(records, RecordsView):
        records = records._records
    return records if isinstance(records, EpochRecords) else None
