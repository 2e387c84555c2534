"""The worker process: lock and open one session, resume, signal ready, serve, exit.

Exit codes are part of the contract (docs/operations.md):
0 clean stop; 3 lock held by another process; 4 log refused (torn, invalid, baseline;
``path:line: why`` printed on stderr first); 5 session not found; anything else is a
crash (1 for an unexpected exception, 2 for bad arguments, -N for a signal).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import traceback
from types import FrameType
from typing import Final

from worker.app import DEFAULT_APP, DEFAULT_BUDGET, App, load_app
from worker.errors import LOG_REFUSED, SessionLocked, SessionNotFound
from worker.heartbeat import HeartbeatCell
from worker.records import EpochEnd
from worker.server import Server, describe
from worker.session import Session
from worker.wire import Channel

EXIT_CLEAN: Final = 0
EXIT_CRASH: Final = 1
EXIT_LOCKED: Final = 3
EXIT_REFUSED: Final = 4
EXIT_NOT_FOUND: Final = 5


class StopRequested(Exception):
    """Raised by the SIGTERM handler to leave the serving loop cleanly."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise StopRequested(signum)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    parser.add_argument("--home", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument(
        "--channel-fd",
        type=int,
        required=True,
        help="fd of the socket to the supervisor (inherited)",
    )
    parser.add_argument("--create", action="store_true", help="create the session if absent")
    parser.add_argument("--slot", type=int, default=0)
    parser.add_argument("--app", default=DEFAULT_APP, help="module:attribute of the app")
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument(
        "--heartbeat", type=float, default=None, help="seconds between heartbeats (none: off)"
    )
    parser.add_argument(
        "--heartbeat-fd", type=int, default=None, help="memfd of the heartbeat cell (inherited)"
    )
    parser.add_argument(
        "--request-deadline",
        type=float,
        default=None,
        help="seconds a batch of requests may take before SIGALRM ends the worker",
    )
    return parser.parse_args(argv)


def open_session(args: argparse.Namespace, app: App) -> Session:
    """Lock and open (or create) the session, completing an interrupted epoch change."""
    if args.create:
        session = Session.open_or_create(
            args.home, args.session, app.initial_baseline(args.session), args.slot
        )
    else:
        session = Session.open(args.home, args.session)
    closing = session.records[-1]
    if isinstance(closing, EpochEnd):
        # The log ends with EpochEnd: an epoch change was cut short. Finish it before
        # serving; commit_epoch takes the recorded summary and writes no second EpochEnd.
        try:
            session.commit_epoch(closing.summary, app.next_baseline(session, closing.summary))
        except BaseException:
            session.close()
            raise
    return session


def main(argv: list[str] | None = None) -> int:
    """Run one worker; turn every outcome into the documented exit code."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    control = socket.socket(fileno=args.channel_fd)
    channel = Channel(control)
    session: Session | None = None
    try:
        app = load_app(args.app, args.budget)
        session = open_session(args, app)
        channel.send({"op": "ready", **describe(session)})
        Server(
            session,
            app,
            control,
            heartbeat=args.heartbeat,
            heartbeat_cell=_heartbeat_cell(args.heartbeat_fd),
            request_deadline=args.request_deadline,
        ).run()
    except (StopRequested, BrokenPipeError, ConnectionResetError):
        # SIGTERM, or the supervisor vanished while we wrote to it: a clean stop.
        return EXIT_CLEAN
    except SessionLocked as exc:
        _report(channel, "locked", str(exc), pid=exc.pid)
        return EXIT_LOCKED
    except LOG_REFUSED as exc:
        print(str(exc), file=sys.stderr, flush=True)
        _report(channel, "refused", str(exc))
        return EXIT_REFUSED
    except SessionNotFound as exc:
        _report(channel, "not_found", str(exc))
        return EXIT_NOT_FOUND
    except BaseException as exc:  # noqa: BLE001 - main() turns anything into an exit code
        traceback.print_exc()
        _report(channel, "crash", f"{type(exc).__name__}: {exc}")
        return EXIT_CRASH
    else:
        return EXIT_CLEAN
    finally:
        if session is not None:
            session.close()


def _heartbeat_cell(fd: int | None) -> HeartbeatCell | None:
    if fd is None:
        return None
    try:
        return HeartbeatCell(fd)
    finally:
        os.close(fd)  # the mapping stays


def _report(channel: Channel, code: str, message: str, pid: int | None = None) -> None:
    """Tell the supervisor why the worker is about to exit, if it is still listening."""
    try:
        channel.send({"op": "exiting", "code": code, "message": message, "holder": pid})
    except OSError:
        return  # the supervisor is gone; the exit code says it all
