"""One epoch's records, each decoded from its line when something first asks for it.

Open proves a log's lines and reads what it needs of them without decoding a record
(``worker.store.format.line_scan``); the records stay bytes until asked for: one by
index (a duplicate's answer, the last record), by type (the schedules, the App's
changes, the newest ``Usage``), a page for ``tail``, or all of them in order (the App's
summary at an epoch's end). Records appended after open are kept as they were given.

A line that does not decode when asked for (one the store never wrote, whose checksum
was made to match) raises TornLog with its place and why, as the line-by-line read
names it; ``loopd verify`` decodes and checks every line.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, repeat
from operator import is_
from typing import Final, overload

from worker.store.errors import TornLog
from worker.store.format.record_codecs import DECODERS
from worker.store.format.records import Record, User, decode_line

_BLOCK: Final = 64  # lines decoded together when one is asked for by its index


class EpochRecords(Sequence[Record]):
    """The records of the epoch a session has open, in log order (line n is ``[n - 1]``)."""

    __slots__ = (
        "_data",
        "_ends",
        "_keys",
        "_pending",
        "_read",
        "_records",
        "_tail",
        "_types",
        "path",
    )

    def __init__(
        self,
        path: str,
        records: list[Record | None],
        types: list[type[Record]],
        data: bytes = b"",
        keys: list[str | None] | None = None,
    ) -> None:
        """``records`` holds None for each line of ``data`` not decoded yet; ``types``
        each line's record class; ``keys`` the request key of each User, in order."""
        self.path = path
        self._records = records
        self._types = types
        self._data = data
        self._ends: list[int] | None = None  # each line's end in ``data``, once needed
        self._tail: list[int] | None = None  # where each of the last lines starts, and the end
        self._keys = keys
        self._read = len(records)  # the lines of ``data``
        self._pending = records.count(None)  # lines not decoded yet: ``data`` is let go at 0

    @classmethod
    def decoded(cls, path: str, records: Iterable[Record]) -> EpochRecords:
        """Records already decoded (a log read line by line, a new epoch's first lines)."""
        held: list[Record | None] = list(records)
        return cls(path, held, [type(record) for record in held if record is not None])

    # -- Sequence ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._records)

    @overload
    def __getitem__(self, index: int) -> Record: ...
    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...
    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        if isinstance(index, slice):
            numbers = range(len(self._records))[index]
            self._decode([n for n in numbers if self._records[n] is None])
            return [self._records[n] for n in numbers]  # type: ignore[misc]
        record = self._records[index]
        if record is None:
            number = range(len(self._records))[index]
            if 0 < number < self._read - 1:
                # Its neighbours with it: a reader going line by line decodes in blocks
                # (one that does not decode is left for when it is asked for). Near the
                # end, before every line's end is known, only those found from the end.
                start = number - number % _BLOCK
                stop = min(start + _BLOCK, self._read)
                if self._ends is None and number >= self._read - _BLOCK:
                    start = max(start, self._read - _BLOCK)
                near = range(start, stop)
                with contextlib.suppress(TornLog):
                    self._decode([n for n in near if self._records[n] is None])
            if self._records[number] is None:
                self._decode([number])
            record = self._records[number]
        return record  # type: ignore[return-value]

    def __iter__(self) -> Iterator[Record]:
        if None in self._records:
            self._decode([n for n, r in enumerate(self._records) if r is None])
        return iter(self._records)  # type: ignore[arg-type]

    def __reversed__(self) -> Iterator[Record]:
        for number in range(len(self._records) - 1, -1, -1):
            yield self[number]

    def __eq__(self, other: object) -> bool:
        """Equal to another epoch's records or a list holding the same records, in order."""
        if isinstance(other, EpochRecords | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # changes as records are appended

    def __repr__(self) -> str:
        return f"EpochRecords({self.path!r}, {len(self._records)} records)"

    # -- what a writer adds -----------------------------------------------------------

    def extend(self, records: Iterable[Record]) -> None:
        """Add records appended after the ones read (durable already)."""
        added = list(records)
        self._records.extend(added)
        self._types.extend(type(record) for record in added)
        if self._keys is not None:
            self._keys.extend(r.key for r in added if type(r) is User)

    def append(self, record: Record) -> None:
        self.extend((record,))

    def __setitem__(self, index: int, record: Record) -> None:
        """Put ``record`` in place of the one at ``index``."""
        number = range(len(self._records))[index]
        self._keys = None  # the keys read at open may no longer be the records'
        if self._records[number] is None:
            self._pending -= 1
        self._records[number] = record
        self._types[number] = type(record)

    # -- by type, decoding only those lines -------------------------------------------

    @property
    def undecoded(self) -> int:
        """How many of the lines read are still bytes."""
        return self._pending

    @property
    def types(self) -> list[type[Record]]:
        """Each record's class, in log order (do not change it)."""
        return self._types

    def holds(self, *classes: type[Record], start: int = 0) -> bool:
        """True if a record of one of ``classes`` is at index ``start`` or later."""
        types = self._types[start:] if start else self._types
        return any(map(types.__contains__, classes))

    def of_type(self, *classes: type[Record], start: int = 0) -> list[tuple[int, Record]]:
        """``(line, record)`` of every record of ``classes`` from index ``start``, in order."""
        wanted = set(classes)
        numbers = [n for n in range(start, len(self._types)) if self._types[n] in wanted]
        self._decode([n for n in numbers if self._records[n] is None])
        return [(n + 1, self._records[n]) for n in numbers]  # type: ignore[misc]

    def last_of_type(self, cls: type[Record]) -> Record | None:
        """The newest record of ``cls``, or None."""
        types = self._types
        for number in range(len(types) - 1, -1, -1):
            if types[number] is cls:
                return self[number]
        return None

    def request_keys(self, start: int = 0) -> list[str]:
        """The keys of the User records from index ``start`` (sent without one: left out)."""
        if self._keys is None:
            users = (r for _n, r in self.of_type(User, start=start))
            return [u.key for u in users if isinstance(u, User) and u.key is not None]
        if start:
            # Counted from the end: a writer asks for the few records it just appended.
            after = sum(map(is_, self._types[start:], repeat(User)))
            return [key for key in self._keys[len(self._keys) - after :] if key is not None]
        return [key for key in self._keys if key is not None]

    # -- decoding ---------------------------------------------------------------------

    def _decode(self, numbers: list[int]) -> None:
        """Decode the lines at ``numbers`` (indexes, ascending) into ``_records``.

        Their bytes were proven the writer's at open (the checksum chain), so a line's
        spelling is trusted as ``decode_lines_fast`` trusts it; each line is its own
        ``json.loads`` (one for several could give a line's values to its neighbour), and
        a line that does not decode to a record is decoded strictly to say why (TornLog).
        """
        if not numbers:
            return
        decoders = DECODERS
        for number in numbers:
            line = self._line(number)
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):
                value = None
            name = value.get("type") if type(value) is dict else None
            decoder = decoders.get(name) if type(name) is str else None
            record = decoder(value) if decoder is not None else None
            if record is None:
                try:
                    record = decode_line(line)[0]
                except ValueError as exc:
                    raise TornLog(self.path, number + 1, f"undecodable record: {exc}") from exc
            if type(record) is not self._types[number]:  # what open read of it says otherwise
                raise TornLog(
                    self.path, number + 1,
                    f"holds a {record.TYPE} where open read a {self._types[number].TYPE} "
                    "(a line not spelled as the writer writes it, or a scan summary in "
                    "<home>/scans/ that says otherwise of it)",
                )  # fmt: skip
            self._records[number] = record
            self._pending -= 1
        if not self._pending:
            self._data, self._ends, self._tail = b"", None, None

    def _line(self, number: int) -> bytes:
        """Line ``number`` (an index) of the bytes read at open, without its newline."""
        data = self._data
        if number == 0:
            return data[: data.find(b"\n")]
        ends = self._ends
        if ends is None:
            first = self._read - _BLOCK
            if number >= first:  # one of the last lines: found from the end, not by a split
                tail = self._tail
                if tail is None:
                    tail = self._tail = _tail_starts(data, min(_BLOCK, self._read))
                at = number - max(first, 0)
                return data[tail[at] : tail[at + 1] - 1]
            lines = data.split(b"\n")[:-1]
            ends = self._ends = list(accumulate(map((1).__add__, map(len, lines))))
        return data[ends[number - 1] : ends[number] - 1]


def _tail_starts(data: bytes, count: int) -> list[int]:
    """Where each of the last ``count`` lines of ``data`` starts, then ``len(data)``."""
    starts = [len(data)]
    end = len(data) - 1  # the last line's newline
    for _ in range(count):
        end = data.rfind(b"\n", 0, end)
        starts.append(end + 1)
    starts.reverse()
    return starts
