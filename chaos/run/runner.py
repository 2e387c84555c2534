"""Run one case: fork the worker with its fault, roll back for a power loss, resume, check.

The rig is the client: it records what was acknowledged (an op's ack event, or a
worker's reply), then lets a fresh worker resume and finish the scenario, and hands
the files to the oracle.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from typing import Final

from chaos.cases import Case, CaseResult
from chaos.faults.hook import FaultKind
from chaos.faults.model import DurableModel, PowerVariant
from chaos.oracle.api_state import check_api_state
from chaos.oracle.oracle import (
    ClientLog,
    LogsView,
    check_after_fault,
    check_final,
    file_digests,
    snapshot_logs,
)
from chaos.oracle.torn import describe, expected_torn_place, torn_refusal_checked
from chaos.run.app_contract import check_app_contract, learned_shapes
from chaos.run.crash_states import Mark, StateCache, state_key
from chaos.run.damage_case import run_damage_case
from chaos.run.hostile import run_hostile_case
from chaos.run.probes import run_probes
from chaos.run.worker_run import ChildRun, fork_child
from chaos.scenarios.app_loading import CleanRunFailed, import_app, last_line
from chaos.scenarios.scenarios import SCENARIOS, SESSION, Scenario
from worker.offline.repair import repair_torn_tail
from worker.store.errors import SessionError

MAX_RESUMES: Final = 4


@dataclass(slots=True)
class _FirstCrash:
    """The files, acknowledgements and durability model a first fault left, to be copied."""

    key: tuple[object, ...]
    files: str
    log: ClientLog
    model: DurableModel | None


_first_crash: _FirstCrash | None = None


def run_case(
    case: Case,
    workdir: str,
    *,
    crash_cache: str | None = None,
    states: StateCache | None = None,
) -> CaseResult:
    """Run ``case`` in a fresh home under ``workdir`` and check every invariant.

    Compound cases that share their first fault (same scenario, fault, boundary and
    mutant) may share its outcome: with ``crash_cache`` the files that fault really left
    are kept there and copied for the next such case, which then only crashes the
    recovery (or cuts the power under the resumed worker).

    With ``states`` each distinct crash state is recovered and checked once: a case
    whose state (``chaos.run.crash_states``) was checked already takes its verdict.
    """
    if case.fault is FaultKind.HOSTILE:
        return run_hostile_case(case, workdir)  # not a crash: planted, then tried thrice
    if case.app is not None:
        clean_steps(case.scenario, workdir, app=case.app)  # learns the app's shapes
    scenario = scenario_for(case.scenario, case.app)
    if case.fault is FaultKind.DAMAGE:
        boundary = boundary_name(case.scenario, case.at, case.app)
        return run_damage_case(case, scenario, workdir, boundary)
    result = CaseResult(case=case.id, fault=case.fault.value, boundary="", app=case.app)
    root = tempfile.mkdtemp(prefix="case-", dir=workdir)
    home = os.path.abspath(os.path.join(root, "home"))
    output = os.path.join(root, "worker.out")
    compound = bool(case.recovery_at) or case.power_at is not None
    key = (case.scenario, case.fault, case.variant, case.at, case.power_at is None, case.mutant,
           case.app)  # fmt: skip
    reused = _first_crash if compound and crash_cache is not None else None
    if reused is not None and reused.key == key and os.path.isdir(reused.files):
        shutil.copytree(reused.files, home, symlinks=True)
        log = copy.deepcopy(reused.log)
        model = reused.model.rebased(home) if reused.model is not None else None
        result.boundary = boundary_name(case.scenario, case.at, case.app)
        result.notes.append("first fault's files shared with the other compounds of this fault")
    else:
        log, model = _first_run(case, scenario, home, output, result)
        if compound and crash_cache is not None:
            _keep_first_crash(key, home, log, model, crash_cache)
    skip = frozenset({os.path.basename(output)})
    before_power: tuple[str, Mark] | None = None
    if case.power_at is not None and model is not None:
        if states is not None:
            state = state_key(case, root, log, skip=skip, model=model)
            if _shared(states, state, result):
                return result
            before_power = (state, Mark.of(result))
        check_after_fault(result, scenario, log, snapshot_logs(home))
        _resume_then_power_loss(case, scenario, home, output, log, model, result)
    if states is not None:
        state = state_key(case, root, log, skip=skip)
        if not _shared(states, state, result):
            mark = Mark.of(result)
            result.state = state
            _recover_and_check(case, scenario, home, output, log, result)
            states.put(state, result, mark)
        if before_power is not None:
            states.put(before_power[0], result, before_power[1])
        return result
    _recover_and_check(case, scenario, home, output, log, result)
    return result


def _shared(states: StateCache, key: str, result: CaseResult) -> bool:
    """Give ``result`` the verdict of state ``key`` if it was checked already."""
    known = states.get(key)
    if known is None:
        return False
    known.give(result)
    return True


def _recover_and_check(
    case: Case, scenario: Scenario, home: str, output: str, log: ClientLog, result: CaseResult
) -> None:
    """Everything after the fault: the checks of the files it left, the resumes, the
    oracle, the App contract."""
    after_fault = snapshot_logs(home)
    check_after_fault(result, scenario, log, after_fault)
    _resume_and_check(case, scenario, home, output, log, after_fault, result)
    run_probes(result, scenario, home, log, case.mutant)
    if case.app is not None:
        check_app_contract(result, scenario, home, log)


def _keep_first_crash(
    key: tuple[object, ...],
    home: str,
    log: ClientLog,
    model: DurableModel | None,
    crash_cache: str,
) -> None:
    global _first_crash  # noqa: PLW0603 - one process, one kept crash at a time
    files = os.path.join(crash_cache, f"first-crash-{os.getpid()}")  # one per process
    shutil.rmtree(files, ignore_errors=True)
    shutil.copytree(home, files, symlinks=True)
    kept = model.rebased(files) if model is not None else None
    _first_crash = _FirstCrash(key=key, files=files, log=copy.deepcopy(log), model=kept)


def _first_run(
    case: Case, scenario: Scenario, home: str, output: str, result: CaseResult
) -> tuple[ClientLog, DurableModel | None]:
    """Run the scenario in a worker with the case's fault armed; return what was acked.

    The durability model is kept (and returned) for a power loss, now or later.
    """
    os.mkdir(home)
    if scenario.prepare is not None:
        scenario.prepare(home)
    power_later = case.power_at is not None
    traced = case.fault is FaultKind.POWER or power_later
    model = DurableModel.snapshot(home) if traced else None
    log = ClientLog()
    for key in snapshot_logs(home).applied_keys() if scenario.prepare is not None else []:
        log.ack(key, 0)  # acknowledged before the scenario began
    first = fork_child(
        home,
        scenario,
        log,
        resume=False,
        fault=case.fault,
        variant=case.variant,
        at=case.at,
        mutant=case.mutant,
        output=output,
        trace=traced,
    )
    result.boundary = boundary_name(case.scenario, case.at, case.app)
    if model is not None:
        for step in first.steps:
            model.apply(step)
        if case.fault is FaultKind.POWER:
            model.power_loss(PowerVariant(case.variant))
    return log, model


def _resume_then_power_loss(
    case: Case,
    scenario: Scenario,
    home: str,
    output: str,
    log: ClientLog,
    model: DurableModel,
    result: CaseResult,
) -> None:
    """A fresh worker resumes and acknowledges more work; then the power fails under it.

    The power fails at boundary ``power_at`` of that worker (or after it finished), and
    the files become what the model says every step since the case began made durable.
    """
    resumed = fork_child(
        home,
        scenario,
        log,
        resume=True,
        fault=FaultKind.POWER,
        variant=PowerVariant.DROP.value,
        at=case.power_at or 0,
        mutant=case.mutant,
        output=output,
        trace=True,
    )
    _check_resumed(result, resumed)
    for step in resumed.steps:
        model.apply(step)
    model.power_loss(PowerVariant.DROP)
    where = f"its boundary {case.power_at}" if case.power_at else "its end"
    result.notes.append(f"a fresh worker resumed; the power failed at {where}")


def _check_resumed(result: CaseResult, run: ChildRun) -> None:
    """What a resumed worker must hold while it runs: the lock alone, the disk's state."""
    result.checked.append("single-writer")
    if run.intruders:
        result.violate(
            "single-writer",
            f"{' and '.join(run.intruders)} got the session while a worker held it",
        )
    check_api_state(result, run.reported, run.implied)


