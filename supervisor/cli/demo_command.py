"""``loopd demo``: the main job on an embedded default, checking each claim it shows."""

from __future__ import annotations

import os
import sys
import tempfile

import click

from supervisor.demo.checks import DemoChecks
from supervisor.demo.hosted import run_hosted_demo
from supervisor.demo.hosting import run_hosting_demo
from supervisor.demo.store import run_store_demo


@click.command()
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    default=None,
    help="Run in this directory instead of a temporary one (kept afterwards).",
)
def demo(home: str | None) -> None:
    """Show loopd's guarantees on a temporary home; exit 0 only if every check held.

    A supervisor hosts several sessions under traffic; some workers are SIGKILLed and
    come back with every acknowledged record; a torn log goes FATAL with its path:line
    and is repaired; idle sessions rest without a process and wake on their next request,
    with their logs and the metrics shown; the store is shown on its own first.
    """
    checks = DemoChecks()
    with tempfile.TemporaryDirectory(prefix="loopd-demo-") as tmp:
        root = home if home is not None else tmp
        os.makedirs(root, exist_ok=True)
        run_store_demo(os.path.join(root, "store"), checks)
        run_hosted_demo(os.path.join(root, "hosted"), checks)
        run_hosting_demo(os.path.join(root, "hosting"), checks)
    click.echo(f"\n{checks.summary()}")
    sys.exit(0 if checks.all_held else 1)
