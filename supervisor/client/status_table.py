"""Status rows as an aligned text table (the last column, free text, is not padded)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from worker.ipc.wire import Message


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


TOP_COLUMNS: Final = (
    "session", "state", "pid", "epoch", "records", "restarts", "uptime_s", "rss_mib", "cpu%",
    "tok/min", "last_error",
)  # fmt: skip


@dataclass(slots=True)
class TopView:
    """What ``loopd top`` shows of a home, refresh after refresh: each worker's CPU share
    comes from its ``cpu_s`` since the previous refresh, its tokens per minute from its
    ``tokens`` (the same pid only: a new worker counts from zero)."""

    last: dict[str, tuple[object, float, float]] = field(default_factory=dict)
    """session -> (pid, cpu_s, when) at the previous refresh."""
    last_tokens: dict[str, tuple[object, int, float]] = field(default_factory=dict)
    """session -> (pid, tokens, when) at the previous refresh."""

    def lines(self, rows: Sequence[Message], now: float, *, clip: int = 60) -> list[str]:
        """A summary line, then the table of ``rows`` with ``rss_mib`` and ``cpu%``."""
        shown: list[object] = []
        seen: dict[str, tuple[object, float, float]] = {}
        counted: dict[str, tuple[object, int, float]] = {}
        for row in rows:
            session, pid, cpu = str(row.get("session")), row.get("pid"), row.get("cpu_s")
            rss = row.get("rss_bytes")
            percent = None
            if isinstance(cpu, int | float) and pid is not None:
                seen[session] = (pid, float(cpu), now)
                before = self.last.get(session)
                if before is not None and before[0] == pid and now > before[2]:
                    percent = f"{100 * max(0.0, cpu - before[1]) / (now - before[2]):.0f}"
            shown.append({
                **row,
                "rss_mib": f"{rss / (1 << 20):.1f}" if isinstance(rss, int | float) else None,
                "cpu%": percent,
                "tok/min": self._per_minute(session, pid, row.get("tokens"), now, counted),
            })  # fmt: skip
        self.last = seen
        self.last_tokens = counted
        return [summary_line(rows), *status_lines(shown, TOP_COLUMNS, clip=clip)]

    def _per_minute(
        self,
        session: str,
        pid: object,
        tokens: object,
        now: float,
        counted: dict[str, tuple[object, int, float]],
    ) -> str | None:
        """Tokens a minute since the previous refresh; None at a worker's first sight."""
        if type(tokens) is not int or pid is None:
            return None
        counted[session] = (pid, tokens, now)
        before = self.last_tokens.get(session)
        if before is None or before[0] != pid or now <= before[2]:
            return None
        return f"{60 * max(0, tokens - before[1]) / (now - before[2]):.0f}"


def summary_line(rows: Sequence[Message]) -> str:
    """``N sessions: 3 RUNNING, 1 IDLE`` (states by count, then name)."""
    counts = Counter(str(row.get("state")) for row in rows)
    states = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=_by_count))
    noun = "session" if len(rows) == 1 else "sessions"
    return f"{len(rows)} {noun}" + (f": {states}" if states else "")


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return -item[1], item[0]


def with_node_column(columns: Sequence[str], rows: Sequence[object]) -> Sequence[str]:
    """``columns`` with ``node`` after the first when any row names its node (a cluster's
    status, ``loopd status --cluster``)."""
    if any(isinstance(row, dict) and "node" in row for row in rows):
        return (columns[0], "node", *columns[1:])
    return columns
