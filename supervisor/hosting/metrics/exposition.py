"""Prometheus text exposition (format 0.0.4) of counters, gauges and histograms.

The format is a few lines a family (``# HELP``, ``# TYPE``, then ``name{labels} value``),
so it is written here on the standard library rather than pulled in with a client
library. Histograms are cumulative over fixed buckets, as Prometheus expects, so that
workers' histograms can be added bucket by bucket.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from worker.store.stats import LATENCY_BUCKETS

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"

Labels = tuple[tuple[str, str], ...]


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    pairs = [*labels, extra] if extra is not None else list(labels)
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in pairs) + "}"


@dataclass(slots=True)
class HistogramValue:
    """Counts per bucket (not yet cumulative), their sum and their count."""

    bounds: Sequence[float] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)  # the last is +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def add(self, counts: Sequence[int], total: float) -> None:
        """Add another histogram over the same bounds (a worker's, say)."""
        if len(counts) != len(self.counts):
            return  # a histogram of other bounds cannot be added; ignore it
        for i, count in enumerate(counts):
            self.counts[i] += count
        self.total += total

    @property
    def count(self) -> int:
        return sum(self.counts)


@dataclass(slots=True)
class Family:
    """One metric family: a name, its help, its type and its samples by label set."""

    name: str
    help: str
    kind: str  # counter, gauge, histogram
    values: dict[Labels, float] = field(default_factory=dict)
    histograms: dict[Labels, HistogramValue] = field(default_factory=dict)

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        self.values[key] = self.values.get(key, 0.0) + amount

    def set(self, value: float, **labels: str) -> None:
        self.values[tuple(sorted(labels.items()))] = value

    def histogram(self, **labels: str) -> HistogramValue:
        key = tuple(sorted(labels.items()))
        found = self.histograms.get(key)
        if found is None:
            found = self.histograms[key] = HistogramValue()
        return found

    def lines(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help.replace(chr(92), chr(92) * 2)}"
        yield f"# TYPE {self.name} {self.kind}"
        for labels, value in sorted(self.values.items()):
            yield f"{self.name}{_labels(labels)} {format_value(value)}"
        for labels, hist in sorted(self.histograms.items()):
            running = 0
            for bound, count in zip([*hist.bounds, math.inf], hist.counts, strict=True):
                running += count
                le = ("le", format_value(bound) if math.isinf(bound) else repr(bound))
                yield f"{self.name}_bucket{_labels(labels, le)} {running}"
            yield f"{self.name}_sum{_labels(labels)} {format_value(hist.total)}"
            yield f"{self.name}_count{_labels(labels)} {running}"


class Registry:
    """The families to expose, and callbacks that refresh gauges just before rendering."""

    def __init__(self) -> None:
        self.families: dict[str, Family] = {}
        self._collectors: list[Callable[[], None]] = []

    def family(self, name: str, kind: str, help_text: str) -> Family:
        found = self.families.get(name)
        if found is None:
            found = self.families[name] = Family(name, help_text, kind)
        return found

    def counter(self, name: str, help_text: str) -> Family:
        return self.family(name, "counter", help_text)

    def gauge(self, name: str, help_text: str) -> Family:
        return self.family(name, "gauge", help_text)

    def histogram(self, name: str, help_text: str) -> Family:
        return self.family(name, "histogram", help_text)

    def on_collect(self, collector: Callable[[], None]) -> None:
        self._collectors.append(collector)

    def render(self) -> str:
        """The whole exposition, ending in a newline."""
        for collect in self._collectors:
            collect()
        lines: list[str] = []
        for family in self.families.values():
            lines.extend(family.lines())
        return "\n".join(lines) + "\n"
