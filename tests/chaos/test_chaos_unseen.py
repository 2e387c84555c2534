"""The rig's scenarios, fault kinds and checks for what it once missed (issue 19, part 0):
retries of every age through the real client, call numbers across a commit, a cluster
node's lease and tokens, what an error reply says, and a hostile disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.cases import Case
from chaos.faults.hook import FaultKind
from chaos.run.hostile import plant
from chaos.run.runner import clean_steps, run_case
from chaos.sweep.sweep import build_cases


def _run(ids: list[str], workdir: str) -> list[tuple[str, str, list[str], list[str]]]:
    results = []
    for case_id in ids:
        case = Case.parse(case_id)
        clean_steps(case.scenario, workdir)
        result = run_case(case, workdir)
        results.append((case_id, result.outcome, result.violations, result.checked))
    return results


def test_the_new_fault_kinds_apply_only_to_the_scenarios_naming_them(tmp_path: Path) -> None:
    extra = [FaultKind.LEASE, FaultKind.HOSTILE]
    assert build_cases(["requests", "calls"], extra, str(tmp_path)) == []
    kinds = {c.fault for c in build_cases(["basic", "cluster"], extra, str(tmp_path))}
    assert kinds == {FaultKind.LEASE, FaultKind.HOSTILE}


@pytest.mark.timeout(100)
def test_the_real_store_holds_a_slice_of_each_new_scenario(tmp_path: Path) -> None:
    ids = ["calls:kill:-:1", "calls:kill:-:40", "retries:kill:-:30", "retries:kill:-:60",
           "cluster:kill:-:10", "cluster:lease:lapse:18", "cluster:lease:lapse:20"]  # fmt: skip
    results = _run(ids, str(tmp_path))
    assert [(i, o, v) for i, o, v, _c in results if o != "ok"] == []
    checked = {name for *_rest, names in results for name in names}
    assert {
        "call-numbers-handed-out-once", "retry-answered-from-log", "no-ack-without-lease",
        "fencing-tokens-in-order", "stale-owner-refused-unchanged",
    } <= checked  # fmt: skip


def test_every_hostile_variant_is_planted_and_refused(tmp_path: Path) -> None:
    cases = build_cases(["basic"], [FaultKind.HOSTILE], str(tmp_path))
    last_of_each = {c.variant: c.id for c in cases}  # the latest boundary: most to damage
    results = _run(sorted(last_of_each.values()), str(tmp_path))
    assert [(i, v) for i, o, v, _c in results if o != "ok"] == []
    assert all("hostile-refused-unchanged" in c for *_rest, c in results), results


def test_a_planted_damage_names_the_line_it_damaged(tmp_path: Path) -> None:
    home = tmp_path / "home"
    directory = home / "sessions" / "chaos"
    directory.mkdir(parents=True)
    lines = [b'{"type":"SessionStart","x":1}', b'{"type":"User","part":1,"parts":3}',
             b'{"type":"ToolResult","part":2,"parts":3}', b'{"type":"Usage","part":3,"parts":3}',
             b'{"type":"User","a":2}']  # fmt: skip
    (directory / "0.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    earlier = plant(str(home), "earlier", "", str(tmp_path))
    assert earlier is not None
    assert earlier.lines == {3}
    assert earlier.tail_from is None
    assert (directory / "0.jsonl").read_bytes().split(b"\n")[2].endswith(b"]")
    gap = plant(str(home), "gap", "", str(tmp_path))
    assert gap is not None
    assert gap.lines == {2, 3}
    fifo = plant(str(home), "fifo", "", str(tmp_path))
    assert fifo is not None
    assert os.path.exists(fifo.path)
    assert not os.path.isfile(fifo.path)


def test_a_token_below_an_older_epochs_owner_is_refused_after_a_reopen(tmp_path: Path) -> None:
    from chaos.scenarios.scenarios import baseline_for
    from worker.store.errors import SessionError
    from worker.store.fencing import write_owner
    from worker.store.session import Session

    with Session.create(str(tmp_path), "s", baseline_for(""), 0) as session:
        write_owner(session, "node-a", 5)
        session.commit_epoch("summary", baseline_for("summary"))
    with Session.open(str(tmp_path), "s") as session, pytest.raises(SessionError):
        write_owner(session, "node-old", 3)


def test_the_probe_scenarios_host_no_users_app() -> None:
    from chaos.run.runner import AppScenarioError, scenario_for

    for name in ("retries", "cluster"):
        with pytest.raises(AppScenarioError, match="runs the rig's own app only"):
            scenario_for(name, "examples.notes_app:NotesApp")
