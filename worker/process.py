"""The worker process: lock and open one session, resume, signal ready, serve, exit.

Exit codes are part of the contract (docs/operations.md):
0 clean stop; 3 lock held by another process; 4 log refused (torn, invalid, baseline;
``path:line: why`` printed on stderr first); 5 session not found; 6 cannot open: the
store failed while opening or resuming (a directory where a file must be, EACCES),
which a restart will not fix; 7 not the owner: a session in PostgreSQL whose write the
database refused (another owner claimed it); 8 the database was unreachable or a
write's outcome is unknown (a restart reopens what it holds); 9 the home's filesystem
is full (ENOSPC or EDQUOT opening the session, or a write that ended it): started again
until space is freed; anything else is a crash (1 for an unexpected
exception, 2 for bad arguments, -N for a signal). The reason goes to stderr and, in an
``exiting`` report, to the supervisor, both cut at MAX_REPORT characters so the report
always fits a frame.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import sys
import traceback
from types import FrameType
from typing import Final

from worker.app import DEFAULT_APP, DEFAULT_BUDGET, App, load_app
from worker.app.version import app_version
from worker.ipc.heartbeat import HeartbeatCell
from worker.ipc.lease_deadline import LeaseFence
from worker.ipc.wire import Channel, Message
from worker.loop.app_change import note_app_change
from worker.loop.replies import describe
from worker.loop.server import Server
from worker.loop.turns import DEFAULT_MAX_BATCH
from worker.offline.refusal import refusal_kind
from worker.store.backend import SessionStore
from worker.store.disk.fork_guard import guard_selector, guard_socket
from worker.store.disk.layout import session_dir
from worker.store.errors import (
    LOG_REFUSED,
    NotOwnerNow,
    SessionBroken,
    SessionError,
    SessionExists,
    SessionIOError,
    SessionLocked,
    SessionNotFound,
)
from worker.store.fencing import write_owner
from worker.store.format.records import EpochEnd
from worker.store.format.writer_app import stamp_app
from worker.store.postgres import DatabaseUnavailable, PostgresStore
from worker.store.session import Session

EXIT_CLEAN: Final = 0
EXIT_CRASH: Final = 1
EXIT_LOCKED: Final = 3
EXIT_REFUSED: Final = 4
EXIT_NOT_FOUND: Final = 5
EXIT_CANNOT_OPEN: Final = 6
EXIT_NOT_OWNER: Final = 7
EXIT_DATABASE: Final = 8
EXIT_DISK_FULL: Final = 9
STORE_ENV: Final = "LOOPD_STORE"
"""The environment variable naming the worker's store (a libpq URI; absent: its home).
Not an argument: a URI may hold a password, and a process's arguments are world-readable."""
MAX_REPORT: Final = 2000
"""Characters of an error text sent in the exit report or printed (a frame is 1 MiB)."""

# Open failures a later attempt may well not meet again (the machine was short of
# descriptors or memory for a moment): these stay crashes, restarted with backoff.
_TRANSIENT_OPEN: Final = frozenset(
    {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EAGAIN, errno.EINTR}
)


class StopRequested(Exception):
    """Raised by the SIGTERM handler while the session opens (the server's own handler
    then stops its loop at its next turn instead)."""


class CannotOpen(SessionError):
    """Opening or resuming the session failed in a way a restart will not fix."""

    def __init__(self, cause: SessionError) -> None:
        super().__init__(cause)
        self.cause = cause

    def __str__(self) -> str:
        return str(self.cause)


