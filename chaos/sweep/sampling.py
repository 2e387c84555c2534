"""A seeded, stratified sample of the sweep: ``loopd chaos run --sample N`` / ``--budget S``.

A stratum is one scenario, fault kind, boundary kind (the durable step the fault hits:
mkdir, create, write, fsync, ...) and compound shape (a single fault, a crash of the
recovery, a power loss after a resume). The sample takes every stratum's cases in a
seeded order, its fault variants taking turns, one of each stratum per round, so its
first round covers every stratum and the next ones the variants; ``--sample N`` runs at
least the first round, ``--budget`` runs rounds until its time is up (and lists the
strata it did not reach).

Compound cases are known only by counting forks (how many boundaries a recovery or a
resumed worker has), which for a user's App costs more than a short budget. So the
sample lists their first faults ("families"), and the pool process that runs a pick
counts that family and draws one case of it; a recovery crash needs a kill that leaves
an interrupted epoch change, so its pick tries the scenario's kills in the seeded order
until one does.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from dataclasses import dataclass, field, replace

from chaos.cases import POWER_AT_END, Case, CaseResult, enumerate_cases
from chaos.faults.hook import FaultKind
from chaos.run.runner import clean_steps
from chaos.sweep.sweep import faults_for, power_firsts, recovery_count, resume_count
from worker.store.disk.durable import Step

RECOVERY: str = "recovery_at"
THEN_POWER: str = "power_at"
SINGLE: str = "single"
SHAPE_COST: dict[str, int] = {SINGLE: 0, THEN_POWER: 1, RECOVERY: 2}
"""The order of a round's strata by their shape: the cheapest first."""


@dataclass(frozen=True, slots=True)
class Pick:
    """One unit of a sample: a case, or first faults of one compound shape of which the
    pool process draws one case (``expand``)."""

    stratum: tuple[str, ...]
    case: Case | None = None
    families: tuple[Case, ...] = ()
    shape: str = SINGLE
    seed: int = 0

    def expand(self, workdir: str) -> Case | None:
        """The case this pick runs (counting its family first); None if none has one."""
        if self.case is not None:
            return self.case
        rng = random.Random(self.seed)
        for first in self.families:
            if first not in _COUNTED:  # once per process: later picks try the same kills
                if self.shape == RECOVERY:
                    count = recovery_count(first.scenario, first.at, workdir, app=first.app)
                else:
                    count = resume_count(first.scenario, first.fault, first.variant, first.at,
                                         workdir, mutant=first.mutant, app=first.app)  # fmt: skip
                _COUNTED[first] = count
            count = _COUNTED[first]
            if self.shape == RECOVERY:
                if count:
                    return replace(first, recovery_at=rng.randint(1, count))
                continue
            return replace(first, power_at=rng.choice([*range(1, count + 1), POWER_AT_END]))
        return None


# The boundaries counted for a first fault (recovery_count for a kill of a recovery
# pick, resume_count for a "then power loss" one), in this process.
_COUNTED: dict[Case, int] = {}


@dataclass(slots=True)
class Plan:
    """The sample's picks in run order, and what the full sweep holds."""

    seed: int
    picks: list[Pick] = field(default_factory=list)
    strata: int = 0
    single_cases: int = 0  # single-fault cases of the full sweep
    families: int = 0  # compound first faults of the full sweep

    def first(self, n: int) -> list[Pick]:
        """The first ``n`` picks, never fewer than one per stratum."""
        return self.picks[: max(n, self.strata)]

    def unreached(self, started: int) -> list[tuple[str, ...]]:
        """The strata none of whose picks is among the first ``started`` (a budget's end)."""
        reached = {pick.stratum for pick in self.picks[:started]}
        left = dict.fromkeys(p.stratum for p in self.picks[started:] if p.stratum not in reached)
        return list(left)

    def coverage(self, results: list[CaseResult], unreached: int = 0) -> str:
        """What share of the full sweep the cases of ``results`` are (``unreached``: how
        many strata the run did not reach)."""
        parsed = [Case.parse(r.case) for r in results]
        single = sum(1 for c in parsed if compound_shape(c) == SINGLE)
        compound = len(parsed) - single
        return (
            f"{single} of {self.single_cases} single-fault cases "
            f"({100 * single / max(1, self.single_cases):.1f}%) and {compound} compound cases "
            f"from {self.families} compound first faults "
            f"({100 * compound / max(1, self.families):.1f}% of them) of the full sweep; "
            + (
                f"{self.strata} strata, every one covered"
                if not unreached
                else f"{self.strata - unreached} of {self.strata} strata covered, "
                f"{unreached} not reached"
            )
        )