def _resume_and_check(
    case: Case,
    scenario: Scenario,
    home: str,
    output: str,
    log: ClientLog,
    after_fault: LogsView,
    result: CaseResult,
) -> None:
    """Resume with fresh workers until one finishes the scenario; then the oracle."""
    for attempt in range(MAX_RESUMES):
        compound = case.recovery_at if attempt == 0 else 0
        torn = expected_torn_place(home)
        before = file_digests(home) if torn is not None else {}
        resumed = fork_child(
            home,
            scenario,
            log,
            resume=True,
            fault=FaultKind.KILL if compound else FaultKind.NONE,
            at=compound,
            mutant=case.mutant,
            output=output,
            trace=False,
        )
        _check_resumed(result, resumed)
        if torn is not None:
            result.checked.append("torn-log-refused-unchanged")
            if file_digests(home) != before:
                result.violate(
                    "torn-log-refused-unchanged",
                    f"files changed by a worker facing the torn {describe(torn)}",
                )
                break
            if resumed.refused is None:
                result.violate(
                    "torn-log-refused-unchanged",
                    f"{describe(torn)} is torn but the worker did not refuse it",
                )
                break
        if resumed.refused is not None:
            if not torn_refusal_checked(result, torn, resumed.refused):
                break
            try:
                repair_torn_tail(home, SESSION)  # the operator's explicit step
            except SessionError as exc:
                result.violate("final-state-opens", f"the torn log cannot be repaired: {exc}")
                break
            result.notes.append("torn tail refused, then repaired explicitly")
            continue
        if resumed.killed and compound:
            continue
        break
    else:
        result.violate("resume-completes", f"no clean resume after {MAX_RESUMES} tries")
    check_final(result, scenario, log, after_fault, home)
    if result.violations and os.path.exists(output):
        with open(output, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-600:]
        if tail:
            result.notes.append(f"worker output: {tail}")


