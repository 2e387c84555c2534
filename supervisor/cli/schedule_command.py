"""``loopd schedule``: schedule a request for a session, or cancel one by its key."""

from __future__ import annotations

import datetime
import json
import re
import sys
from typing import Final

import click

from supervisor.cli.options import home_option, timeout_option
from supervisor.client.control import not_utf8
from supervisor.client.direct import Client
from supervisor.errors import ControlError

EXIT_ERROR: Final = 1
_RELATIVE: Final = re.compile(r"\+(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_AHEAD_DAYS: Final = 366 * 100


def parse_at(text: str, now: datetime.datetime | None = None) -> str:
    """``--at``: ISO 8601 with a zone (``Z`` or an offset), or ``+N`` s/m/h/d from now;
    returned as ISO 8601 in UTC. ValueError saying what is accepted."""
    now = now or datetime.datetime.now(datetime.UTC)
    relative = _RELATIVE.fullmatch(text)
    if relative is not None:
        seconds = float(relative.group(1)) * _UNIT_SECONDS[relative.group(2)]
        if seconds > MAX_AHEAD_DAYS * 86400:
            raise ValueError(f"{text!r} is more than {MAX_AHEAD_DAYS} days ahead")
        at = now + datetime.timedelta(seconds=seconds)
    else:
        try:
            at = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(
                f"{text!r} is neither ISO 8601 (2026-12-03T14:00:00Z) nor relative (+30s, "
                "+5m, +1h, +2d)"
            ) from None
        if at.tzinfo is None:
            raise ValueError(f"{text!r} has no time zone: add Z for UTC or an offset (+01:00)")
    try:
        return at.astimezone(datetime.UTC).isoformat()
    except OverflowError:
        raise ValueError(f"{text!r} is not a time from 0001 to 9999 in UTC") from None


@click.command()
@home_option
@timeout_option
@click.argument("session_id", metavar="ID")
@click.argument("text", required=False)
@click.option("--at", "at", default=None, help="when: ISO 8601 with a zone, or +30s/+5m/+1h/+2d.")
@click.option(
    "--key",
    default=None,
    help="the schedule's key, which the delivered request carries: the same key again is "
    "answered as a duplicate (default: a new key).",
)
@click.option("--untrusted", is_flag=True, help="mark the scheduled text as untrusted input.")
@click.option("--cancel", "cancel", default=None, metavar="KEY", help="cancel schedule KEY.")
def schedule(
    home: str,
    timeout: float,
    session_id: str,
    text: str | None,
    at: str | None,
    key: str | None,
    untrusted: bool,
    cancel: str | None,
) -> None:
    """Schedule TEXT for session ID at --at (delivered once, never before), or --cancel KEY.

    Prints the answer as JSON: the schedule's key and time (``duplicate`` if the key was
    scheduled before), or whether the cancel found the schedule pending.
    """
    for name, value in (("ID", session_id), ("TEXT", text), ("--key", key), ("--cancel", cancel)):
        problem = not_utf8(value) if value is not None else None
        if problem is not None:
            raise click.BadParameter(problem, param_hint=name)
    if cancel is not None:
        if text is not None or at is not None or key is not None:
            raise click.UsageError("--cancel KEY takes no TEXT, --at or --key")
    elif text is None or at is None:
        raise click.UsageError("give TEXT and --at TIME (or --cancel KEY)")
    try:
        when = parse_at(at) if at is not None else ""
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--at") from exc
    try:
        with Client(home, timeout=timeout, retry_for=timeout) as client:
            if cancel is not None:
                result = client.cancel_schedule(session_id, cancel)
            else:
                assert text is not None
                result = client.schedule(session_id, when, text, key=key, untrusted=untrusted)
    except ControlError as exc:
        click.echo(f"loopd schedule: {exc.message} [{exc.code}]", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(json.dumps(result, sort_keys=True))
