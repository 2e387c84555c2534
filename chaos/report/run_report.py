"""A run's progress and its reports, written as the run goes.

On a terminal the progress line (cases done, violations so far, rate, ETA) is redrawn
in place; elsewhere (CI logs) a plain line is printed every ``PLAIN_EVERY`` seconds.
The JSON, JUnit and HTML reports are replaced atomically (written beside, then
renamed) every few seconds and at the end, so a run stopped by a timeout, even by
SIGKILL, leaves the last complete report with ``"status": "running"``.

Violations are grouped by invariant and first cause (the first violation's text with
its numbers, quoted values and paths taken out), each group with its count and the
replay line of one case.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Final
from xml.sax.saxutils import escape, quoteattr

from chaos.cases import CaseResult
from chaos.report.html_report import render_html_report
from chaos.report.violation_groups import Group, group_violations

WRITE_EVERY: Final = 5.0  # seconds between two writes of the reports (at least)
PLAIN_EVERY: Final = 10.0  # seconds between two plain progress lines


@dataclass
class RunReport:
    """Collects a run's results; shows progress and keeps its report files current."""

    total: int
    title: str
    json_path: str | None = None
    junit_path: str | None = None
    html_path: str | None = None
    header: dict[str, object] = field(default_factory=dict)  # seed, sample, command ...
    out: IO[str] = field(default_factory=lambda: sys.stderr)
    clock: Callable[[], float] = time.monotonic
    results: list[CaseResult] = field(default_factory=list)
    tty: bool = False
    deadline: float | None = None  # a budgeted run's end on ``clock``: the ETA is capped there

    def __post_init__(self) -> None:
        self.tty = self.out.isatty()
        self.start = self.clock()
        self._last_write = self._last_line = self.start
        self._write_cost = 0.0
        self.bad = 0

    # -- as the run goes ---------------------------------------------------------------

    def add(self, result: CaseResult) -> None:
        self.results.append(result)
        if result.outcome != "ok":
            self.bad += 1
            self._print(
                f"VIOLATION {result.case} ({result.boundary}): {'; '.join(result.violations)}"
                f"\n  replay: {result.replay_line}"
            )
        now = self.clock()
        if self.tty:
            self.out.write("\r" + self.progress_line(now) + "\x1b[K")
            self.out.flush()
        elif now - self._last_line >= PLAIN_EVERY:
            self._last_line = now
            self._print(self.progress_line(now))
        first = len(self.results) == 1  # a report exists as soon as one case is done
        if first or now - self._last_write >= max(WRITE_EVERY, 10 * self._write_cost):
            self.write("running")

    def progress_line(self, now: float | None = None) -> str:
        elapsed = (now if now is not None else self.clock()) - self.start
        done = len(self.results)
        rate = done / elapsed if elapsed > 0 else 0.0
        left = max(0, self.total - done)
        eta = f"{_duration(left / rate)}" if rate > 0 else "?"
        if self.deadline is not None:
            budget_left = max(0.0, self.deadline - (now if now is not None else self.clock()))
            if rate <= 0 or budget_left < left / rate:
                eta = f"{_duration(budget_left)} (budget)"
        return (f"{done}/{self.total} cases, {self.bad} violations, {rate:.1f} cases/s, "
                f"ETA {eta}")  # fmt: skip

    def _print(self, line: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[K")
        self.out.write(line + "\n")
        self.out.flush()

    # -- the files ---------------------------------------------------------------------

    def finish(self, status: str = "finished") -> None:
        """The last progress line and the final reports."""
        if self.tty:
            self.out.write("\r\x1b[K")
        self._print(self.progress_line())
        self.write(status)

    def write(self, status: str) -> None:
        began = time.perf_counter()
        now = self.clock()
        groups = group_violations(self.results)
        if self.json_path:
            _replace(self.json_path, json.dumps(self.document(status, groups, now), indent=1))
        if self.junit_path:
            _replace(self.junit_path, self.junit(now))
        if self.html_path:
            _replace(self.html_path, render_html_report(self.results, title=self.title,
                                                        groups=groups, status=status))  # fmt: skip
        self._last_write = now
        self._write_cost = time.perf_counter() - began

    def document(self, status: str, groups: list[Group], now: float) -> dict[str, object]:
        states = Counter(r.state for r in self.results if r.state)
        return {
            **self.header,
            "status": status,
            "cases_planned": self.total,
            "cases_done": len(self.results),
            "violations": self.bad,
            "elapsed_s": round(now - self.start, 3),
            "distinct_states": len(states),
            "groups": [g.to_json() for g in groups],
            "states": [{"state": s, "cases": n} for s, n in states.most_common()],
            "cases": [r.to_json() for r in self.results],
        }

    def junit(self, now: float) -> str:
        """One testsuite, one testcase per case; a violation is a failure."""
        lines = [
            '<?xml version="1.0" encoding="utf-8"?>',
            f'<testsuite name={quoteattr(self.title)} tests="{len(self.results)}" '
            f'failures="{self.bad}" errors="0" time="{now - self.start:.3f}">',
        ]
        for r in self.results:
            scenario = r.case.split(":")[0]
            lines.append(f"  <testcase classname={quoteattr('loopd-chaos.' + scenario)} "
                         f"name={quoteattr(r.case)}>")  # fmt: skip
            lines.append("    <properties><property name=\"replay\" "
                         f"value={quoteattr(r.replay_line)}/></properties>")  # fmt: skip
            if r.violations:
                text = "\n".join([*r.violations, f"replay: {r.replay_line}"])
                message = quoteattr(r.violations[0][:200])
                lines.append(f"    <failure message={message}>{escape(text)}</failure>")
            lines.append("  </testcase>")
        lines.append("</testsuite>\n")
        return "\n".join(lines)


def _replace(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a reader sees the old file or the new one."""
    partial = f"{path}.{os.getpid()}.part"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, path)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"
