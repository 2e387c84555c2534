"""``loopd chaos cluster``: the command, its options and its summary (chaos/cluster/run.py)."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import click

from chaos.cli_options import EXIT_VIOLATION
from chaos.cluster.checker import INVARIANTS
from chaos.cluster.faults import KINDS
from chaos.cluster.netns_hosts import HarnessError
from chaos.cluster.run import Options, Report, Stopped, prerequisites, run_cluster

EXIT_CANNOT_RUN = 2
EXIT_UNSERVED = 3
DEFAULT_STEPS = 10


def replay_line(options: Options) -> str:
    bound = (f"--duration {options.duration:g}" if options.duration is not None
             else f"--steps {options.steps}")  # fmt: skip
    both = f" --steps {options.steps}" if options.duration is not None and options.steps else ""
    return (f"loopd chaos cluster --seed {options.seed} {bound}{both} --hosts {options.hosts} "
            f"--etcd-members {options.etcd_members} --sessions {options.sessions} "
            f"--clients {options.clients}" + ("" if options.moves else " --no-moves")
            + f" --lease-ttl {options.lease_ttl:g}"
            + (f" --faults {','.join(options.only)}" if options.only else "")
            + (f" --store {options.store}" if options.store != "files" else ""))  # fmt: skip


def summary(report: Report) -> list[str]:
    lines = [f"{report.steps} steps in {report.elapsed:.1f} s"]
    faults = ", ".join(f"{kind} {n}" for kind, n in sorted(report.faults.items()))
    lines.append(f"faults:   {faults or 'none'}")
    outcomes = ", ".join(f"{o} {report.outcomes.get(o, 0)}" for o in ("ack", "refused", "unknown"))
    lines.append(f"requests: {outcomes}")
    for name in INVARIANTS:
        found = report.violations.get(name, [])
        lines.append(f"{'held    ' if not found else 'VIOLATED'} {name}"
                     + (f" ({len(found)})" if found else ""))  # fmt: skip
        lines += [f"  {line}" for line in found[:20]]
    lines += [f"stalled: {line}" for line in report.stalled]
    lines += [f"note:    {note}" for note in report.notes[:20]]
    return lines


@click.command()
@click.option(
    "--seed",
    type=int,
    default=None,
    help="the faults' schedule; the same seed replays it (default: random, printed).",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="seconds of faults (default: --steps).",
)
@click.option(
    "--steps",
    type=click.IntRange(min=0),
    default=None,
    help=f"faults to apply (default {DEFAULT_STEPS} when no --duration).",
)
@click.option(
    "--hosts",
    type=click.IntRange(min=1, max=9),
    default=3,
    show_default=True,
    help="nodes, each a host.",
)
@click.option(
    "--etcd-members",
    type=click.Choice(["1", "3"]),
    default="1",
    show_default=True,
    help="etcd members, each a host (3: members are also killed).",
)
@click.option("--sessions", type=click.IntRange(min=1, max=100), default=4, show_default=True)
@click.option(
    "--clients",
    type=click.IntRange(min=1, max=16),
    default=3,
    show_default=True,
    help="client processes sending keyed requests, on the client host.",
)
@click.option(
    "--moves/--no-moves",
    default=True,
    show_default=True,
    help="move sessions between nodes among the faults.",
)
@click.option(
    "--lease-ttl",
    type=click.FloatRange(min=1),
    default=3.0,
    show_default=True,
    help="the nodes' lease TTL in seconds.",
)
@click.option(
    "--faults",
    "only",
    default="",
    help=f"comma-separated fault kinds to draw from (default: all; of {', '.join(KINDS)}).",
)
@click.option(
    "--store",
    type=click.Choice(["files", "postgres"]),
    default="files",
    show_default=True,
    help="where sessions live: each node's disk, or a PostgreSQL primary and two "
    "quorum standbys that the run starts on three hosts of their own (and kills).",
)
@click.option(
    "--json-report",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="write the summary and the whole history as JSON here.",
)
@click.option("--keep", type=click.Path(file_okay=False), default=None,
              help="copy the run's logs, disks and client output to this directory.")  # fmt: skip
@click.option(
    "--require-served",
    is_flag=True,
    help="also exit 3 when a session stalled: none of its requests acknowledged at the "
    "end of the load (availability; by default a finding, not a failure).",
)
def cluster(
    seed: int | None,
    duration: float | None,
    steps: int | None,
    hosts: int,
    etcd_members: str,
    sessions: int,
    clients: int,
    moves: bool,
    lease_ttl: float,
    only: str,
    store: str,
    json_report: str | None,
    keep: str | None,
    require_served: bool,
) -> None:
    """A TLS cluster across network namespaces under keyed load and network faults
    (partitions, netem, host kills, pauses past the lease, etcd member loss, moves; with
    --store postgres the database primary killed and a standby promoted); the whole
    history checked. Needs root, iproute2, openssl and etcd (and PostgreSQL). Exit 1 on a
    violation, 2 if it cannot run, 3 with --require-served if a session was not served."""
    if json_report is not None and not os.path.isdir(os.path.dirname(json_report) or "."):
        raise click.BadParameter(f"{json_report}: no such directory", param_hint="--json-report")
    kinds = tuple(k for k in (w.strip() for w in only.split(",")) if k)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise click.BadParameter(f"no fault kind {unknown[0]!r} (known: {', '.join(KINDS)})",
                                 param_hint="--faults")  # fmt: skip
    problem = prerequisites(store)
    if problem is not None:
        click.echo(f"loopd chaos cluster: cannot run: {problem}", err=True)
        sys.exit(EXIT_CANNOT_RUN)
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    if steps is None and duration is None:
        steps = DEFAULT_STEPS
    options = Options(seed=seed, hosts=hosts, etcd_members=int(etcd_members), steps=steps,
                      duration=duration, sessions=sessions, clients=clients, moves=moves,
                      keep=Path(keep) if keep else None, lease_ttl=lease_ttl,
                      only=kinds, store=store)  # fmt: skip
    again = replay_line(options)
    click.echo(f"seed: {seed}  (replay: {again})")
    try:
        report = run_cluster(options)
    except HarnessError as exc:
        click.echo(f"loopd chaos cluster: the rig failed: {exc}", err=True)
        sys.exit(EXIT_CANNOT_RUN)
    except subprocess.TimeoutExpired as exc:  # a host step (openssl, a client) never ended
        click.echo(f"loopd chaos cluster: the rig failed: {exc}; every host torn down", err=True)
        sys.exit(EXIT_CANNOT_RUN)
    except (IndexError, ValueError) as exc:  # a client host's report that is not one line
        click.echo(f"loopd chaos cluster: the rig failed: a host's report could not be read "
                   f"({type(exc).__name__}: {exc}); every host torn down", err=True)  # fmt: skip
        sys.exit(EXIT_CANNOT_RUN)
    except (Stopped, KeyboardInterrupt):
        click.echo("loopd chaos cluster: stopped; every host torn down", err=True)
        sys.exit(130)
    for line in summary(report):
        click.echo(line)
    if json_report is not None:
        try:
            with open(json_report, "w", encoding="utf-8") as out:
                json.dump({**report.to_json(), "replay": again}, out, indent=1)
        except OSError as exc:
            click.echo(f"loopd chaos cluster: --json-report {json_report}: {exc.strerror}",
                       err=True)  # fmt: skip
            sys.exit(EXIT_CANNOT_RUN)
    code = exit_code(report, require_served=require_served)
    if code:
        click.echo(f"replay: {again}")
        sys.exit(code)


def exit_code(report: Report, *, require_served: bool) -> int:
    """1 if an invariant was violated; else, with ``require_served``, 3 if a session
    stalled; else 0."""
    if any(report.violations.values()):
        return EXIT_VIOLATION
    if require_served and report.stalled:
        return EXIT_UNSERVED
    return 0
