"""The demo's checked claims: each one printed as it is checked, all summed up at the end."""

from __future__ import annotations

import click


class DemoChecks:
    """Collects each checked claim of the demo and prints it as it happens."""

    def __init__(self) -> None:
        self.results: list[tuple[str, bool]] = []

    def check(self, claim: str, held: bool) -> None:
        self.results.append((claim, held))
        click.echo(f"  [{'ok' if held else 'FAILED'}] {claim}")

    @property
    def all_held(self) -> bool:
        return all(held for _, held in self.results)

    def summary(self) -> str:
        held = sum(1 for _, ok in self.results if ok)
        return f"{held}/{len(self.results)} checks held"
