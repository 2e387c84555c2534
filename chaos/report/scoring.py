"""Score the rig against its mutants: which invariants catch each broken store.

A mutant counts as caught by a case only where the real store holds the same case:
a violation the real store shows too (a hole of the store itself) proves nothing
about the mutant.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from chaos.cases import Case, CaseResult, ThenPower
from chaos.mutants import (
    CATCH_UP,
    CLOCK_STEP,
    MUTANTS,
    SERVE_MUTANTS,
    SUPERVISED,
    SUPERVISED_FORK,
)
from chaos.mutants.pinned import PINNED
from chaos.run.catch_up import run_catch_up
from chaos.run.clock_step import run_clock_step
from chaos.run.runner import clean_steps
from chaos.run.supervised import SupervisedReport, run_supervised
from chaos.scenarios.scenarios import SCENARIOS
from chaos.sweep.parallel import run_cases
from chaos.sweep.sweep import ALL_FAULTS, build_cases

_store_failures: dict[frozenset[str], frozenset[str]] = {}
_serve_failures: dict[str, SupervisedReport] = {}
SERVE_SEED: Final = 11
"""The supervised run's seed when it scores a mutant (three sessions, 150 requests each)."""


@dataclass(slots=True)
class MutantScore:
    """What the rig found against one mutant."""

    name: str
    cases: int
    caught: list[CaseResult] = field(default_factory=list)
    invariants: Counter[str] = field(default_factory=Counter)

    @property
    def caught_as_expected(self) -> bool:
        """Whether the invariant the mutant must break is among those that caught it."""
        return MUTANTS[self.name].caught_by in self.invariants

    def example(self) -> CaseResult | None:
        """A case caught by the expected invariant (else any caught case)."""
        expected = MUTANTS[self.name].caught_by + ":"
        for result in self.caught:
            if any(v.startswith(expected) for v in result.violations):
                return result
        return self.caught[0] if self.caught else None


def score_mutant(
    name: str, workdir: str, *, jobs: int, quick: bool, scenarios: tuple[str, ...] = ()
) -> MutantScore:
    """Run the mutant's cases and score them.

    ``quick``: its pinned cases (``Mutant.quick`` or ``chaos/mutants/pinned.py``), or its
    quick selection (its scenarios and faults, every boundary) when it has none or when
    ``scenarios`` are given; otherwise every case of every scenario and fault.
    """
    mutant = MUTANTS[name]
    chosen = scenarios or (mutant.scenarios if quick else tuple(sorted(SCENARIOS)))
    pins = mutant.quick or PINNED.get(name, ())
    if quick and pins and not scenarios:
        for scenario in {c.partition(":")[0] for c in pins}:
            clean_steps(scenario, workdir)
        cases = [dataclasses.replace(Case.parse(c), mutant=name) for c in pins]
    else:
        cases = build_cases(
            chosen,
            mutant.faults if quick else ALL_FAULTS,
            workdir,
            then_power=mutant.then_power if quick else ThenPower.EVERY,
            mutant=name,
        )
    plain = [dataclasses.replace(c, mutant=None) for c in cases]
    key = frozenset(c.id for c in plain)
    if key not in _store_failures:
        results = run_cases(plain, workdir, jobs=jobs, on_result=lambda _r: None)
        _store_failures[key] = frozenset(r.case for r in results if r.outcome != "ok")
    failing = _store_failures[key]
    score = MutantScore(name=name, cases=len(cases))
    results = run_cases(cases, workdir, jobs=jobs, on_result=lambda _r: None)
    for case, result in zip(plain, results, strict=True):
        if result.outcome != "ok" and case.id not in failing:
            score.caught.append(result)
            score.invariants.update(v.split(":")[0] for v in result.violations)
    return score


@dataclass(slots=True)
class ServeScore:
    """What a supervisor-level run found against one of ``SERVE_MUTANTS``: the invariants
    it broke that the same run without the mutant held."""

    name: str
    clean: SupervisedReport
    broken: SupervisedReport
    invariants: Counter[str] = field(default_factory=Counter)

    @property
    def caught_as_expected(self) -> bool:
        return SERVE_MUTANTS[self.name].caught_by in self.invariants

    def example(self) -> str | None:
        """A violation of the expected invariant (else any the clean run did not show)."""
        for violation in self.broken.violations:
            if violation.split(":")[0] == SERVE_MUTANTS[self.name].caught_by:
                return violation
        return next((v for v in self.broken.violations if v.split(":")[0] in self.invariants),
                    None)  # fmt: skip


def serve_rig(rig: str, workdir: str, mutant: str | None) -> SupervisedReport:
    """Run the supervisor-level run ``rig`` (``SUPERVISED``, ``SUPERVISED_FORK``,
    ``CATCH_UP``, ``CLOCK_STEP``)
    once, in a fresh home under ``workdir``, ``mutant`` patched into serve."""
    base = tempfile.mkdtemp(prefix=f"{rig}-", dir=workdir)
    home = os.path.join(base, "home")
    if rig in (SUPERVISED, SUPERVISED_FORK):
        method = "fork" if rig == SUPERVISED_FORK else None  # fork: serve keeps a spare
        return run_supervised(home, sessions=3, requests=150, duration=60.0, seed=SERVE_SEED,
                              mutant=mutant, start_method=method)  # fmt: skip
    if rig == CATCH_UP:
        return run_catch_up(home, mutant=mutant)
    if rig == CLOCK_STEP:
        return run_clock_step(home, mutant=mutant)
    raise ValueError(f"no supervisor-level run {rig!r}")


SERVE_TRIES: Final = 5
"""Runs of a supervisor mutant before it is taken to have survived (one survived once in
a CI run at a load of 2 cores' worth: the look every 10 ms missed the two workers; and
once three runs in a row, in a rehearsal of CI, where 16 runs after it, loaded or not,
all caught it)."""


def score_serve_mutant(name: str, workdir: str) -> ServeScore:
    """Run the mutant's supervisor-level run with it (up to ``SERVE_TRIES`` times, until
    its invariant fires: whether two workers are looked at while both live is timing)
    and without it (once per run)."""
    rig = SERVE_MUTANTS[name].scenarios[0]
    if rig not in _serve_failures:
        _serve_failures[rig] = serve_rig(rig, workdir, None)
    clean = _serve_failures[rig]
    for _try in range(SERVE_TRIES):
        broken = serve_rig(rig, workdir, name)
        if SERVE_MUTANTS[name].caught_by in broken.invariants:
            break
    held = Counter({i: n for i, n in broken.invariants.items() if i not in clean.invariants})
    if clean.failures:  # the run could not judge without the mutant: it proves nothing
        held = Counter()
    return ServeScore(name=name, clean=clean, broken=broken, invariants=held)


def feature_table(by_feature: dict[str, list[bool]]) -> list[str]:
    """The score per feature: each feature's mutants caught by the invariant each must
    break, of its mutants (``by_feature``: one verdict per mutant), features in order."""
    lines = ["by feature (mutants caught by the invariant each must break):"]
    width = max((len(feature) for feature in by_feature), default=0)
    for feature, caught in sorted(by_feature.items()):
        lines.append(f"  {feature:<{width}}  {sum(caught)}/{len(caught)}")
    return lines
