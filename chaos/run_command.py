"""``loopd chaos run``: the sweep (or a seeded sample of it), its progress and reports."""

from __future__ import annotations

import contextlib
import random
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator

import click

from chaos.cases import Case, CaseResult
from chaos.cli_options import (
    EXIT_VIOLATION,
    app_option,
    app_scenarios,
    dir_option,
    jobs_option,
    parse_faults,
    scenarios_option,
)
from chaos.report.run_report import RunReport
from chaos.report.violation_groups import group_violations
from chaos.scenarios.app_loading import CleanRunFailed
from chaos.sweep.parallel import case_workdir, run_cases
from chaos.sweep.sampling import Pick, Plan, plan_sample
from chaos.sweep.sweep import ALL_FAULTS, build_cases


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
    states = {r.state for r in results if r.state}
    if states:
        checked = sum(1 for r in results if r.state and not r.checked_by)
        click.echo(
            f"{len(states)} distinct crash states for {len(results)} cases "
            f"({checked} recovered and checked, {len(states) / elapsed:.1f} states/s)"
        )
    groups = group_violations(results)
    if groups:
        click.echo(f"\n{bad} violations in {len(groups)} groups (invariant, first cause):")
        for group in groups:
            assert group.example is not None
            click.echo(f"{group.count:>6}  {group.invariant}: {group.cause}")
            click.echo(f"        replay: {group.example.replay_line}")


