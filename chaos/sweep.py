"""Which cases to run: every boundary of each scenario for each fault, plus compound cases."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable

from chaos.cases import Case, enumerate_cases
from chaos.hook import FaultKind
from chaos.oracle import ClientLog, snapshot_logs
from chaos.runner import clean_steps, fork_child
from chaos.scenarios import SCENARIOS
from worker.durable import Step

ALL_FAULTS: tuple[FaultKind, ...] = (FaultKind.KILL, FaultKind.TORN, FaultKind.POWER,
                                     FaultKind.IO)  # fmt: skip


def build_cases(
    scenarios: Iterable[str],
    faults: Iterable[FaultKind],
    workdir: str,
    *,
    compound: bool = False,
    mutant: str | None = None,
) -> list[Case]:
    """Count each scenario's boundaries with a clean run, then list every case."""
    cases: list[Case] = []
    wanted = list(faults)
    for name in scenarios:
        steps = [Step(str(s["step"])) for s in clean_steps(name, workdir)]
        recovery = recovery_counts(name, len(steps), workdir) if compound else None
        cases += enumerate_cases(name, steps, wanted, mutant=mutant, recovery_steps=recovery)
    return cases


def recovery_counts(scenario: str, boundaries: int, workdir: str) -> dict[int, int]:
    """For each kill boundary that leaves an interrupted epoch change (EpochEnd last),
    how many boundaries the recovery after it has (so each can be crashed in turn)."""
    spec = SCENARIOS[scenario]
    counts = {}
    for k in range(1, boundaries + 1):
        root = tempfile.mkdtemp(prefix="recovery-", dir=workdir)
        home = os.path.join(root, "home")
        os.mkdir(home)
        if spec.prepare is not None:
            spec.prepare(home)
        fork_child(home, spec, ClientLog(), resume=False, fault=FaultKind.KILL, at=k, trace=False)
        view = snapshot_logs(home)
        if not view.epochs or view.closing_summary(max(view.epochs)) is None:
            continue
        resumed = fork_child(home, spec, ClientLog(), resume=True)
        counts[k] = len(resumed.steps)
    return counts
