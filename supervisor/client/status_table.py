"""Status rows as an aligned text table (the last column, free text, is not padded)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from worker.wire import Message


def status_lines(
    rows: Iterable[object], columns: Sequence[str], *, clip: int | None = None
) -> list[str]:
    """Return the header and one line per row; ``clip`` cuts long cells to that width."""
    table = [list(columns)]
    for row in rows:
        if isinstance(row, dict):
            cells = ["-" if row.get(c) is None else _cell(c, row.get(c)) for c in columns]
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
    "last_error",
)  # fmt: skip


@dataclass(slots=True)
class TopView:
    """What ``loopd top`` shows of a home, refresh after refresh: each worker's CPU share
    comes from its ``cpu_s`` since the previous refresh (the same pid only)."""

    last: dict[str, tuple[object, float, float]] = field(default_factory=dict)
    """session -> (pid, cpu_s, when) at the previous refresh."""

    def lines(self, rows: Sequence[Message], now: float, *, clip: int = 60) -> list[str]:
        """A summary line, then the table of ``rows`` with ``rss_mib`` and ``cpu%``."""
        shown: list[object] = []
        seen: dict[str, tuple[object, float, float]] = {}
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
            })  # fmt: skip
        self.last = seen
        return [summary_line(rows), *status_lines(shown, TOP_COLUMNS, clip=clip)]


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
    if any(isinstance(row, dict) and "followers" in row for row in rows):
        # A replicated session's followers and in-sync set (docs/scaling.md, Replication).
        lag = ("lag",) if any(isinstance(row, dict) and "lag" in row for row in rows) else ()
        zones = ("zones",) if any(isinstance(row, dict) and "zones" in row for row in rows) else ()
        columns = (columns[0], "followers", "in_sync", *zones, *lag, *columns[1:])
    if any(isinstance(row, dict) and "node" in row for row in rows):
        return (columns[0], "node", *columns[1:])
    return columns


def _cell(column: str, value: object) -> str:
    return lag_cell(value) if column == "lag" and isinstance(value, list) else str(value)


def lag_cell(followers: Sequence[object]) -> str:
    """``b:0B/0g/0.2s,c:4096B/12g/8.1s``: each follower's lag behind the owner's durable
    log end (bytes, group commits) and its last acknowledgement's age; ``?`` where the
    owner has no acknowledgement from it since its worker started; ``d:catching-up@0:1048576``
    for a copy being caught up (epoch and size of its copy so far)."""
    cells = []
    for follower in followers:
        if not isinstance(follower, dict):
            continue
        lag, groups, age = (follower.get(k) for k in ("lag_bytes", "lag_groups", "ack_age_s"))
        known = isinstance(lag, int) and isinstance(groups, int) and isinstance(age, int | float)
        at = follower.get("copy_at")
        if isinstance(at, list) and len(at) >= 2:
            cells.append(f"{follower.get('node')}:catching-up@{at[0]}:{at[1]}")
            continue
        cells.append(
            f"{follower.get('node')}:" + (f"{lag}B/{groups}g/{age:.1f}s" if known else "?")
        )
    return ",".join(cells)
