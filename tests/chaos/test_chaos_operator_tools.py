"""The operator's tools under the rig (issue 31): backup, restore and the key index
rebuild cut short by a kill or a power loss, and the model of a renamed directory that
their power losses need. The mutants of these tools run in tests/chaos/test_chaos_mutants.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.cases import Case
from chaos.faults.hook import FaultKind
from chaos.faults.model import DurableModel, PowerVariant
from chaos.oracle.tool_checks import BACKUP_WHOLE, INDEX, RERUN
from chaos.run.runner import clean_steps, run_case
from chaos.sweep.sweep import build_cases

# A kill or a power loss in each tool: the backup's copy (87), its manifest's rename
# (118) and its directory's (120); the restore's copy (150) and its rename into place
# (174); the lost index file's move (182); the rebuild (188); power after the backup's
# rename was made durable (121), after the restore's rename (175), after the rebuild was
# acknowledged (194); a kill in the rebuild, then a power loss once the resume finished.
CASES = [
    "operator-tools:kill:-:87",
    "operator-tools:kill:-:118",
    "operator-tools:kill:-:120",
    "operator-tools:kill:-:150",
    "operator-tools:kill:-:174",
    "operator-tools:kill:-:182",
    "operator-tools:kill:-:188",
    "operator-tools:power:drop:121",
    "operator-tools:power:names:175",
    "operator-tools:power:drop:194",
    "operator-tools:kill:-:188:pend",
    # A tool killed between its rename and the directory's fsync, then a power loss after
    # the rerun that found its result there: the rerun must make that name durable (the
    # restore's copy, then the backup, were gone).
    "operator-tools:kill:-:175:pend",
    "operator-tools:io:eio:121:pend",
    # The fsync that makes a new sessions/ durable failed (or the tool was killed there);
    # the rerun found sessions/ and never fsynced its parent again, so a power loss took
    # the restored copy away.
    "operator-tools:io:eio:173:pend",
    "operator-tools:kill:-:173:pend",
]


@pytest.mark.timeout(120)
def test_the_real_store_holds_every_tool_cut_short_by_a_kill_or_a_power_loss(
    tmp_path: Path,
) -> None:
    steps = clean_steps("operator-tools", str(tmp_path))
    assert len(steps) >= 190, len(steps)  # the pinned cases of the mutants count on it
    for case_id in CASES:
        result = run_case(Case.parse(case_id), str(tmp_path))
        assert result.outcome == "ok", (case_id, result.violations, result.notes)
        assert {BACKUP_WHOLE, RERUN, INDEX} <= set(result.checked), (case_id, result.checked)


def test_the_operator_tools_scenario_takes_no_damage_fault(tmp_path: Path) -> None:
    kinds = [FaultKind.DAMAGE, FaultKind.KILL]
    cases = build_cases(["operator-tools", "basic"], kinds, str(tmp_path))
    taken = {(c.scenario, c.fault) for c in cases}
    assert ("operator-tools", FaultKind.DAMAGE) not in taken
    assert {("operator-tools", FaultKind.KILL), ("basic", FaultKind.DAMAGE)} <= taken


def _renamed_directory(tmp_path: Path) -> tuple[DurableModel, Path, Path]:
    """A directory with one fsynced file, made durable, then renamed (not yet durable)."""
    root = tmp_path / "home"
    root.mkdir()
    model = DurableModel.snapshot(str(root))
    partial, whole = root / "copy.partial", root / "copy"
    partial.mkdir()
    model.apply({"step": "mkdir", "path": str(partial)})
    model.apply({"step": "fsync_dir", "path": str(root)})
    (partial / "a").write_bytes(b"data")
    for step in ("create", "write", "fsync"):
        model.apply({"step": step, "path": str(partial / "a"), "n": 4})
    model.apply({"step": "fsync_dir", "path": str(partial)})
    os.rename(partial, whole)
    model.apply({"step": "rename", "path": str(partial), "target": str(whole), "old": None})
    return model, partial, whole


def test_a_renamed_directory_keeps_its_old_name_until_its_parent_is_fsynced(
    tmp_path: Path,
) -> None:
    model, partial, whole = _renamed_directory(tmp_path)
    model.power_loss(PowerVariant.DROP)
    assert (partial / "a").read_bytes() == b"data"
    assert not whole.exists()


def test_a_renamed_directory_takes_its_files_to_the_new_name_once_durable(
    tmp_path: Path,
) -> None:
    model, partial, whole = _renamed_directory(tmp_path)
    model.apply({"step": "fsync_dir", "path": str(whole.parent)})
    model.power_loss(PowerVariant.DROP)
    assert (whole / "a").read_bytes() == b"data"
    assert not partial.exists()