def _variants_in_turn(picks: list[Pick], rng: random.Random) -> list[Pick]:
    """A stratum's picks shuffled, its fault variants taking turns (so the first few
    rounds of a sample cover every variant too)."""
    by_variant: dict[str, list[Pick]] = defaultdict(list)
    for pick in picks:
        first = pick.case if pick.case is not None else pick.families[0]
        by_variant[first.variant].append(pick)
    turns = [by_variant[v] for v in sorted(by_variant)]
    for queue in turns:
        rng.shuffle(queue)
    rng.shuffle(turns)
    depth = max((len(q) for q in turns), default=0)
    return [q[i] for i in range(depth) for q in turns if i < len(q)]


def compound_shape(case: Case) -> str:
    """The compound fields a case sets (``single`` for none): its compound shape."""
    base = ("scenario", "fault", "variant", "at", "mutant", "app")
    names = [
        f.name
        for f in dataclasses.fields(case)
        if f.name not in base and getattr(case, f.name) != f.default
    ]
    return "+".join(names) or SINGLE


def plan_sample(
    scenarios: list[str],
    faults: list[FaultKind],
    workdir: str,
    *,
    seed: int,
    compound: bool,
    app: str | None = None,
    mutant: str | None = None,
) -> Plan:
    """Every stratum of the chosen sweep, its cases or first faults in a seeded order."""
    rng = random.Random(seed)
    plan = Plan(seed=seed)
    strata: dict[tuple[str, ...], list[Pick]] = defaultdict(list)
    for name in scenarios:
        raw = clean_steps(name, workdir, app=app)
        steps = [Step(str(s["step"])) for s in raw]
        singles = enumerate_cases(name, steps, faults_for(name, faults, app), mutant=mutant,
                                  app=app)  # fmt: skip
        plan.single_cases += len(singles)
        for case in singles:
            key = (name, case.fault.value, steps[case.at - 1].value, SINGLE)
            strata[key].append(Pick(stratum=key, case=case))
        if not compound:
            continue
        kills = [Case(scenario=name, fault=FaultKind.KILL, at=k, mutant=mutant, app=app)
                 for k in range(1, len(steps) + 1)]  # fmt: skip
        plan.families += len(kills)
        key = (name, FaultKind.KILL.value, "any", RECOVERY)
        for _ in kills:  # each pick tries every kill, from a different one on
            order = kills[:]
            rng.shuffle(order)
            strata[key].append(Pick(stratum=key, families=tuple(order), shape=RECOVERY,
                                    seed=rng.randrange(1 << 32)))  # fmt: skip
        for kind, variant, k in power_firsts(steps):
            plan.families += 1
            first = Case(scenario=name, fault=kind, variant=variant, at=k, mutant=mutant,
                         app=app)  # fmt: skip
            key = (name, kind.value, steps[k - 1].value, THEN_POWER)
            strata[key].append(Pick(stratum=key, families=(first,), shape=THEN_POWER,
                                    seed=rng.randrange(1 << 32)))  # fmt: skip
    queues = [_variants_in_turn(strata[key], rng) for key in sorted(strata)]
    rng.shuffle(queues)
    # Cheap before costly in every round: a compound pick first counts its family's
    # boundaries (a run of the scenario, or of its recovery, per first fault), so a budget
    # spent before the round ends leaves the costly strata unreached, and says so.
    queues.sort(key=lambda queue: SHAPE_COST[queue[0].shape])
    plan.strata = len(queues)
    depth = max((len(q) for q in queues), default=0)
    plan.picks = [q[i] for i in range(depth) for q in queues if i < len(q)]
    return plan
