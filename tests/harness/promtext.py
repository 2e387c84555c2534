"""A strict parser of the Prometheus text exposition format 0.0.4, written from its spec.

It checks what the format requires of an exposition (not what a particular server
accepts): metric and label names by their grammar, label values with only the three
escapes, values as Go floats (``NaN``, ``+Inf``, ``-Inf``), at most one ``# TYPE`` and
one ``# HELP`` per family with the TYPE before any sample, a family's samples in one
group, no repeated series, histograms with cumulative ``le`` buckets ending at ``+Inf``
equal to ``_count`` and a ``_sum``, non-negative counters, and a final newline.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Final

METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES: Final = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_SUFFIXES: Final = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


class ExpositionError(ValueError):
    """The text breaks the format; the message names the line."""


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class MetricFamily:
    name: str
    kind: str = "untyped"
    help: str | None = None
    typed: bool = False
    samples: list[Sample] = field(default_factory=list)

    def value(self, **labels: str) -> float:
        """The value of the sample with exactly these labels (named after the family)."""
        for sample in self.samples:
            if sample.name == self.name and sample.labels == labels:
                return sample.value
        raise KeyError(f"{self.name}{labels}")

    def total(self, suffix: str = "") -> float:
        return sum(s.value for s in self.samples if s.name == self.name + suffix)


def _parse_float(text: str, where: str) -> float:
    if text in ("NaN", "+Inf", "-Inf", "Inf"):
        return {"NaN": math.nan, "+Inf": math.inf, "Inf": math.inf, "-Inf": -math.inf}[text]
    if not re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", text):
        raise ExpositionError(f"{where}: {text!r} is not a value")
    return float(text)


def _parse_labels(text: str, pos: int, where: str) -> tuple[dict[str, str], int]:
    labels: dict[str, str] = {}
    pos += 1  # past '{'
    while True:
        if text[pos : pos + 1] == "}":
            return labels, pos + 1
        match = LABEL_NAME.match(text, pos)
        if match is None:
            raise ExpositionError(f"{where}: bad label name at column {pos + 1}")
        name = match.group()
        if name.startswith("__"):
            raise ExpositionError(f"{where}: label name {name!r} is reserved")
        if name in labels:
            raise ExpositionError(f"{where}: label {name!r} given twice")
        pos = match.end()
        if text[pos : pos + 2] != '="':
            raise ExpositionError(f'{where}: expected =" after label {name!r}')
        pos += 2
        value = []
        while True:
            if pos >= len(text):
                raise ExpositionError(f"{where}: unterminated label value")
            char = text[pos]
            if char == "\\":
                escaped = text[pos + 1 : pos + 2]
                if escaped not in ("\\", '"', "n"):
                    raise ExpositionError(f"{where}: bad escape \\{escaped} in label value")
                value.append("\n" if escaped == "n" else escaped)
                pos += 2
            elif char == '"':
                pos += 1
                break
            else:
                value.append(char)
                pos += 1
        labels[name] = "".join(value)
        if text[pos : pos + 1] == ",":
            pos += 1
        elif text[pos : pos + 1] != "}":
            raise ExpositionError(f"{where}: expected , or }} after a label")


def parse(text: str) -> dict[str, MetricFamily]:
    """Every family of the exposition by name; ExpositionError at the first break."""
    if text and not text.endswith("\n"):
        raise ExpositionError("the exposition must end with a newline")
    families: dict[str, MetricFamily] = {}
    finished: set[str] = set()
    current: str | None = None
    seen_series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for number, line in enumerate(text.split("\n")[:-1], start=1):
        where = f"line {number}"
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not METRIC_NAME.fullmatch(name):
                    raise ExpositionError(f"{where}: bad metric name {name!r}")
                family = families.setdefault(name, MetricFamily(name))
                if name in finished or (parts[1] == "TYPE" and family.samples):
                    raise ExpositionError(f"{where}: {parts[1]} of {name} after its samples")
                if parts[1] == "TYPE":
                    kind = parts[3].strip() if len(parts) > 3 else ""
                    if kind not in TYPES:
                        raise ExpositionError(f"{where}: unknown type {kind!r}")
                    if family.typed:
                        raise ExpositionError(f"{where}: second TYPE line for {name}")
                    family.kind = kind
                    family.typed = True
                else:
                    if family.help is not None:
                        raise ExpositionError(f"{where}: second HELP line for {name}")
                    family.help = parts[3] if len(parts) > 3 else ""
                if current is not None and current != name:
                    finished.add(current)
                current = name
            continue
        match = METRIC_NAME.match(line)
        if match is None:
            raise ExpositionError(f"{where}: bad metric name")
        sample_name = match.group()
        pos = match.end()
        labels: dict[str, str] = {}
        if line[pos : pos + 1] == "{":
            labels, pos = _parse_labels(line, pos, where)
        rest = line[pos:].split()
        if not line[pos : pos + 1].isspace() or len(rest) not in (1, 2):
            raise ExpositionError(f"{where}: expected a value and an optional timestamp")
        value = _parse_float(rest[0], where)
        if len(rest) == 2 and not re.fullmatch(r"-?\d+", rest[1]):
            raise ExpositionError(f"{where}: bad timestamp {rest[1]!r}")
        family_name = sample_name
        for name, fam in families.items():
            if any(sample_name == name + s for s in _SUFFIXES.get(fam.kind, ())):
                family_name = name
        family = families.setdefault(family_name, MetricFamily(family_name))
        if family_name in finished:
            raise ExpositionError(f"{where}: samples of {family_name} are not in one group")
        if current is not None and current != family_name:
            finished.add(current)
        current = family_name
        series = (sample_name, tuple(sorted(labels.items())))
        if series in seen_series:
            raise ExpositionError(f"{where}: series {sample_name}{labels} given twice")
        seen_series.add(series)
        if family.kind == "counter" and (value < 0 or math.isnan(value)):
            raise ExpositionError(f"{where}: counter {sample_name} is negative")
        family.samples.append(Sample(sample_name, labels, value))
    for family in families.values():
        if family.kind == "histogram":
            _check_histogram(family)
    return families


def _check_histogram(family: MetricFamily) -> None:
    groups: dict[tuple[tuple[str, str], ...], list[Sample]] = {}
    for sample in family.samples:
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        groups.setdefault(key, []).append(sample)
    for key, samples in groups.items():
        buckets = [s for s in samples if s.name == family.name + "_bucket"]
        if any("le" not in s.labels for s in buckets):
            raise ExpositionError(f"{family.name}{key}: a bucket without le")
        bounds = [_parse_float(s.labels["le"], family.name) for s in buckets]
        if bounds != sorted(bounds) or not bounds or bounds[-1] != math.inf:
            raise ExpositionError(f'{family.name}{key}: buckets must rise to le="+Inf"')
        counts = [s.value for s in buckets]
        if counts != sorted(counts):
            raise ExpositionError(f"{family.name}{key}: bucket counts are not cumulative")
        count = [s.value for s in samples if s.name == family.name + "_count"]
        total = [s.value for s in samples if s.name == family.name + "_sum"]
        if count != [counts[-1]] or len(total) != 1:
            raise ExpositionError(f"{family.name}{key}: _count must equal the +Inf bucket, "
                                  "with one _sum")  # fmt: skip
