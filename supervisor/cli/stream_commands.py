"""``loopd events`` and ``loopd metrics``: what a live supervisor sees, as it happens."""

from __future__ import annotations

import contextlib
import sys
from typing import Final

import click

from supervisor.cli.options import home_option, timeout_option
from supervisor.client.control import call, open_control
from supervisor.errors import ControlError
from supervisor.hosting.events import format_event
from worker.ipc.wire import FrameReader, Message, WireError, encode

EXIT_ERROR: Final = 1
_READ_SIZE: Final = 65536


@click.command()
@home_option
@timeout_option
def metrics(home: str, timeout: float) -> None:
    """Print the supervisor's metrics in the Prometheus text exposition format."""
    try:
        text = call(home, "metrics", timeout=timeout)
    except ControlError as exc:
        click.echo(f"loopd metrics: {exc.message} [{exc.code}]", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(str(text), nl=False)


@click.command()
@home_option
@timeout_option
@click.option("--json", "as_json", is_flag=True, help="one JSON object a line.")
def events(home: str, timeout: float, as_json: bool) -> None:
    """Print every session's state changes as they happen, one line each, until ^C."""
    try:
        sock = open_control(home, timeout)
    except ControlError as exc:
        click.echo(f"loopd events: {exc.message} [{exc.code}]", err=True)
        sys.exit(EXIT_ERROR)
    reader = FrameReader()
    answered = False
    with sock, contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        try:
            sock.sendall(encode({"id": 1, "op": "events"}))
            while True:
                data = sock.recv(_READ_SIZE)
                if not data:
                    click.echo("loopd events: the supervisor closed the stream", err=True)
                    sys.exit(0 if answered else EXIT_ERROR)
                for message in reader.feed(data):
                    if not answered:
                        answered = True
                        _check_subscribed(message)
                        sock.settimeout(None)  # events may be rare: wait for them
                        continue
                    event = message.get("event")
                    if isinstance(event, dict):
                        click.echo(format_event(event, as_json=as_json))
                    elif "dropped" in message:  # it fell behind: the last message
                        click.echo(f"loopd events: {message['dropped']}", err=True)
                        sys.exit(EXIT_ERROR)
        except (OSError, WireError) as exc:
            click.echo(f"loopd events: {exc}", err=True)
            sys.exit(EXIT_ERROR)


def _check_subscribed(reply: Message) -> None:
    if reply.get("ok") is not True:
        failure = reply.get("error")
        why = failure.get("message") if isinstance(failure, dict) else reply
        click.echo(f"loopd events: {why}", err=True)
        sys.exit(EXIT_ERROR)
