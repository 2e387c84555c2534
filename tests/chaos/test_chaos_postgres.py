"""The rig at the PostgreSQL seam: faults at a fenced write's COMMIT against a real server.

A slice runs by default (one case of each fault kind at a group commit and at an epoch
change, and the seam mutant's pinned cases); every fault at every write with -m sweep.
"""

from __future__ import annotations

import pytest

from chaos.mutants import SEAM_MUTANTS
from chaos.postgres.case import SeamCase, clean_writes, run_seam_case
from chaos.postgres.faults import SEAM_FAULTS, SeamFault
from tests.harness.postgres_server import PostgresServer

# Write 3 is the group commit of k3; write 5 the first line of epoch 1 (its baseline too).
SLICE_WRITES = (3, 5)


@pytest.fixture(scope="module")
def database(postgres_server: PostgresServer) -> str:
    return postgres_server.new_database()


@pytest.mark.parametrize("fault", SEAM_FAULTS, ids=[f.value for f in SEAM_FAULTS])
def test_a_fault_at_the_seam_loses_nothing_acknowledged_and_applies_nothing_twice(
    database: str, fault: SeamFault
) -> None:
    for at in SLICE_WRITES:
        result = run_seam_case(database, SeamCase(scenario="basic", fault=fault, at=at))
        assert result.outcome == "ok", result.violations
        assert {"acknowledged-on-disk", "no-key-twice", "one-epoch-end-last"} <= set(result.checked)


def test_a_lost_commit_reply_breaks_the_worker_and_the_retry_finds_the_key(database: str) -> None:
    case = SeamCase(scenario="basic", fault=SeamFault.LOST_AFTER, at=3)
    result = run_seam_case(database, case)
    assert result.outcome == "ok", result.violations
    assert any("outcome is unknown" in note for note in result.notes), result.notes


def test_a_claim_during_a_write_fences_every_later_write_of_the_deposed_owner(
    database: str,
) -> None:
    result = run_seam_case(database, SeamCase(scenario="basic", fault=SeamFault.FENCE, at=3))
    assert result.outcome == "ok", result.violations
    assert "deposed-writes-invisible" in result.checked
    assert any("owner token" in note for note in result.notes), result.notes


@pytest.mark.parametrize("name", sorted(SEAM_MUTANTS))
def test_the_seam_rig_catches_the_mutant_on_its_pinned_cases(database: str, name: str) -> None:
    mutant = SEAM_MUTANTS[name]
    assert mutant.feature == "the PostgreSQL seam"
    for case_id in mutant.quick:
        case = SeamCase.parse(f"{case_id}@{name}")
        real = run_seam_case(database, SeamCase.parse(case_id))
        assert real.outcome == "ok", real.violations
        caught = run_seam_case(database, case)
        assert any(v.startswith(f"{mutant.caught_by}:") for v in caught.violations), caught


@pytest.mark.sweep
def test_every_seam_fault_at_every_write_of_basic_holds(database: str) -> None:
    writes = clean_writes(database, "basic")
    bad = []
    for fault in SEAM_FAULTS:
        for at in range(1, writes + 1):
            result = run_seam_case(database, SeamCase(scenario="basic", fault=fault, at=at))
            bad += [f"{result.case}: {v}" for v in result.violations]
    assert not bad
