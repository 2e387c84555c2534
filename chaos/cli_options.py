"""The options and argument checks the ``loopd chaos`` commands share."""

from __future__ import annotations

import os
from typing import Final

import click

from chaos.faults.hook import FaultKind
from chaos.run.runner import scenario_for
from chaos.scenarios.scenarios import SCENARIOS
from chaos.sweep.sweep import ALL_FAULTS

EXIT_VIOLATION: Final = 1


def parse_faults(text: str) -> list[FaultKind]:
    kinds = []
    for name in text.split(","):
        try:
            kinds.append(FaultKind(name.strip()))
        except ValueError as exc:
            known = ",".join(k.value for k in ALL_FAULTS)
            raise click.BadParameter(f"unknown fault {name!r}; known: {known}") from exc
    return kinds


def app_scenarios(app: str | None, scenarios: tuple[str, ...]) -> list[str]:
    """The scenarios to run: with an App, the worker-level ones (each checked to host it)."""
    if app is None:
        return list(scenarios or sorted(SCENARIOS))
    chosen = scenarios or tuple(n for n in sorted(SCENARIOS) if SCENARIOS[n].hosts_apps)
    for name in chosen:
        try:
            scenario_for(name, app)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        except (ImportError, AttributeError) as exc:
            raise click.BadParameter(f"cannot import {app}: {exc}", param_hint="--app") from exc
    return list(chosen)


scenarios_option = click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Choice(sorted(SCENARIOS)),
    help="scenario(s) to run (default: all).",
)
jobs_option = click.option(
    "--jobs", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default="all cores"
)
app_option = click.option(
    "--app",
    default=None,
    metavar="MODULE:ATTR",
    help="the App the request scenarios' workers host (importable from the working "
    "directory); its contract is checked too.",
)
dir_option = click.option(
    "--dir",
    "base",
    type=click.Path(file_okay=False),
    default=None,
    help="where case homes go (default: /dev/shm, else the temp dir).",
)
