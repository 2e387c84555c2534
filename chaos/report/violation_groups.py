"""Violations grouped by invariant and first cause: one bug, one group, one replay line.

The first cause of a violating case is its first violation's invariant and text, with
what varies from case to case (numbers, quoted values, lists, paths, digests) taken
out, so the 122 cases one bug breaks are one group with a count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from chaos.cases import CaseResult

_VARYING: Final = re.compile(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|/[^\s:,;)]+|[0-9a-f]{8,}|\d+")


def first_cause(result: CaseResult) -> tuple[str, str]:
    """The group of a violating case: its first violation's invariant and its text with
    what varies from case to case (numbers, quoted values, lists, paths) taken out."""
    invariant, _, detail = result.violations[0].partition(": ")
    return invariant, _VARYING.sub("…", detail)


@dataclass(slots=True)
class Group:
    """Violating cases of one invariant and first cause."""

    invariant: str
    cause: str
    count: int = 0
    example: CaseResult | None = None

    def to_json(self) -> dict[str, object]:
        assert self.example is not None
        return {
            "invariant": self.invariant, "cause": self.cause, "count": self.count,
            "example": self.example.case, "violation": self.example.violations[0],
            "replay": self.example.replay_line,
        }  # fmt: skip


def group_violations(results: list[CaseResult]) -> list[Group]:
    """The groups of the violating ``results``, the largest first; each group's example
    is its case with the shortest id (the simplest to replay)."""
    groups: dict[tuple[str, str], Group] = {}
    for result in results:
        if not result.violations:
            continue
        key = first_cause(result)
        group = groups.setdefault(key, Group(*key))
        group.count += 1
        if group.example is None or (len(result.case), result.case) < (
            len(group.example.case),
            group.example.case,
        ):
            group.example = result
    return sorted(groups.values(), key=lambda g: (-g.count, g.invariant, g.cause))
