"""The figures of scripts/postgres/bench_postgres.py and their section of docs/benchmarks.md."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

_GOALS = {
    "append:append_many/bare": ("a durable append vs a bare INSERT + COMMIT", 1.3),
    "serve:send/bare": (
        "one client's round trip (loopd serve --store) vs a bare INSERT + COMMIT",
        1.3,
    ),
    "open:open/select": (
        "open of the session on a node that never opened it (a failover's: the summary its "
        "writer kept in the database) vs connect + SELECT of its chunks",
        2.0,
    ),
    "open:open-unsummarized/select": (
        "the same open with no summary anywhere (a log no writer kept one of, no goal)",
        float("inf"),
    ),
    "reopen:reopen/select": (
        "open of the session after an open that kept a summary of all of it (a restart "
        "after a clean stop) vs connect + SELECT of its chunks",
        2.0,
    ),
    "open:open/select+json": (
        "open of the session vs connect + SELECT + json.loads of each line (no goal)",
        float("inf"),
    ),
    "open:open/select+decode": (
        "open of the session vs connect + SELECT + the store's decode_log of its bytes (no goal)",
        float("inf"),
    ),
}


@dataclass
class Figures:
    """Every timed operation per measure and side, the per-round ratios, and facts."""

    times: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)
    facts: dict[str, object] = field(default_factory=dict)


def _ms(values: list[float], q: float) -> str:
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000:.3f}"


def markdown(figures: Figures, command: str) -> str:
    """The section between the postgres-bench markers, figures and command included."""
    facts = figures.facts
    lines = [
        "<!-- postgres-bench:start -->",
        "## PostgreSQL store against bare psycopg (issue 30's goals)",
        "",
        f"`{command}` on {facts.get('machine')}, {facts.get('server')} started by the script "
        "(a temporary cluster on a unix socket, `fsync=on`, `synchronous_commit=on`, no "
        "standby). A group is "
        f"{facts.get('group_bytes')} bytes (four records); a served request writes "
        f"{facts.get('request_bytes', '-')} bytes (the echo App's four records; the bare side "
        "writes those bytes); the opened session holds "
        f"{facts.get('open_records')} records in {facts.get('open_chunks')} chunks "
        f"({facts.get('open_bytes')} bytes), of which the last "
        f"{facts.get('open_summary_behind', '-')} bytes come after the summary its writer "
        "kept. The machine was shared with other work: "
        "the sides take turns operation by operation, a side's figure is the median (p99) of "
        "its operations, a "
        "ratio the median (min-max) of the per-round ratios of medians.",
        "",
        "| measure | side | median ms | p99 ms | operations |",
        "|---|---|---:|---:|---:|",
    ]
    for key, values in figures.times.items():
        name, side = key.split(":")
        lines.append(
            f"| {name} | {side} | {_ms(values, 0.5)} | {_ms(values, 0.99)} | {len(values)} |"
        )
    lines += ["", "| ratio | median | min-max | goal | met |", "|---|---:|---:|---:|---|"]
    for key, per_round in figures.ratios.items():
        what, goal = _GOALS.get(key, (key, 0.0))
        ratio = statistics.median(per_round)
        met = "yes" if ratio <= goal else "no"
        met = "-" if goal == float("inf") else met
        lines.append(
            f"| {what} | {ratio:.2f}x | {min(per_round):.2f}-{max(per_round):.2f} | "
            f"{_goal(goal)} | {met} |"
        )
    lines.append("<!-- postgres-bench:end -->")
    return "\n".join(lines)


def _goal(goal: float) -> str:
    return "-" if goal == float("inf") else f"≤ {goal:.1f}x"