def bounded(text: str, limit: int = MAX_REPORT) -> str:
    """Return ``text``, cut to ``limit`` characters ending in ``...`` if it is longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _opened(args: argparse.Namespace, app: App) -> Session:
    """``open_session``, with a deterministic store failure raised as CannotOpen."""
    try:
        return open_session(args, app)
    except LOG_REFUSED:
        raise  # each of these has its own exit code
    except (SessionLocked, SessionNotFound, DatabaseUnavailable):
        raise  # the database's: a restart with backoff (EXIT_DATABASE)
    except NotOwnerNow as exc:
        if args.store is not None:
            raise  # the database holds a newer owner's token: EXIT_NOT_OWNER
        raise CannotOpen(exc) from exc
    except SessionIOError as exc:
        if exc.errno in _TRANSIENT_OPEN or exc.fills(args.home):  # EXIT_DISK_FULL
            raise
        raise CannotOpen(exc) from exc
    except SessionError as exc:
        raise CannotOpen(exc) from exc


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise StopRequested(signum)


def parse_args(argv: list[str]) -> argparse.Namespace:
    return _PARSER.parse_args(argv)


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m worker", description=__doc__)
    parser.add_argument("--home", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument(
        "--channel-fd",
        type=int,
        required=True,
        help="fd of the socket to the supervisor (inherited)",
    )
    # Cluster mode (docs/scaling.md): the node's name, the session's fencing token, the
    # node lease it was given under and the file where the node publishes that lease.
    parser.add_argument("--cluster-node", default=None)
    parser.add_argument("--cluster-token", type=int, default=None)
    parser.add_argument("--cluster-lease", type=int, default=0)
    parser.add_argument("--lease-file", default=None)
    # The node's certificate (--listen tls://): the worker makes the TLS handshake of each
    # TCP connection handed to it (the direct data path, worker/loop/tls_peer.py).
    parser.add_argument("--tls-ca", default=None)
    parser.add_argument("--tls-cert", default=None)
    parser.add_argument("--tls-key", default=None)
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
        help="seconds one request may take (from its start or its App's last progress "
        "call) before SIGALRM ends the worker",
    )
    parser.add_argument(
        "--hang-timeout",
        type=float,
        default=None,
        help="the supervisor's hang timeout: chunks of requests are sized to half of it",
    )
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH)
    parser.add_argument(
        "--poison",
        action="append",
        default=[],
        metavar="DIGEST:DEATHS",
        help="a request key's digest (hex) that was in flight at DEATHS deaths: refused",
    )
    return parser


# Built once, at import: a worker forked from the warm supervisor only parses its
# arguments (building the parser costs about a millisecond and its objects stay shared).
_PARSER: Final = _build_parser()


def _poisoned(values: list[str]) -> dict[bytes, int]:
    poisoned = {}
    for value in values:
        digest, _, deaths = value.partition(":")
        poisoned[bytes.fromhex(digest)] = int(deaths)
    return poisoned


def _store(args: argparse.Namespace) -> str | SessionStore[Session]:
    """The home, or the database named by STORE_ENV (connected here, after the fork)."""
    uri = getattr(args, "store", None)
    if uri is None:
        return str(args.home)
    # No connection yet: it is made by the open, in this process.
    return PostgresStore(uri)


def _open_owned(store: PostgresStore, args: argparse.Namespace, app: App) -> Session:
    """A cluster node's session in the database, claimed with etcd's owner token.

    Every later write checks that token in its transaction (Temporal's RangeID): once a
    newer owner opened the session, this worker's writes are refused (NotOwnerNow).
    """
    if args.create:
        try:
            baseline = app.initial_baseline(args.session)
            store.create_session(args.session, baseline, args.slot).close()
        except SessionExists:
            pass  # a create retried, or created by a former owner
    return store.open_session(args.session, token=args.cluster_token)


def open_session(args: argparse.Namespace, app: App) -> Session:
    """Lock and open (or create) the session, completing an interrupted epoch change."""
    store = _store(args)
    if isinstance(store, PostgresStore) and args.cluster_token is not None:
        session = _open_owned(store, args, app)
    elif args.create:
        session = Session.open_or_create(
            store, args.session, app.initial_baseline(args.session), args.slot
        )
    else:
        session = Session.open(store, args.session)
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
    # Read once and taken out: an App's children never inherit the URI (and its password).
    args.store = os.environ.pop(STORE_ENV, None) or None
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Whatever the start method left (a forked child inherits the supervisor's
    # dispositions): a client that closes before its reply is an EPIPE on its own
    # connection, never a SIGPIPE that ends the worker and every other client's batch.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    control = socket.socket(fileno=args.channel_fd)
    # Neither an App's exec'd child (pass_fds left it inheritable) nor its forked one
    # may hold the supervisor's channel.
    control.set_inheritable(False)
    guard_socket(control)
    channel = Channel(control)
    session: Session | None = None
    try:
        app = load_app(args.app, args.budget)
        version = app_version(args.app)  # stamped on every SessionStart it writes
        stamp_app(args.app, version)
        session = _opened(args, app)
        fence = _cluster_fence(args, session)
        changed = note_app_change(session, args.app, version)
        channel.send({"op": "ready", **describe(session)})
        if changed is not None:  # for the supervisor's event stream
            channel.send({"op": "state", "state": describe(session), "app_changed": changed})
        server = Server(
            session,
            app,
            control,
            heartbeat=args.heartbeat,
            heartbeat_cell=_heartbeat_cell(args.heartbeat_fd),
            request_deadline=args.request_deadline,
            hang_timeout=args.hang_timeout,
            max_batch=args.max_batch,
            poisoned=_poisoned(args.poison),
            fence=fence,
            tls=_tls_files(args),
        )
        # Its clients' sockets (all in its selector) are never held by an App's forked
        # child: a client sees the end of stream when the worker dies (issue 29).
        guard_selector(server.selector)
        signal.signal(signal.SIGTERM, server.on_sigterm)  # stops at the next turn
        server.run()
    except (StopRequested, BrokenPipeError, ConnectionResetError):
        # SIGTERM, or the supervisor vanished while we wrote to it: a clean stop.
        return EXIT_CLEAN
    except SessionLocked as exc:
        _report(channel, "locked", str(exc), pid=exc.pid)
        return EXIT_LOCKED
    except LOG_REFUSED as exc:
        print(bounded(str(exc)), file=sys.stderr, flush=True)
        kind = refusal_kind(session_dir(args.home, args.session), exc)
        _report(channel, "refused", str(exc), kind=kind)
        return EXIT_REFUSED
    except SessionNotFound as exc:
        _report(channel, "not_found", str(exc))
        return EXIT_NOT_FOUND
    except NotOwnerNow as exc:  # only a session in a database: a newer owner claimed it
        print(bounded(str(exc)), file=sys.stderr, flush=True)
        _report(channel, "not_owner", str(exc))
        return EXIT_NOT_OWNER
    except CannotOpen as exc:
        print(f"cannot open: {bounded(str(exc))}", file=sys.stderr, flush=True)
        _report(channel, "cannot_open", str(exc))
        return EXIT_CANNOT_OPEN
    except DatabaseUnavailable as exc:
        return _database_exit(channel, exc)
    except SessionBroken as exc:
        cause = getattr(session, "broken_by", None)  # a session in PostgreSQL says what broke it
        if isinstance(cause, NotOwnerNow):
            print(bounded(str(exc)), file=sys.stderr, flush=True)
            _report(channel, "not_owner", str(cause))
            return EXIT_NOT_OWNER
        if isinstance(cause, DatabaseUnavailable):
            return _database_exit(channel, cause)
        return _store_crash(channel, exc)
    except SessionIOError as exc:  # the disk's (full at open or at a commit), not the App's
        if exc.fills(args.home):  # never FATAL: started again until space is freed
            print(bounded(str(exc)), file=sys.stderr, flush=True)
            _report(channel, "disk_full", str(exc))
            return EXIT_DISK_FULL
        return _store_crash(channel, exc)
    except BaseException as exc:  # noqa: BLE001 - main() turns anything into an exit code
        return _crash(channel, exc)
    else:
        return EXIT_CLEAN
    finally:
        if session is not None:
            session.close()


def _crash(channel: Channel, exc: BaseException) -> int:
    """Print the traceback and report the crash; EXIT_CRASH."""
    # Each part of the traceback is cut, not the whole: the frames stay readable when
    # the exception's text quotes a huge value.
    parts = traceback.format_exception(exc)
    print("".join(bounded(part) for part in parts), end="", file=sys.stderr, flush=True)
    _report(channel, "crash", f"{type(exc).__name__}: {exc}")
    return EXIT_CRASH


def _store_crash(channel: Channel, exc: SessionError) -> int:
    """The disk failed the store (its message names the file and the cause): one line, no
    traceback of loopd's own frames; EXIT_CRASH. Any other error keeps its traceback."""
    print(f"{type(exc).__name__}: {bounded(str(exc))}", file=sys.stderr, flush=True)
    _report(channel, "crash", f"{type(exc).__name__}: {exc}")
    return EXIT_CRASH


def _database_exit(channel: Channel, exc: DatabaseUnavailable) -> int:
    """The database failed (unreachable, or a COMMIT's outcome unknown): one line; EXIT_DATABASE."""
    print(bounded(str(exc)), file=sys.stderr, flush=True)
    _report(channel, "database", str(exc))
    return EXIT_DATABASE


def _cluster_fence(args: argparse.Namespace, session: Session) -> LeaseFence | None:
    """In cluster mode: write this node's Owner into the log, and fence replies on its lease."""
    if args.cluster_token is None:
        return None
    try:
        write_owner(session, args.cluster_node, args.cluster_token)
    except SessionError as exc:  # a newer token in the log, or sealed by a move
        raise CannotOpen(exc) from exc
    return LeaseFence(args.lease_file, args.cluster_lease, args.cluster_token)


def _tls_files(args: argparse.Namespace) -> tuple[str, str, str] | None:
    files = (args.tls_ca, args.tls_cert, args.tls_key)
    return files if all(f is not None for f in files) else None


def _heartbeat_cell(fd: int | None) -> HeartbeatCell | None:
    if fd is None:
        return None
    try:
        return HeartbeatCell(fd)
    finally:
        os.close(fd)  # the mapping stays


def _report(
    channel: Channel, code: str, message: str, pid: int | None = None, kind: str | None = None
) -> None:
    """Tell the supervisor why the worker is about to exit, if it is still listening;
    a refused log's ``kind`` (worker.offline.refusal) picks the operator's next step."""
    report: Message = {"op": "exiting", "code": code, "message": bounded(message), "holder": pid}
    if kind is not None:
        report["kind"] = kind
    try:
        channel.send(report)
    except OSError:
        return  # the supervisor is gone; the exit code says it all
