"""Cases: one scenario, one fault kind and variant, one boundary; a one-line id each."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Final

from chaos.faults.hook import VARIANTS, FaultKind, variants_at
from worker.store.disk.durable import Step

POWER_AT_END: Final = 0  # ``power_at`` of a case whose power fails after the resume finished


class ThenPower(enum.Enum):
    """Which "fault, resume, then power loss" compounds to list."""

    NONE = "none"
    END = "end"  # the power fails once the resumed worker finished
    FIRST = "first"  # ... and at its first boundary, before it made anything durable
    EVERY = "every"  # ... and at every boundary of the resumed worker


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One crash case; ``id`` is the line that replays it (``loopd chaos replay ID``).

    ``recovery_at`` > 0 makes it compound: the first resume is killed at that boundary
    of the recovery, then a clean resume follows. ``power_at`` not None makes it the
    other compound: a fresh worker resumes after the fault and acknowledges more work,
    then the power fails at that boundary of it (``POWER_AT_END``: after it finished),
    with everything since the case began judged by the durability model.
    """

    scenario: str
    fault: FaultKind
    variant: str = "-"
    at: int = 0
    recovery_at: int = 0
    power_at: int | None = None
    mutant: str | None = None
    app: str | None = None  # the user's App (module:attribute) the worker hosts, if any

    @property
    def replay_line(self) -> str:
        """The one command that runs this case again (with its app, if any)."""
        return replay_command(self.id, self.app)

    @property
    def id(self) -> str:
        text = f"{self.scenario}:{self.fault.value}:{self.variant}:{self.at}"
        if self.recovery_at:
            text += f":r{self.recovery_at}"
        if self.power_at is not None:
            text += f":p{self.power_at or 'end'}"
        if self.mutant:
            text += f"@{self.mutant}"
        return text

    @classmethod
    def parse(cls, text: str) -> Case:
        """Parse an id printed by the rig; ValueError naming what is wrong."""
        body, _, mutant = text.partition("@")
        parts = body.split(":")
        if len(parts) not in (4, 5):
            raise ValueError(
                f"case id {text!r} is not scenario:fault:variant:k[:rJ|:pJ|:pend][@mutant]"
            )
        scenario, fault, variant, at = parts[:4]
        recovery, power = 0, None
        if len(parts) == 5:
            then = parts[4]
            if then == "pend":
                power = POWER_AT_END
            elif then[:1] in ("r", "p") and then[1:].isdigit() and int(then[1:]) > 0:
                recovery, power = (int(then[1:]), None) if then[0] == "r" else (0, int(then[1:]))
            else:
                raise ValueError(f"case id {text!r}: {then!r} is not rJ, pJ or pend")
        if not at.isdigit():
            raise ValueError(f"case id {text!r}: boundary numbers must be integers")
        try:
            kind = FaultKind(fault)
        except ValueError as exc:
            raise ValueError(f"case id {text!r}: unknown fault {fault!r}") from exc
        if variant not in VARIANTS[kind]:
            raise ValueError(f"case id {text!r}: fault {fault} has no variant {variant!r}")
        return cls(scenario=scenario, fault=kind, variant=variant, at=int(at),
                   recovery_at=recovery, power_at=power, mutant=mutant or None)  # fmt: skip


def replay_command(case_id: str, app: str | None) -> str:
    """``loopd chaos replay ID [--app module:attribute]``."""
    return f"loopd chaos replay {case_id}" + (f" --app {app}" if app else "")


@dataclass(slots=True)
class CaseResult:
    """What one case found: the boundary it hit, the invariants checked, any violations."""

    case: str
    fault: str
    boundary: str
    outcome: str = "ok"  # ok | violation
    checked: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    app: str | None = None
    state: str = ""  # the key of the crash state recovered and checked (chaos.run.crash_states)
    checked_by: str = ""  # the case that checked that state, when it was another one

    @property
    def replay_line(self) -> str:
        return replay_command(self.case, self.app)

    def violate(self, invariant: str, detail: str) -> None:
        self.outcome = "violation"
        self.violations.append(f"{invariant}: {detail}")

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.case, "fault": self.fault, "boundary": self.boundary,
            "outcome": self.outcome, "invariants": sorted(set(self.checked)),
            "violations": self.violations, "notes": self.notes,
            "app": self.app, "replay": self.replay_line,
            "state": self.state, "checked_by": self.checked_by or self.case,
        }  # fmt: skip


def enumerate_cases(
    scenario: str,
    steps: list[Step],
    faults: list[FaultKind],
    *,
    mutant: str | None = None,
    recovery_steps: dict[int, int] | None = None,
    resume_steps: dict[tuple[FaultKind, str, int], int] | None = None,
    app: str | None = None,
) -> list[Case]:
    """Every case of ``scenario`` whose clean run had ``steps`` (boundary k = steps[k-1]).

    ``recovery_steps`` maps a kill boundary k to how many boundaries the recovery after
    it has, for the compound cases (a kill at every boundary of that recovery).
    ``resume_steps`` maps a first fault (kind, variant, k) to how many boundaries the
    worker resuming after it has, for the "then power loss" cases: the power fails at
    each of them and after the last (a count of -1: only after the last).
    """
    cases: list[Case] = []
    for kind in faults:
        for k, step in enumerate(steps, start=1):
            cases.extend(
                Case(scenario=scenario, fault=kind, variant=v, at=k, mutant=mutant, app=app)
                for v in variants_at(kind, step)
            )
    for k, count in sorted((recovery_steps or {}).items()):
        cases.extend(
            Case(
                scenario=scenario, fault=FaultKind.KILL, at=k, recovery_at=j, mutant=mutant, app=app
            )
            for j in range(1, count + 1)
        )
    for (kind, variant, k), count in (resume_steps or {}).items():
        cases.extend(
            Case(
                scenario=scenario,
                fault=kind,
                variant=variant,
                at=k,
                power_at=j,
                mutant=mutant,
                app=app,
            )
            for j in [*range(1, count + 1), POWER_AT_END]
        )
    return cases
