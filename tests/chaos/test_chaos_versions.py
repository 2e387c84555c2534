"""The ``versions`` scenario: every resuming worker runs the App's next version.

Its mutant (next-epoch-keeps-its-app) is caught on its pinned cases by
tests/chaos/test_chaos_mutants.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.cases import Case, CaseResult
from chaos.oracle.version_checks import RESUMED, final
from chaos.run.runner import clean_steps, run_case
from chaos.scenarios.scenarios import SCENARIOS
from chaos.scenarios.versioned_app import system_of

APP = "chaos.scenarios.versioned_app:VersionedApp"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "case_id",
    ["versions:kill:-:1", "versions:kill:-:30", "versions:kill:-:60", "versions:power:names:40"],
    ids=["create", "mid-epoch", "commit", "power-loss"],
)
def test_the_real_store_passes_a_versions_case_and_the_version_check_is_made(
    case_id: str, tmp_path: Path
) -> None:
    clean_steps("versions", str(tmp_path))
    result = run_case(Case.parse(case_id), str(tmp_path))
    assert result.violations == [], result.notes
    assert RESUMED in result.checked


def _start(epoch: int, version: str) -> dict[str, object]:
    return {"type": "SessionStart", "epoch": epoch, "app": APP, "app_version": version}


def _changed(old: str, new: str) -> dict[str, object]:
    return {"type": "AppChanged", "app": APP, "from_version": old, "to_version": new}


def _baselines(*versions: str) -> dict[int, bytes]:
    return {n: json.dumps({"system": system_of(v)}).encode() for n, v in enumerate(versions)}


OPEN_UNDER_1: dict[int, list[dict[str, object]]] = {
    0: [_start(0, "1"), {"type": "User", "key": "v0"}]
}
RIGHT: dict[int, list[dict[str, object]]] = {
    0: [_start(0, "1"), {"type": "User"}, _changed("1", "2"), {"type": "EpochEnd"}]
}


@pytest.mark.parametrize(
    ("epochs", "baselines", "found"),
    [
        ({**RIGHT, 1: [_start(1, "2")]}, _baselines("1", "2"), []),
        (
            {**RIGHT, 1: [_start(1, "1")]},
            _baselines("1", "1"),
            ["epoch 1, begun after the fault by a worker of version 2, names version 1"],
        ),
        (
            {0: [_start(0, "1"), {"type": "EpochEnd"}], 1: [_start(1, "2")]},
            _baselines("1", "2"),
            ["epoch 0 holds AppChanged [], not [('1', '2')]"],
        ),
        (
            {**RIGHT, 1: [_start(1, "2"), _changed("1", "2")]},
            _baselines("1", "2"),
            ["epoch 1 holds AppChanged [('1', '2')], not []"],
        ),
        (
            {**RIGHT, 1: [_start(1, "2")]},
            _baselines("1", "1"),
            ["epoch 1 names version 2 but its baseline is 'versioned app 1'"],
        ),
        (
            {**RIGHT, 1: [{"type": "SessionStart", "app": "other:App", "app_version": "2"}]},
            _baselines("1", "2"),
            ["epoch 1's SessionStart names ('other:App', '2')"],
        ),
    ],
    ids=[
        "right",
        "new-epoch-old-version",
        "no-app-changed",
        "app-changed-twice",
        "baseline-of-another-version",
        "another-app",
    ],
)
def test_the_version_check_finds_an_epoch_named_or_built_by_the_wrong_version(
    epochs: dict[int, list[dict[str, object]]], baselines: dict[int, bytes], found: list[str]
) -> None:
    result = CaseResult(case="versions:kill:-:1", fault="kill", boundary="-")
    final(result, SCENARIOS["versions"], OPEN_UNDER_1, epochs, baselines)
    details = [v for v in result.violations if v.startswith(f"{RESUMED}: ")]
    assert len(details) == len(found), details
    for detail, part in zip(details, found, strict=True):
        assert part in detail


def test_a_users_app_never_runs_the_versions_scenario() -> None:
    assert not SCENARIOS["versions"].hosts_apps
