"""The worker's code run once in the process that forks workers, before the first fork.

A forked worker shares the supervisor's memory pages until one of the two writes to a
page. CPython writes into much of what code merely runs: each code object's warm-up
counter and, once it is warm, its specialized instructions; caches built on first use;
the free slots of its allocator's pools. A worker forked from a supervisor that never
ran the worker's code makes all those writes itself, and every page they touch becomes
its own private copy. Run once here, in the supervisor, they are made once, and every
worker forked afterwards shares their result (docs/benchmarks.md, "Density").

The run is a scratch session in a temporary directory (in memory where ``/dev/shm`` is
writable, so that it costs no disk flushes), created, opened and served in
process by the worker's own ``Server`` through a connection attached as the daemon
attaches one, with the default App, and then removed. No chaos hook sees it, and the
worker counters it moved are reset.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Final

from worker.app import DefaultApp
from worker.ipc.wire import FrameReader, Message, WireError, encode
from worker.loop.server import Server
from worker.store.disk.durable import set_hook
from worker.store.disk.layout import SESSIONS_DIR
from worker.store.format import scan_summary
from worker.store.format.line_scan import scan_lines
from worker.store.format.record_codecs import compile_every_codec
from worker.store.schedules import format_time, parse_time
from worker.store.session import Session
from worker.store.stats import STATS

REQUESTS: Final = 16
"""Requests the scratch session serves (enough for the per-request path to warm up)."""
_SESSION: Final = "warm-up"
_READ: Final = 1 << 16
_PATIENCE: Final = 30.0
_PREFIX: Final = "loopd-warm-up-"
_SCRATCH_NAME: Final = re.compile(r"loopd-warm-up-([1-9][0-9]{0,9})-[a-z0-9_]+")
_MEMORY: Final = "/dev/shm"  # noqa: S108 - mkdtemp makes a private directory in it
"""Where the scratch session goes if it can (memory: its fsyncs cost nothing)."""


STALE_AFTER: Final = 60.0
"""Seconds after which a scratch directory whose maker is gone is another's to remove
(a warm-up lasts milliseconds)."""


def _scratch_parent() -> str | None:
    return _MEMORY if os.access(_MEMORY, os.W_OK | os.X_OK) else None


def scratch_home() -> str:
    """A new private directory for a warm-up's scratch session (in memory if it can be),
    named with the pid of the process that made it (``remove_stale_scratch``)."""
    return tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=_scratch_parent())


def remove_stale_scratch() -> int:
    """Remove the scratch directories of this user whose maker is gone, older than
    ``STALE_AFTER`` (left by a serve SIGKILLed with its spare, which removes its own
    otherwise); how many. Nothing else is touched: another user's, a live maker's, a
    young one (a maker in another pid namespace may share the directory)."""
    parent = _scratch_parent() or tempfile.gettempdir()
    removed = 0
    try:
        names = os.listdir(parent)
    except OSError:
        return 0
    for name in names:
        found = _SCRATCH_NAME.fullmatch(name)
        if found is None:
            continue
        path = os.path.join(parent, name)
        try:
            info = os.lstat(path)
            os.kill(int(found.group(1)), 0)
        except ProcessLookupError:
            pass  # its maker is gone
        except OSError:
            continue  # no such entry, or a maker alive (another user's: EPERM)
        else:
            continue
        if info.st_uid != os.geteuid() or time.time() - info.st_mtime < STALE_AFTER:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed += 1
    return removed


def warm_up(requests: int = REQUESTS, home: str | None = None) -> None:
    """Create, open and serve a scratch session in process, then remove it.

    ``home``: an empty directory of the caller's for it (a spare worker's, which serve
    removes should the spare be killed mid-way); removed here at the end, as the one
    made here when none is given. Raises the store's SessionError, or OSError, if the
    directory cannot hold it or its server stops answering; nothing is left behind
    either way (unless the process is killed first: hence ``home``).
    """
    previous = set_hook(None)  # a boundary hook is the rig's; this run is not its case
    try:
        with _scratch(home) as scratch:
            app = DefaultApp()
            Session.create(scratch, _SESSION, app.initial_baseline(_SESSION)).close()
            _serve(Session.open(scratch, _SESSION), app, requests)
            _take_a_summary(scratch)
        # The codecs are compiled on first use (issue 32); the types the scratch session
        # never wrote are compiled here too, so that no forked worker compiles its own.
        compile_every_codec()
        # A schedule's time is parsed with calendar, which the store imports on first use
        # (issue 32): once here, so that no forked worker imports it for its first one.
        parse_time(format_time(0.0))
    finally:
        set_hook(previous)
        STATS.reset()


@contextlib.contextmanager
def _scratch(home: str | None) -> Iterator[str]:
    made = scratch_home() if home is None else home
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def _take_a_summary(home: str) -> None:
    """Read the scratch log as a restart does with its scan summary (docs/format.md, "The
    scan summary"): summarize its first lines, then scan the rest after the summary's,
    so no forked worker compiles or warms that path at its own first restart."""
    with open(os.path.join(home, SESSIONS_DIR, _SESSION, "0.jsonl"), "rb") as f:
        data = f.read()
    cut = data.index(b"\n") + 1
    scan = scan_lines(data[:cut])
    kept = None if scan is None else scan.summary(0, data[:cut])
    summary = None if kept is None else scan_summary.decode(scan_summary.encode(kept))
    if summary is not None and summary.covers(data, 0):
        scan_lines(data, summary, 0)


def _serve(session: Session, app: DefaultApp, requests: int) -> None:
    ours, workers = socket.socketpair()  # the control channel, as the daemon has it
    client, attached = socket.socketpair()  # a client's connection, handed over
    try:
        server = Server(session, app, workers)
        runner = threading.Thread(target=server.run, name="loopd-warm-up")
        runner.start()
        try:
            socket.send_fds(ours, [encode({"op": "attach"})], [attached.fileno()])
            attached.close()
            client.settimeout(_PATIENCE)  # a server that died cannot hang the supervisor
            reader = FrameReader()
            for n in range(requests):
                request = {"text": f"warm-up {n}", "key": f"warm-up-{n}"}
                client.sendall(encode({"id": n + 1, "op": "request", "request": request}))
                _reply(client, reader)
            client.sendall(encode({"id": 0, "op": "status"}))
            _reply(client, reader)
        finally:
            ours.close()  # the end of its control channel: the server's loop ends
            runner.join()
    finally:
        for sock in (ours, workers, client, attached):
            sock.close()
        session.close()


def _reply(sock: socket.socket, reader: FrameReader) -> Message:
    while True:
        data = sock.recv(_READ)
        if not data:
            raise WireError("the warm-up server closed its connection")
        replies = reader.feed(data)
        if replies:
            return replies[0]
