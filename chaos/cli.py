"""``loopd chaos``: run, replay, mutants, supervised."""

from __future__ import annotations

import os
import random
import sys
from dataclasses import replace

import click

from chaos.cases import Case
from chaos.cli_options import (
    EXIT_VIOLATION,
    app_option,
    app_scenarios,
    dir_option,
    jobs_option,
    scenarios_option,
)
from chaos.cluster_command import cluster
from chaos.mutants import MUTANTS, SERVE_MUTANTS
from chaos.report.scoring import SERVE_SEED, feature_table, score_mutant, score_serve_mutant
from chaos.run.runner import clean_steps, run_case
from chaos.run.supervised import run_supervised
from chaos.run_command import run
from chaos.scenarios.scenarios import SCENARIOS
from chaos.sweep.parallel import case_workdir


@click.group()
def chaos() -> None:
    """The crash rig: kill workers at every write boundary and check the files."""


chaos.add_command(run)
chaos.add_command(cluster)


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
    app_scenarios(app, (case.scenario,))
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
    help="only each mutant's pinned cases (the test suite's; with --scenario, its faults "
    "at every boundary of those scenarios), not every case.",
)
@dir_option
def mutants(scenarios: tuple[str, ...], jobs: int, quick: bool, base: str | None) -> None:
    """Run the rig against each deliberately broken store; exit 1 if one survives.

    Prints, per mutant, the invariants that caught it, whether the one it must break is
    among them, an example case, and at the end the score, in all and per feature. The
    supervisor's mutants (templates, the catch-up) are scored by a run of a real serve
    with and without each (not with --scenario).
    """
    survivors = []
    by_feature: dict[str, list[bool]] = {}
    with case_workdir(base) as workdir:
        for name, mutant in MUTANTS.items():
            score = score_mutant(name, workdir, jobs=jobs, quick=quick, scenarios=scenarios)
            by_feature.setdefault(mutant.area, []).append(score.caught_as_expected)
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
        serve_mutants = {} if scenarios else SERVE_MUTANTS
        for name, mutant in serve_mutants.items():
            serve_score = score_serve_mutant(name, workdir)
            by_feature.setdefault(mutant.area, []).append(serve_score.caught_as_expected)
            run = f"{mutant.scenarios[0]} run" + (
                f" (seed {SERVE_SEED})" if mutant.scenarios[0] == "supervised" else ""
            )
            found = ", ".join(f"{i} ({n})" for i, n in serve_score.invariants.most_common())
            if not serve_score.caught_as_expected:
                survivors.append(name)
                clean = "; ".join(serve_score.clean.failures + serve_score.clean.violations)
                click.echo(
                    f"SURVIVED {name}: {run}; {mutant.caught_by} held (caught only by "
                    f"{found or 'no invariant'})" + (f"; without it: {clean}" if clean else "")
                )
                continue
            click.echo(f"caught   {name} by {mutant.caught_by}: {run}; {found}")
            click.echo(f"         e.g. {serve_score.example()}")
    total = len(MUTANTS) + len(serve_mutants)
    for line in feature_table(by_feature):
        click.echo(line)
    click.echo(f"score: {total - len(survivors)}/{total} mutants caught")
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
@click.option(
    "--store",
    default=None,
    metavar="URI",
    help="keep the sessions in this PostgreSQL store (serve --store): the workers die "
    "before and after their COMMITs; the logs are read from it.",
)
def supervised(
    sessions: int,
    requests: int,
    duration: float,
    seed: int | None,
    boundary_kill_probability: float,
    home: str | None,
    app: str | None,
    store: str | None,
) -> None:
    """A real supervisor under load while workers are SIGKILLed; check every log."""
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    again = (f"loopd chaos supervised --seed {seed} --sessions {sessions} "
             f"--requests {requests} --boundary-kill-probability {boundary_kill_probability}"
             + (f" --app {app}" if app else "") + (" --store URI" if store else ""))  # fmt: skip
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
            store=store,
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
