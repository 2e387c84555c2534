"""Cases: one scenario, one fault kind and variant, one boundary; a one-line id each."""

from __future__ import annotations

from dataclasses import dataclass, field

from chaos.hook import VARIANTS, FaultKind, applies
from worker.durable import Step


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One crash case; ``id`` is the line that replays it (``loopd chaos replay ID``).

    ``recovery_at`` > 0 makes it compound: the first resume is killed at that boundary
    of the recovery, then a clean resume follows.
    """

    scenario: str
    fault: FaultKind
    variant: str = "-"
    at: int = 0
    recovery_at: int = 0
    mutant: str | None = None

    @property
    def id(self) -> str:
        text = f"{self.scenario}:{self.fault.value}:{self.variant}:{self.at}"
        if self.recovery_at:
            text += f":r{self.recovery_at}"
        if self.mutant:
            text += f"@{self.mutant}"
        return text

    @classmethod
    def parse(cls, text: str) -> Case:
        """Parse an id printed by the rig; ValueError naming what is wrong."""
        body, _, mutant = text.partition("@")
        parts = body.split(":")
        if len(parts) not in (4, 5):
            raise ValueError(f"case id {text!r} is not scenario:fault:variant:k[:rJ][@mutant]")
        scenario, fault, variant, at = parts[:4]
        recovery = parts[4] if len(parts) == 5 else "r0"
        if not at.isdigit() or not recovery.startswith("r") or not recovery[1:].isdigit():
            raise ValueError(f"case id {text!r}: boundary numbers must be integers")
        try:
            kind = FaultKind(fault)
        except ValueError as exc:
            raise ValueError(f"case id {text!r}: unknown fault {fault!r}") from exc
        if variant not in VARIANTS[kind]:
            raise ValueError(f"case id {text!r}: fault {fault} has no variant {variant!r}")
        return cls(scenario=scenario, fault=kind, variant=variant, at=int(at),
                   recovery_at=int(recovery[1:]), mutant=mutant or None)  # fmt: skip


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

    def violate(self, invariant: str, detail: str) -> None:
        self.outcome = "violation"
        self.violations.append(f"{invariant}: {detail}")

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.case, "fault": self.fault, "boundary": self.boundary,
            "outcome": self.outcome, "invariants": sorted(set(self.checked)),
            "violations": self.violations, "notes": self.notes,
        }  # fmt: skip


def enumerate_cases(
    scenario: str,
    steps: list[Step],
    faults: list[FaultKind],
    *,
    mutant: str | None = None,
    recovery_steps: dict[int, int] | None = None,
) -> list[Case]:
    """Every case of ``scenario`` whose clean run had ``steps`` (boundary k = steps[k-1]).

    ``recovery_steps`` maps a kill boundary k to how many boundaries the recovery after
    it has, for the compound cases (a kill at every boundary of that recovery).
    """
    cases: list[Case] = []
    for kind in faults:
        for k, step in enumerate(steps, start=1):
            if not applies(kind, step):
                continue
            cases.extend(
                Case(scenario=scenario, fault=kind, variant=v, at=k, mutant=mutant)
                for v in VARIANTS[kind]
            )
    for k, count in sorted((recovery_steps or {}).items()):
        cases.extend(
            Case(scenario=scenario, fault=FaultKind.KILL, at=k, recovery_at=j, mutant=mutant)
            for j in range(1, count + 1)
        )
    return cases
