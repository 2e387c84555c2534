"""Where a log is torn, read from its bytes, and whether a worker refused it there.

A log is torn when its last line has no newline (a write cut short) or when its last
whole lines leave a group commit open (the rest of the group never reached the disk).
Open must refuse either with TornLog at that place; the rig predicts the place from
the bytes, not from the store.
"""

from __future__ import annotations

import json

from chaos.cases import CaseResult
from chaos.oracle.oracle import incomplete_group_start, log_files


def expected_torn_place(home: str) -> tuple[str, frozenset[int]] | None:
    """The first torn log of the session and the lines (from 1) a refusal may name.

    An unterminated last line may be named itself or, when it belongs to a group whose
    first lines are whole, by that group's first line; an open group of whole lines is
    named by its first line.
    """
    for path in log_files(home):
        with open(path, "rb") as f:
            data = f.read()
        if not data:
            continue
        lines = data.split(b"\n")
        tail = lines.pop()
        records = [_raw(line) for line in lines]
        start = incomplete_group_start(records)
        if tail:
            places = {len(lines) + 1}
            if start is not None:
                places.add(start + 1)
            return path, frozenset(places)
        if start is not None:
            return path, frozenset({start + 1})
    return None


def _raw(line: bytes) -> dict[str, object]:
    try:
        record = json.loads(line)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def describe(place: tuple[str, frozenset[int]]) -> str:
    """``path:line`` (or ``path:a|b`` when either line may be named)."""
    path, lines = place
    return f"{path}:{'|'.join(str(n) for n in sorted(lines))}"


def torn_refusal_checked(
    result: CaseResult, expected: tuple[str, frozenset[int]] | None, refused: dict[str, object]
) -> bool:
    """A refusal must be TornLog at the place the rig predicted from the bytes."""
    why = str(refused.get("why"))
    if expected is None:
        result.violate("final-state-opens", f"the worker refused a log that is not torn: {why}")
        return False
    path, lines = expected
    if not any(why.startswith(f"{path}:{line}: ") for line in lines):
        result.violate(
            "torn-log-refused-unchanged", f"refused as {why!r}, expected {describe(expected)}"
        )
        return False
    return True
