"""``loopd chaos run --store URI``: every seam fault at every fenced write, against a database."""

from __future__ import annotations

from collections.abc import Callable

from chaos.cases import CaseResult
from chaos.postgres.case import SEAM_SCENARIOS, SeamCase, clean_writes, run_seam_case
from chaos.postgres.faults import SEAM_FAULTS


def seam_cases(uri: str) -> list[SeamCase]:
    """Each seam scenario's cases: every fault kind at each write of its clean run."""
    cases = []
    for scenario in SEAM_SCENARIOS:
        writes = clean_writes(uri, scenario)
        cases += [
            SeamCase(scenario=scenario, fault=fault, at=at)
            for fault in SEAM_FAULTS
            for at in range(1, writes + 1)
        ]
    return cases


def run_seam_sweep(uri: str, on_result: Callable[[CaseResult], None]) -> list[CaseResult]:
    """Run every seam case one after another (each in its own schema of ``uri``)."""
    results = []
    for case in seam_cases(uri):
        result = run_seam_case(uri, case)
        on_result(result)
        results.append(result)
    return results
