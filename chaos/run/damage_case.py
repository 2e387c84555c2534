"""Run a "damage" case: the scenario with a sealed log damaged under the live worker.

The invariant ``damage-refused``: the damage is always refused with its ``path:line``,
never served, and reading changes nothing:
- the history reading (``loopd verify``, ``inspect --all``) refuses it at its place;
- a fresh worker refuses the session when open reads the damaged log (the newest
  sealed one, which open reads for its EpochEnd and binding); a damaged older log is
  outside what open reads (docs/format.md), and the session opens;
- the reader of a sealed epoch's records (a duplicate's answer, a page) refuses it;
- ``loopd repair`` refuses it and changes nothing; no file changes.
"""

from __future__ import annotations

import json
import os
import tempfile

from chaos.cases import Case, CaseResult
from chaos.faults.damage import damage_record_path
from chaos.faults.hook import FaultKind
from chaos.oracle.oracle import ClientLog, file_digests
from chaos.run.worker_run import fork_child
from chaos.scenarios.scenarios import SESSION, Scenario
from worker.offline.repair import repair_torn_tail
from worker.store.epochs.sealed_logs import read_sealed
from worker.store.errors import LogError, SessionError
from worker.store.inspection import inspect_session

INVARIANT = "damage-refused"


def run_damage_case(case: Case, scenario: Scenario, workdir: str, boundary: str) -> CaseResult:
    """Run ``case`` (fault DAMAGE) in a fresh home under ``workdir`` and check the invariant."""
    result = CaseResult(case=case.id, fault=case.fault.value, boundary=boundary, app=case.app)
    root = tempfile.mkdtemp(prefix="case-", dir=workdir)
    home = os.path.abspath(os.path.join(root, "home"))
    output = os.path.join(root, "worker.out")
    os.mkdir(home)
    if scenario.prepare is not None:
        scenario.prepare(home)
    log = ClientLog()
    fork_child(home, scenario, log, resume=False, fault=FaultKind.DAMAGE,
               variant=case.variant, at=case.at, mutant=case.mutant, output=output,
               trace=False)  # fmt: skip
    record = damage_record_path(home)
    result.checked.append(INVARIANT)
    if not os.path.exists(record):
        result.violate(INVARIANT, "the damage was never applied (no record of it)")
        return result
    with open(record, encoding="utf-8") as f:
        damaged = json.load(f)["damaged"]
    if damaged is None:
        result.notes.append("no epoch was sealed yet at this boundary: nothing damaged")
        return result
    place = f"{damaged['path']}:{damaged['line']}: "
    places = tuple(f"{damaged['path']}:{line}: " for line in damaged["lines"])
    result.notes.append(f"{damaged['variant']} in sealed epoch {damaged['epoch']} at {place}")
    before = file_digests(home)
    _check_refused(result, places, "the history reading (verify)",
                   lambda: inspect_session(home, SESSION, history=True))  # fmt: skip
    _check_refused(result, places, "the sealed epoch's reader",
                   lambda: read_sealed(os.path.dirname(str(damaged["path"])),
                                       int(damaged["epoch"])))  # fmt: skip
    try:
        repair_torn_tail(home, SESSION)
    except SessionError:
        pass
    else:
        result.violate(INVARIANT, f"repair changed a session whose sealed log is damaged ({place})")
    if file_digests(home) != before:
        result.violate(INVARIANT, "files changed by reading a damaged session")
    # Last: a worker that may serve (the damage older than what open reads) may write, as
    # the cluster scenario's does (an Owner at every start).
    _check_open(result, home, scenario, log, output, damaged, places, case.mutant)
    return result


def _check_refused(result: CaseResult, places: tuple[str, ...], who: str, read: object) -> None:
    assert callable(read)
    place = places[0]
    try:
        read()
    except LogError as exc:
        if not str(exc).startswith(places):
            result.violate(INVARIANT, f"{who} refused elsewhere: {exc}, the damage is at {place}")
    except SessionError as exc:
        result.violate(INVARIANT, f"{who} refused without the damage's place: {exc}")
    else:
        result.violate(INVARIANT, f"{who} served the damaged log ({place})")


def _check_open(
    result: CaseResult,
    home: str,
    scenario: Scenario,
    log: ClientLog,
    output: str,
    damaged: dict[str, object],
    places: tuple[str, ...],
    mutant: str | None,
) -> None:
    """A fresh worker must refuse the session when open reads the damaged log."""
    newest = max(
        int(name[:-6]) for name in os.listdir(os.path.dirname(str(damaged["path"])))
        if name.endswith(".jsonl") and name[:-6].isdigit()
    )  # fmt: skip
    resumed = fork_child(home, scenario, log, resume=True, output=output, trace=False,
                         mutant=mutant)  # fmt: skip
    if int(str(damaged["epoch"])) == newest - 1:
        if resumed.refused is None:
            result.violate(INVARIANT, f"a fresh worker opened the session, damaged at {places[0]}")
        elif not str(resumed.refused.get("why", "")).startswith(places):
            result.violate(
                INVARIANT, f"a fresh worker refused elsewhere: {resumed.refused}, not {places[0]}"
            )
    else:
        result.notes.append("the damaged epoch is older than the one open reads: verify's")