_CLEAN_STEPS: dict[tuple[str, str | None], list[dict[str, object]]] = {}
_SHAPES: dict[tuple[str, str], tuple[tuple[str, tuple[str, ...]], ...]] = {}


class AppScenarioError(ValueError):
    """A scenario that cannot host a user's App (it drives the store, not a worker)."""


def scenario_for(name: str, app: str | None) -> Scenario:
    """Scenario ``name``, with the user's ``app`` in its worker when one is given.

    With an app, the records each request appends are those of the app's clean run
    (``clean_steps`` learns them) and the App contract is checked.
    """
    spec = SCENARIOS[name]
    if app is None:
        return spec
    if not spec.worker_level:
        raise AppScenarioError(f"scenario {name} drives the store directly: it hosts no app")
    if not spec.hosts_apps:
        raise AppScenarioError(f"scenario {name} runs the rig's own app only")
    import_app(app)
    return replace(spec, app=app, contract=True, shapes=_SHAPES.get((name, app), ()))


def clean_steps(scenario: str, workdir: str, *, app: str | None = None) -> list[dict[str, object]]:
    """The boundaries of a clean run of ``scenario`` (counted once per process)."""
    if (scenario, app) not in _CLEAN_STEPS:
        spec = scenario_for(scenario, app)
        root = tempfile.mkdtemp(prefix="count-", dir=workdir)
        home = os.path.abspath(os.path.join(root, "home"))
        os.mkdir(home)
        if spec.prepare is not None:
            spec.prepare(home)
        output = os.path.join(root, "clean-run.out")
        run = fork_child(home, spec, ClientLog(), resume=False, output=output)
        if run.code != 0:
            raise CleanRunFailed(scenario, app, run.code, last_line(output))
        if app is not None:
            _SHAPES[(scenario, app)] = learned_shapes(snapshot_logs(home))
        _CLEAN_STEPS[(scenario, app)] = run.steps
    return _CLEAN_STEPS[(scenario, app)]


def boundary_name(scenario: str, at: int, app: str | None = None) -> str:
    """``step file`` of boundary ``at`` in the clean run, e.g. ``fsync 0.jsonl``."""
    for step in _CLEAN_STEPS.get((scenario, app), []):
        if step.get("k") == at:
            return f"{step['step']} {os.path.basename(str(step['path']))}"
    return f"boundary {at}" if at else "-"
