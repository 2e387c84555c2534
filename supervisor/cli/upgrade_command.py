"""``loopd upgrade``: move sessions onto the App version a worker would load now."""

from __future__ import annotations

import sys
from typing import Final

import click

from supervisor.cli.daemon_commands import _fail
from supervisor.cli.options import EXIT_ERROR, home_option, timeout_option
from supervisor.client.upgrade import Upgraded, plan_upgrade, upgrade_sessions
from supervisor.errors import ControlError

MAX_AT_ONCE: Final = 100_000


@click.command()
@home_option
@timeout_option
@click.option(
    "--rolling",
    type=click.IntRange(1, MAX_AT_ONCE),
    default=1,
    show_default=True,
    metavar="N",
    help="at most N sessions upgrading at a time.",
)
@click.option(
    "--app",
    "app",
    default=None,
    metavar="NAME",
    help="only the sessions of this App: a name of loopd.toml's [apps], or serve's --app "
    "as module:attribute (default: every App).",
)
@click.option(
    "--keep-going",
    is_flag=True,
    help="go on after a session fails to upgrade (default: begin no more sessions).",
)
def upgrade(home: str, timeout: float, rolling: int, app: str | None, keep_going: bool) -> None:
    """Move each session whose epoch names an older App version onto the version a worker
    would load now: restart its worker, then compact, so its new epoch names that version.

    Requests sent meanwhile are queued and served by the new worker. One line per
    session; exit 1 with one line per failure on stderr. After a failure no more sessions
    are begun (those left keep their version) unless --keep-going. --timeout bounds
    each step.
    """
    try:
        plan = plan_upgrade(home, app, timeout=timeout)
    except ControlError as exc:
        _fail("upgrade", exc)
    if app is not None and plan.matched == 0:
        click.echo(
            f"loopd upgrade: --app {app}: no session of {home} runs it (a name of "
            "loopd.toml's [apps], or serve's --app as module:attribute)",
            err=True,
        )
        sys.exit(EXIT_ERROR)
    for session, state in plan.skipped:
        click.echo(f"skipped   {session}: {state}, not running")
    for session, why in plan.unchecked:
        click.echo(f"unchecked {session}: {why}")
    done: list[Upgraded] = []
    if plan.upgrade:
        try:
            done = upgrade_sessions(
                home, plan.upgrade, at_once=rolling, timeout=timeout, on_done=_show,
                keep_going=keep_going,
            )  # fmt: skip
        except ControlError as exc:
            _fail("upgrade", exc)
    failed = [(d.session, d.failure) for d in done if d.failure is not None]
    left = [str(row.get("session")) for row in plan.upgrade][len(done) :]
    if left:
        click.echo(f"stopped after a failure: {len(left)} session(s) not begun, still on their "
                   f"version ({', '.join(left[:10])}{', ...' if len(left) > 10 else ''}); "
                   "fix the App and run upgrade again, or give --keep-going")  # fmt: skip
    click.echo(
        f"upgraded {len(done) - len(failed)} session(s); failed {len(failed)}; "
        f"skipped {len(plan.skipped)}; unchecked {len(plan.unchecked)}"
    )
    for session, why in [*failed, *plan.unchecked]:
        click.echo(f"loopd upgrade: {session}: {why}", err=True)
    if failed or plan.unchecked or left:
        sys.exit(EXIT_ERROR)


def _show(done: Upgraded) -> None:
    if done.failure is not None:
        click.echo(f"FAILED    {done.session} after {done.seconds:.2f} s: {done.failure}")
        return
    click.echo(
        f"upgraded  {done.session}: version {done.before} -> {done.after}, "
        f"now in epoch {done.epoch} ({done.seconds:.2f} s)"
    )