@click.command()
@scenarios_option
@click.option(
    "--faults",
    default=",".join(k.value for k in ALL_FAULTS),
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
@click.option(
    "--seed",
    type=int,
    default=None,
    help="shuffle the case order with this seed; with --sample/--budget, the sample's seed "
    "(default: a random one, printed).",
)
@click.option(
    "--sample",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="run a seeded, stratified sample of N cases (at least one per scenario, fault "
    "kind, boundary kind and compound shape) instead of the full sweep.",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="run the stratified sample until this many seconds have passed since the start "
    "(every stratum once at least), instead of the full sweep.",
)
@click.option(
    "--dedupe/--no-dedupe",
    default=True,
    show_default=True,
    help="recover and check each distinct crash state once; cases that reach the same "
    "state share its verdict.",
)
@click.option(
    "--json-report",
    type=click.Path(dir_okay=False),
    default=None,
    help="write every case's result to this file (replaced as the run goes).",
)
@click.option(
    "--junit-report",
    type=click.Path(dir_okay=False),
    default=None,
    help="write a JUnit XML report, one testcase per case (replaced as the run goes).",
)
@click.option(
    "--html-report",
    type=click.Path(dir_okay=False),
    default=None,
    help="write a self-contained HTML page: violation groups, boundaries x faults, each "
    "case linked (replaced as the run goes).",
)
@click.option(
    "--store",
    default=None,
    metavar="URI",
    help="run the seam's faults (a COMMIT lost, slow or fenced) against this PostgreSQL "
    "database instead of the file store's sweep; each case in a schema of its own.",
)
@app_option
@dir_option
def run(
    scenarios: tuple[str, ...],
    faults: str,
    compound: bool,
    jobs: int,
    seed: int | None,
    sample: int | None,
    budget: float | None,
    dedupe: bool,
    json_report: str | None,
    junit_report: str | None,
    html_report: str | None,
    store: str | None,
    app: str | None,
    base: str | None,
) -> None:
    """Run every case of the chosen scenarios and faults; exit 1 on any violation.

    With --sample or --budget, a seeded stratified sample of them instead.
    """
    if store is not None:
        _run_at_seam(store)
        return
    began = time.monotonic()
    kinds = parse_faults(faults)
    chosen = app_scenarios(app, scenarios)
    header: dict[str, object] = {"app": app, "faults": [k.value for k in kinds]}
    plan: Plan | None = None
    with case_workdir(base) as workdir, _clean_run_refused():
        units: list[Case] | list[Pick]
        if sample is None and budget is None:
            units = build_cases(chosen, kinds, workdir, compound=compound, app=app)
            if seed is not None:
                random.Random(seed).shuffle(units)
        else:
            if seed is None:
                seed = random.SystemRandom().randrange(1 << 32)
            plan = plan_sample(chosen, kinds, workdir, seed=seed, compound=compound, app=app)
            units = plan.first(sample) if sample is not None else plan.picks
            again = _sample_command(seed, sample, budget, faults, scenarios, compound, app)
            click.echo(f"sample: seed {seed}, {plan.strata} strata; again: {again}")
            header["sample"] = {"seed": seed, "strata": plan.strata, "again": again}
        report = RunReport(
            total=len(units),
            title=f"loopd chaos run ({app or 'the store'})",
            json_path=json_report,
            junit_path=junit_report,
            html_path=html_report,
            header=header,
            deadline=None if budget is None else began + budget,
        )
        started = [len(units)]  # the units begun before the budget ended the run

        def over_budget(done: int) -> bool:
            # A budget is a budget: the run ends once it is spent, whichever strata are
            # left (the cheap ones come first; the rest are listed, not run).
            if budget is None or time.monotonic() - began < budget:
                return False
            started[0] = done
            return True

        click.echo(f"{len(units)} {'cases' if plan is None else 'picks'}", err=True)
        start = time.perf_counter()
        results = run_cases(units, workdir, jobs=jobs, on_result=report.add, dedupe=dedupe,
                            stop=None if budget is None else over_budget)  # fmt: skip
        elapsed = time.perf_counter() - start
    unreached = plan.unreached(started[0]) if plan is not None else []
    if plan is not None:
        header["sample"] = {
            **plan_header(header),
            "covered": plan.coverage(results, len(unreached)),
            "not_reached": [":".join(stratum) for stratum in unreached],
        }
    report.finish()
    _summary(results, elapsed)
    if plan is not None:
        click.echo(f"sample: seed {seed}; covered {plan.coverage(results, len(unreached))}")
    if unreached:
        shown = ", ".join(":".join(stratum) for stratum in unreached[:20])
        more = f" and {len(unreached) - 20} more" if len(unreached) > 20 else ""
        click.echo(f"not reached within the budget of {budget:g} s: {shown}{more}")
    for path in (json_report, junit_report, html_report):
        if path:
            click.echo(f"report: {path}")
    if any(r.outcome != "ok" for r in results):
        sys.exit(EXIT_VIOLATION)


def _run_at_seam(uri: str) -> None:
    """Every seam fault at every fenced write of the seam's scenarios (chaos.postgres)."""
    from chaos.postgres.sweep import run_seam_sweep  # noqa: PLC0415 - only with --store

    start = time.perf_counter()
    results = run_seam_sweep(uri, lambda r: None)
    _summary(results, time.perf_counter() - start)
    if any(r.outcome != "ok" for r in results):
        sys.exit(EXIT_VIOLATION)


@contextlib.contextmanager
def _clean_run_refused() -> Iterator[None]:
    """A scenario that fails with no fault (an App that cannot serve) is one line."""
    try:
        yield
    except CleanRunFailed as exc:
        raise click.ClickException(str(exc)) from exc


def plan_header(header: dict[str, object]) -> dict[str, object]:
    found = header.get("sample")
    return dict(found) if isinstance(found, dict) else {}


def _sample_command(
    seed: int,
    sample: int | None,
    budget: float | None,
    faults: str,
    scenarios: tuple[str, ...],
    compound: bool,
    app: str | None,
) -> str:
    """The command that draws the same sample again."""
    parts = ["loopd chaos run", f"--seed {seed}"]
    parts += [f"--sample {sample}"] if sample is not None else []
    parts += [f"--budget {budget:g}"] if budget is not None else []
    parts += [f"--faults {faults}"] + [f"--scenario {s}" for s in scenarios]
    parts += [] if compound else ["--no-compound"]
    parts += [f"--app {app}"] if app else []
    return " ".join(parts)
