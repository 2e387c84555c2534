"""A read-only view of a session's records, handed out without copying them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

from worker.store.format.records import Record


class RecordsView(Sequence[Record]):
    """A read-only view of the current epoch's records (no copy)."""

    __slots__ = ("_records",)

    def __init__(self, records: list[Record]) -> None:
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

    def __repr__(self) -> str:
        return f"RecordsView({self._records!r})"
