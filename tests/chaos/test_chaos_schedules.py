"""The ``schedules`` scenario: schedules carried over epoch commits, delivered once when due.

Its mutants (carried-schedules-forgotten, delivered-without-waiting) are caught on their
pinned cases by tests/chaos/test_chaos_mutants.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.cases import Case, CaseResult
from chaos.oracle.schedule_checks import DELIVERED, final
from chaos.postgres.case import SeamCase, clean_writes, run_seam_case
from chaos.postgres.faults import SEAM_FAULTS
from chaos.run.runner import clean_steps, run_case
from chaos.scenarios.scenarios import SCENARIOS
from chaos.scenarios.schedule_ops import FUTURE, PAST
from tests.harness.postgres_server import PostgresServer


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "case_id",
    ["schedules:kill:-:1", "schedules:kill:-:30", "schedules:power:names:40"],
    ids=["create", "commit", "power-loss"],
)
def test_the_real_store_passes_a_schedules_case_and_the_delivery_check_is_made(
    case_id: str, tmp_path: Path
) -> None:
    clean_steps("schedules", str(tmp_path))
    result = run_case(Case.parse(case_id), str(tmp_path))
    assert result.violations == [], result.notes
    assert DELIVERED in result.checked


def _logs(*keys: str) -> dict[int, list[dict[str, object]]]:
    return {0: [{"type": "User", "key": key} for key in keys]}


@pytest.mark.parametrize(
    ("users", "found"),
    [
        (("g1", "g2", "g3", "due-a"), []),
        (
            ("g1", "g2", "g3"),
            ["'due-a' (due " + PAST + ", acknowledged with 'g1') was delivered 0"],
        ),
        (("g1", "due-a", "due-a"), ["was delivered 2 times, not once"]),
        (("g1", "due-a", "ahead-b"), ["'ahead-b' (due " + FUTURE + ") was delivered 1 times"]),
        (("g1", "due-a", "due-c"), ["'due-c' (cancelled) was delivered 1 times"]),
    ],
    ids=["right", "never", "twice", "early", "cancelled"],
)
def test_the_delivery_check_finds_a_schedule_missing_doubled_early_or_cancelled(
    users: tuple[str, ...], found: list[str]
) -> None:
    result = CaseResult(case="schedules:kill:-:1", fault="kill", boundary="-")
    final(result, SCENARIOS["schedules"], {"g1", "g2", "g3"}, _logs(*users))
    details = [v for v in result.violations if v.startswith(f"{DELIVERED}: ")]
    assert len(details) == len(found), details
    for detail, part in zip(details, found, strict=True):
        assert part in detail


@pytest.fixture(scope="module")
def database(postgres_server: PostgresServer) -> str:
    return postgres_server.new_database()


@pytest.mark.timeout(600)
def test_every_seam_fault_at_every_write_of_schedules_holds_on_postgres(database: str) -> None:
    writes = clean_writes(database, "schedules")
    bad = []
    for fault in SEAM_FAULTS:
        for at in range(1, writes + 1):
            result = run_seam_case(database, SeamCase(scenario="schedules", fault=fault, at=at))
            assert DELIVERED in result.checked
            bad += [f"{result.case}: {v}" for v in result.violations]
    assert not bad
