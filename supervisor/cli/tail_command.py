"""``loopd tail ID [-n N] [-f]``: a session's records as its worker holds them, live.

Unlike ``loopd inspect`` (offline, from the files), ``tail`` asks the running worker
over its direct connection (``Client.records``), so it sees every record the moment it
is durable, and follows the session across epoch commits. It prints one JSON object a
line, exactly the record's line in the log.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Final

import click

from supervisor.cli.options import home_option, timeout_option
from supervisor.client.direct import Client
from supervisor.client.streaming import Stream
from supervisor.errors import ControlError
from worker.ipc.wire import Message

EXIT_ERROR: Final = 1
FOLLOW_INTERVAL: Final = 0.2


def print_stream(stream: Stream) -> Message:
    """Write a stream's partials to stdout as they come; return its reply."""
    for partial in stream:
        click.echo(partial, nl=False)
        sys.stdout.flush()
    if stream.restarts:
        click.echo(f"\n(the worker died {stream.restarts} time(s); partials started again)")
    click.echo()
    assert stream.reply is not None
    return stream.reply


@click.command()
@home_option
@timeout_option
@click.argument("session_id", metavar="ID")
@click.option(
    "-n",
    "--records",
    "count",
    type=click.IntRange(min=0, max=1_000_000),
    default=20,
    show_default=True,
    help="how many of the newest records first.",
)
@click.option(
    "-f",
    "--follow",
    "keep_following",
    is_flag=True,
    help="then print records as they become durable, across epochs, until ^C.",
)
def tail(home: str, timeout: float, session_id: str, count: int, keep_following: bool) -> None:
    """Print the newest records of session ID's current epoch, from its running worker."""
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        try:
            with Client(home, timeout=timeout, retry_for=timeout) as client:
                page = client.records(session_id)
                epoch, lines = int(str(page["epoch"])), int(str(page["lines"]))
                since = max(0, lines - count)
                while True:
                    page = client.records(session_id, since=since, epoch=epoch)
                    for record in page["records"]:  # type: ignore[attr-defined]
                        click.echo(json.dumps(record, ensure_ascii=False, separators=(",", ":")))
                    epoch, since = int(str(page["epoch"])), int(str(page["next"]))
                    if since < int(str(page["lines"])):
                        continue  # more than one page is waiting
                    if epoch < int(str(page["current"])):
                        epoch, since = epoch + 1, 0  # the rest of the old epoch was read
                        continue
                    if not keep_following:
                        return
                    sys.stdout.flush()
                    time.sleep(FOLLOW_INTERVAL)  # a follower's pace, not a wait for a condition
        except ControlError as exc:
            click.echo(f"loopd tail: {exc}", err=True)
            sys.exit(EXIT_ERROR)
