"""``loopd chaos``: run, replay, mutants, supervised."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Final

import click

from chaos.cases import Case, CaseResult
from chaos.hook import FaultKind
from chaos.html_report import write_html_report
from chaos.mutants import MUTANTS
from chaos.parallel import case_workdir, run_cases
from chaos.runner import clean_steps, run_case, scenario_for
from chaos.scenarios import SCENARIOS
from chaos.scoring import score_mutant
from chaos.supervised import run_supervised
from chaos.sweep import ALL_FAULTS, build_cases

EXIT_VIOLATION: Final = 1


def _faults(text: str) -> list[FaultKind]:
    kinds = []
    for name in text.split(","):
        try:
            kinds.append(FaultKind(name.strip()))
        except ValueError as exc:
            known = ",".join(k.value for k in ALL_FAULTS)
            raise click.BadParameter(f"unknown fault {name!r}; known: {known}") from exc
    return kinds


def _app_scenarios(app: str | None, scenarios: tuple[str, ...]) -> list[str]:
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


def _summary(results: list[CaseResult], elapsed: float) -> None:
    table: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for r in results:
        table[(r.case.split(":")[0], r.fault)][r.outcome] += 1
    click.echo(f"\n{'scenario':<10} {'fault':<8} {'cases':>6} {'violations':>10}")
    for (scenario, fault), counts in sorted(table.items()):
        total = sum(counts.values())
        click.echo(f"{scenario:<10} {fault:<8} {total:>6} {counts['violation']:>10}")
    bad = sum(1 for r in results if r.outcome != "ok")
    rate = len(results) / elapsed if elapsed > 0 else 0.0
    click.echo(
        f"{'all':<10} {'':<8} {len(results):>6} {bad:>10}   ({elapsed:.1f} s, {rate:.0f} cases/s)"
    )


def _execute(cases: list[Case], workdir: str, jobs: int, label: str) -> list[CaseResult]:
    with click.progressbar(length=len(cases), label=label, file=sys.stderr) as bar:

        def advance(result: CaseResult) -> None:
            bar.update(1)
            if result.outcome != "ok":
                click.echo(
                    f"\nVIOLATION {result.case} ({result.boundary}): "
                    f"{'; '.join(result.violations)}\n  replay: {result.replay_line}",
                    err=True,
                )

        return run_cases(cases, workdir, jobs=jobs, on_result=advance)


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


@click.group()
def chaos() -> None:
    """The crash rig: kill workers at every write boundary and check the files."""


@chaos.command()
@scenarios_option
@click.option(
    "--faults",
    default="kill,torn,power,io,short,damage,lease,hostile",
    show_default=True,
    help="comma-separated fault kinds.",
)
@click.option(
    "--compound/--no-compound",
    default=True,
    show_default=True,
    help="also crash at every boundary of each recovery.",
)
@jobs_option
@click.option("--seed", type=int, default=None, help="shuffle the case order with this seed.")
@click.option(
    "--json-report",
    type=click.Path(dir_okay=False),
    default=None,
    help="write every case's result to this file.",
)
@click.option(
    "--html-report",
    type=click.Path(dir_okay=False),
    default=None,
    help="write a self-contained HTML page: boundaries x faults, each case linked.",
)
@app_option
@dir_option
def run(
    scenarios: tuple[str, ...],
    faults: str,
    compound: bool,
    jobs: int,
    seed: int | None,
    json_report: str | None,
    html_report: str | None,
    app: str | None,
    base: str | None,
) -> None:
    """Run every case of the chosen scenarios and faults; exit 1 on any violation."""
    kinds = _faults(faults)
    chosen = _app_scenarios(app, scenarios)
    with case_workdir(base) as workdir:
        cases = build_cases(chosen, kinds, workdir, compound=compound, app=app)
        if seed is not None:
            random.Random(seed).shuffle(cases)
        start = time.perf_counter()
        results = _execute(cases, workdir, jobs, f"{len(cases)} cases")
        elapsed = time.perf_counter() - start
    _summary(results, elapsed)
    if json_report:
        with open(json_report, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "cases": [r.to_json() for r in results],
                    "elapsed_s": elapsed,
                    "violations": sum(r.outcome != "ok" for r in results),
                },
                f,
                indent=1,
            )
        click.echo(f"report: {json_report}")
    if html_report:
        write_html_report(html_report, results, title=f"loopd chaos run ({app or 'the store'})")
        click.echo(f"report: {html_report}")
    if any(r.outcome != "ok" for r in results):
        sys.exit(EXIT_VIOLATION)


@chaos.command()
@click.argument("case_id", metavar="CASE")
@app_option
@dir_option
def replay(case_id: str, app: str | None, base: str | None) -> None:
    """Run one case from its id (as printed with a violation) and show what it checked."""
    try:
        case = replace(Case.parse(case_id), app=app)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="CASE") from exc
    if case.scenario not in SCENARIOS:
        raise click.BadParameter(f"unknown scenario {case.scenario!r}", param_hint="CASE")
    if case.mutant is not None and case.mutant not in MUTANTS:
        raise click.BadParameter(f"unknown mutant {case.mutant!r}", param_hint="CASE")
    _app_scenarios(app, (case.scenario,))
    with case_workdir(base) as workdir:
        clean_steps(case.scenario, workdir, app=app)
        result = run_case(case, workdir)
    click.echo(
        f"case       {result.case}\nboundary   {result.boundary}\n"
        f"outcome    {result.outcome}\nchecked    {', '.join(sorted(set(result.checked)))}"
    )
    for note in result.notes:
        click.echo(f"note       {note}")
    for violation in result.violations:
        click.echo(f"VIOLATION  {violation}")
    if result.outcome != "ok":
        sys.exit(EXIT_VIOLATION)


@chaos.command()
@scenarios_option
@jobs_option
@click.option(
    "--quick",
    is_flag=True,
    help="only each mutant's own selection of cases (the test suite's), not every case.",
)
@dir_option
def mutants(scenarios: tuple[str, ...], jobs: int, quick: bool, base: str | None) -> None:
    """Run the rig against each deliberately broken store; exit 1 if one survives.

    Prints, per mutant, the invariants that caught it, whether the one it must break is
    among them, an example case, and at the end the score.
    """
    survivors = []
    with case_workdir(base) as workdir:
        for name, mutant in MUTANTS.items():
            score = score_mutant(name, workdir, jobs=jobs, quick=quick, scenarios=scenarios)
            if not score.caught_as_expected:
                survivors.append(name)
                seen = ", ".join(score.invariants) or "no invariant"
                click.echo(
                    f"SURVIVED {name}: {score.cases} cases; {mutant.caught_by} held "
                    f"(caught only by {seen})"
                )
                continue
            click.echo(
                f"caught   {name} by {mutant.caught_by}: {len(score.caught)}/{score.cases} "
                "cases; " + ", ".join(f"{i} ({n})" for i, n in score.invariants.most_common())
            )
            first = score.example()
            if first is not None:
                click.echo(f"         e.g. {first.case} ({first.boundary}): {first.violations[0]}")
    click.echo(f"score: {len(MUTANTS) - len(survivors)}/{len(MUTANTS)} mutants caught")
    if survivors:
        sys.exit(EXIT_VIOLATION)


@chaos.command()
@click.option("--sessions", type=click.IntRange(min=1), default=3, show_default=True)
@click.option(
    "--requests",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="requests per session.",
)
@click.option(
    "--duration", type=float, default=60.0, show_default=True, help="hard time bound, seconds."
)
@click.option(
    "--seed",
    type=int,
    default=None,
    help="the schedule of kills; the same seed replays it (default: a random one, printed).",
)
@click.option(
    "--boundary-kill-probability",
    type=float,
    default=0.02,
    show_default=True,
    help="chance that a worker SIGKILLs itself at each write boundary.",
)
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    default=None,
    help="keep the run's home here (default: a temporary one).",
)
@app_option
def supervised(
    sessions: int,
    requests: int,
    duration: float,
    seed: int | None,
    boundary_kill_probability: float,
    home: str | None,
    app: str | None,
) -> None:
    """A real supervisor under load while workers are SIGKILLed; check every log."""
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    again = (f"loopd chaos supervised --seed {seed} --sessions {sessions} "
             f"--requests {requests} --boundary-kill-probability {boundary_kill_probability}"
             + (f" --app {app}" if app else ""))  # fmt: skip
    click.echo(f"seed: {seed}")
    with case_workdir(None) as workdir:
        report = run_supervised(
            home or os.path.join(workdir, "home"),
            sessions=sessions,
            requests=requests,
            duration=duration,
            seed=seed,
            boundary_kill_probability=boundary_kill_probability,
            app=app,
            schedule_dir=os.path.join(workdir, "schedule"),
        )
    acked = sum(len(k) for k in report.acknowledged.values())
    click.echo(
        f"{report.sessions} sessions, {acked} requests acknowledged, "
        f"{report.kills} random SIGKILLs, {report.restarts} restarts, "
        f"{report.elapsed:.1f} s"
    )
    for failure in report.failures:
        click.echo(f"FAILED   {failure}")
    for violation in report.violations:
        click.echo(f"VIOLATION {violation}")
    if report.violations or report.failures:
        click.echo(f"replay: {again}")
        sys.exit(EXIT_VIOLATION)
    click.echo("every acknowledged request is in its log exactly once; every session verifies")
