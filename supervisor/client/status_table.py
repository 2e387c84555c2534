"""Status rows as an aligned text table (the last column, free text, is not padded)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def status_lines(
    rows: Iterable[object], columns: Sequence[str], *, clip: int | None = None
) -> list[str]:
    """Return the header and one line per row; ``clip`` cuts long cells to that width."""
    table = [list(columns)]
    for row in rows:
        if isinstance(row, dict):
            cells = ["-" if row.get(c) is None else str(row.get(c)) for c in columns]
            table.append([cell[:clip] for cell in cells] if clip else cells)
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    return [
        "  ".join(
            [*(cell.ljust(w) for cell, w in zip(line, widths, strict=False)), line[-1]]
        ).rstrip()
        for line in table
    ]


def with_node_column(columns: Sequence[str], rows: Sequence[object]) -> Sequence[str]:
    """``columns`` with ``node`` after the first when any row names its node (a cluster's
    status, ``loopd status --cluster``)."""
    if any(isinstance(row, dict) and "node" in row for row in rows):
        return (columns[0], "node", *columns[1:])
    return columns
