"""Which cases to run: every boundary of each scenario for each fault, plus compound cases."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from typing import Final

from chaos.cases import Case, ThenPower, enumerate_cases
from chaos.faults.hook import EXTRA_FAULTS, FaultKind
from chaos.oracle.oracle import ClientLog, snapshot_logs
from chaos.run.runner import clean_steps, scenario_for
from chaos.run.worker_run import fork_child
from worker.store.disk.durable import Step

# Every fault kind the hook knows (a new kind joins the default sweep by being one).
ALL_FAULTS: tuple[FaultKind, ...] = tuple(k for k in FaultKind if k is not FaultKind.NONE)


# The first faults of the "then power loss" compounds: a kill anywhere, and an I/O error
# at an fsync of a file or a directory (which the store must redo, never trust, before
# it acknowledges anything).
_POWER_AFTER_IO: Final = (Step.FSYNC, Step.FSYNC_DIR)


def build_cases(
    scenarios: Iterable[str],
    faults: Iterable[FaultKind],
    workdir: str,
    *,
    compound: bool = False,
    then_power: ThenPower | None = None,
    mutant: str | None = None,
    app: str | None = None,
) -> list[Case]:
    """Count each scenario's boundaries with a clean run, then list every case.

    ``compound`` lists every compound case (``then_power`` defaults to EVERY with it).
    With ``app`` (module:attribute) the worker-level scenarios host that App instead.
    """
    if then_power is None:
        then_power = ThenPower.EVERY if compound else ThenPower.NONE
    cases: list[Case] = []
    wanted = list(faults)
    for name in scenarios:
        steps = [Step(str(s["step"])) for s in clean_steps(name, workdir, app=app)]
        recovery = recovery_counts(name, len(steps), workdir, app=app) if compound else None
        resume = power_compounds(name, steps, then_power, workdir, mutant=mutant, app=app)
        kinds = faults_for(name, wanted, app)
        cases += enumerate_cases(name, steps, kinds, mutant=mutant, recovery_steps=recovery,
                                 resume_steps=resume, app=app)  # fmt: skip
    return cases


def faults_for(scenario: str, faults: Iterable[FaultKind], app: str | None) -> list[FaultKind]:
    """``faults`` without the kinds ``scenario`` does not take (lease, hostile: only the
    scenarios that name them among their ``extra_faults``; none it names among its
    ``skip_faults``)."""
    spec = scenario_for(scenario, app)
    return [
        k
        for k in faults
        if (k not in EXTRA_FAULTS or k.value in spec.extra_faults)
        and k.value not in spec.skip_faults
    ]


def power_compounds(
    scenario: str,
    steps: list[Step],
    then_power: ThenPower,
    workdir: str,
    *,
    mutant: str | None = None,
    app: str | None = None,
) -> dict[tuple[FaultKind, str, int], int]:
    """The first faults of the "then power loss" compounds, each with the number of
    boundaries of the worker that resumes after it (0 when only the end is wanted, 1
    when the first boundary and the end are)."""
    if then_power is ThenPower.NONE:
        return {}
    firsts = power_firsts(steps)
    if then_power in (ThenPower.END, ThenPower.FIRST):
        return dict.fromkeys(firsts, int(then_power is ThenPower.FIRST))
    return {
        first: resume_count(scenario, *first, workdir, mutant=mutant, app=app) for first in firsts
    }


def power_firsts(steps: list[Step]) -> list[tuple[FaultKind, str, int]]:
    """The first faults (kind, variant, boundary) of the "then power loss" compounds."""
    firsts = [(FaultKind.KILL, "-", k) for k in range(1, len(steps) + 1)]
    firsts += [
        (FaultKind.IO, "eio", k) for k, step in enumerate(steps, start=1) if step in _POWER_AFTER_IO
    ]
    return firsts


def resume_count(
    scenario: str,
    kind: FaultKind,
    variant: str,
    at: int,
    workdir: str,
    *,
    mutant: str | None = None,
    app: str | None = None,
) -> int:
    """How many boundaries the worker resuming after the first fault (kind, variant,
    at) has: the "then power loss" compounds of that fault are one per boundary, and
    one after the last."""
    spec = scenario_for(scenario, app)
    root = tempfile.mkdtemp(prefix="resume-", dir=workdir)
    home = os.path.join(root, "home")
    os.mkdir(home)
    if spec.prepare is not None:
        spec.prepare(home)
    fork_child(home, spec, ClientLog(), resume=False, fault=kind, variant=variant, at=at,
               mutant=mutant, trace=False)  # fmt: skip
    return len(fork_child(home, spec, ClientLog(), resume=True, mutant=mutant).steps)


def recovery_counts(
    scenario: str, boundaries: int, workdir: str, *, app: str | None = None
) -> dict[int, int]:
    """For each kill boundary that leaves an interrupted epoch change (EpochEnd last),
    how many boundaries the recovery after it has (so each can be crashed in turn)."""
    counts = {}
    for k in range(1, boundaries + 1):
        count = recovery_count(scenario, k, workdir, app=app)
        if count:
            counts[k] = count
    return counts


def recovery_count(scenario: str, at: int, workdir: str, *, app: str | None = None) -> int:
    """How many boundaries the recovery after a kill at boundary ``at`` has when that
    kill leaves an interrupted epoch change (EpochEnd last); 0 when it does not."""
    spec = scenario_for(scenario, app)
    root = tempfile.mkdtemp(prefix="recovery-", dir=workdir)
    home = os.path.join(root, "home")
    os.mkdir(home)
    if spec.prepare is not None:
        spec.prepare(home)
    fork_child(home, spec, ClientLog(), resume=False, fault=FaultKind.KILL, at=at, trace=False)
    view = snapshot_logs(home)
    if not view.epochs or view.closing_summary(max(view.epochs)) is None:
        return 0
    return len(fork_child(home, spec, ClientLog(), resume=True).steps)
