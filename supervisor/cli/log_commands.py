"""``loopd logs ID [-n N] [-f]``: a session's log file, read straight from the home.

Reading needs no supervisor: the files are ``<home>/logs/<id>.log`` and its numbered
backups, so the logs of a session whose supervisor is down can still be read.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Final

import click

from supervisor.cli.options import home_option
from supervisor.hosting.log_reader import follow, tail_chunks
from supervisor.hosting.session_log import backup_numbers, log_path
from worker.store.errors import InvalidSessionId
from worker.store.session_id import validate_session_id

EXIT_USAGE: Final = 2
MAX_LINES: Final = 10**12
"""More lines than any log holds (``-n`` this large prints every line kept)."""


@click.command()
@home_option
@click.argument("session_id", metavar="ID")
@click.option("-n", "--lines", "count", type=click.IntRange(0, MAX_LINES), default=20,
              show_default=True, help="how many of the last lines to print first.")  # fmt: skip
@click.option("-f", "--follow", "keep_following", is_flag=True,
              help="then print lines as they are written, across rotations, until ^C.")  # fmt: skip
def logs(home: str, session_id: str, count: int, keep_following: bool) -> None:
    """Print the last lines of session ID's worker output (stdout and stderr)."""
    try:
        validate_session_id(session_id)
    except InvalidSessionId as exc:
        click.echo(f"loopd logs: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    path = log_path(os.path.abspath(home), session_id)
    if not keep_following and not os.path.lexists(path) and not backup_numbers(path):
        click.echo(f"loopd logs: {path}: no log yet (the session has written nothing)", err=True)
        sys.exit(1)
    out = sys.stdout.buffer
    # A reader that goes away (``| head``) or a ^C ends the command quietly.
    with contextlib.suppress(BrokenPipeError, KeyboardInterrupt):
        try:
            for chunk in tail_chunks(path, count):
                out.write(chunk)
            out.flush()
            if keep_following:
                for chunk in follow(path):
                    out.write(chunk)
                    out.flush()
        except OSError as exc:
            if isinstance(exc, BrokenPipeError):
                raise
            click.echo(f"loopd logs: {exc.filename or path}: {exc.strerror}", err=True)
            sys.exit(1)
