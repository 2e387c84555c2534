"""The operator's conveniences: restart (one session, or all of them, rolling), top,
systemd-unit."""

from __future__ import annotations

import os
import sys
from typing import Final

import click

from supervisor.cli.daemon_commands import _call, _fail, _print_status
from supervisor.cli.options import EXIT_ERROR, home_option, timeout_option
from supervisor.client.rolling import Done, restart_all
from supervisor.errors import ControlError
from supervisor.hosting.bounds import seconds
from supervisor.hosting.systemd_unit import UnitError, default_user, loopd_command, render_unit

MAX_AT_ONCE: Final = 100_000


@click.command()
@home_option
@timeout_option
@click.argument("session_id", metavar="[ID]", required=False)
@click.option(
    "--all",
    "every",
    is_flag=True,
    help="restart every running session (RUNNING, STARTING or BACKOFF), each waited for "
    "until it serves again; the first that does not come back stops the roll.",
)
@click.option(
    "--rolling",
    type=click.IntRange(1, MAX_AT_ONCE),
    default=None,
    metavar="N",
    help="with --all: at most N sessions restarting at a time (default: all at once).",
)
def restart(
    home: str, timeout: float, session_id: str | None, every: bool, rolling: int | None
) -> None:
    """Stop, then start, session ID's worker; with --all, every running session's.

    --timeout bounds each session's restart: one that is not serving again by then stops
    the roll as a failure would.
    """
    if every and session_id is not None:
        raise click.UsageError("give a session ID or --all, not both")
    if not every and session_id is None:
        raise click.UsageError("give a session ID, or --all for every running session")
    if rolling is not None and not every:
        raise click.UsageError("--rolling N is for --all")
    if session_id is not None:
        _print_status([_call(home, "restart", timeout, session=session_id)])
        return
    try:
        roll = restart_all(home, at_once=rolling, timeout=timeout, on_done=_show)
    except ControlError as exc:
        _fail("restart", exc)
    for session, state in roll.skipped:
        click.echo(f"skipped    {session}: {state}, not running")
    restarted = len(roll.done) - len(roll.failed)
    if not roll.failed:
        click.echo(f"restarted {restarted} session(s); skipped {len(roll.skipped)}")
        return
    names = ", ".join(d.session for d in roll.failed)
    left = f"; not restarted: {', '.join(roll.not_reached)}" if roll.not_reached else ""
    click.echo(
        f"loopd restart: the roll stopped: {names} did not come back "
        f"({restarted} restarted{left}). Next: `loopd status {roll.failed[0].session}`, "
        "fix the cause, then `loopd restart --all` again",
        err=True,
    )
    sys.exit(EXIT_ERROR)


def _show(done: Done) -> None:
    if done.failure is not None:
        click.echo(f"FAILED     {done.session} after {done.seconds:.2f} s: {done.failure}")
        return
    pid = done.row.get("pid") if done.row is not None else None
    click.echo(f"restarted  {done.session} (pid {pid}) in {done.seconds:.2f} s")


@click.command()
@home_option
@click.option(
    "--interval",
    type=seconds(0.05),
    default=1.0,
    show_default=True,
    help="seconds between refreshes.",
)
def top(home: str, interval: float) -> None:
    """A live view of every session of HOME, refreshed every --interval (q quits).

    The arrow keys, Page Up/Down, Home and End scroll; `cpu%` is each worker's CPU since
    the previous refresh. A supervisor that does not answer is shown, and retried.
    """
    from supervisor.cli.top_command import run_top  # noqa: PLC0415 - curses only for top

    sys.exit(run_top(home, interval))


@click.command(name="systemd-unit")
@home_option
@click.option(
    "--user",
    default=None,
    help="the user the service runs as (default: the owner of HOME, else you).",
)
def systemd_unit(home: str, user: str | None) -> None:
    """Print the Type=notify systemd unit of docs/operations.md for HOME.

    ExecStart is the loopd of this interpreter (its virtualenv); save the output as
    /etc/systemd/system/loopd.service, then `systemctl daemon-reload`.
    """
    absolute = os.path.abspath(home)
    try:
        text = render_unit(
            home=absolute, command=loopd_command(), user=user or default_user(absolute)
        )
    except UnitError as exc:
        click.echo(f"loopd systemd-unit: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(text, nl=False)
