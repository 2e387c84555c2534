"""Handing requests to the App: chunks sized to the hang timeout, a deadline per request,
poison requests refused, and partial output routed to the requesting client.

Requests that arrive together are applied in chunks. A fresh worker starts with chunks
of one request (it knows nothing of its App's speed, and a batch that killed the last
worker must not kill this one) and doubles the size while a chunk takes less than its
time budget (half the smaller of the hang timeout and the request deadline), halving it
when a chunk takes more: a fast App soon shares one fsync among many requests, a slow
one is handed one turn at a time. Between requests and chunks the heartbeat is stamped,
so a worker busy with one slow turn after another is never taken for a hung one.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

from worker.app import App, DefaultApp, turn
from worker.ipc.heartbeat import MAX_TURN_KEYS, HeartbeatCell, key_digest
from worker.ipc.peer import Peer
from worker.ipc.wire import Message, WireError
from worker.loop.schedule_book import book_of
from worker.loop.schedule_requests import ScheduledChunk
from worker.store.errors import SessionError
from worker.store.session import Session

DEFAULT_MAX_BATCH: Final = 64
"""Requests one chunk may hold at most (``--max-batch``)."""
MAX_PARTIAL_CHARS: Final = 200_000
"""Characters of one partial frame; a longer partial text is sent in pieces."""
MAX_PARTIAL_BACKLOG: Final = 4 << 20
"""Bytes of partial output queued for a client before further partials are dropped;
checked before each piece, so the queue holds at most this plus one piece's frame."""

Result = Message | SessionError | WireError


@runtime_checkable
class BatchApp(Protocol):
    """An app that applies several requests with one group commit (optional seam)."""

    def handle_many(
        self, session: Session, requests: list[Message]
    ) -> list[Message | SessionError]: ...


class AppFailed(RuntimeError):
    """The App raised while handling requests: the worker ends (exit 1) and restarts."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(f"the App raised {type(cause).__name__}: {cause}")
        self.cause = cause


def handles_one_by_one(app: App) -> bool:
    """A DefaultApp subclass that changed ``handle`` only: its handle_many loops over
    handle, so it is handed one request at a time (a heartbeat, a deadline and a stream
    target each)."""
    return (
        isinstance(app, DefaultApp)
        and type(app).handle is not DefaultApp.handle
        and type(app).handle_many is DefaultApp.handle_many
    )


class PoisonRequest(SessionError):
    """A request whose key killed its worker too often; it is refused, not tried again."""

    def __init__(self, key: str, deaths: int) -> None:
        super().__init__(key, deaths)
        self.key = key
        self.deaths = deaths

    def __str__(self) -> str:
        shown = self.key if len(self.key) <= 80 else self.key[:77] + "..."
        return (
            f"request {shown!r} was in flight at {self.deaths} deaths of this session's "
            "worker (crash, kill, hang or deadline): it is refused as a poison request and "
            "was not applied; fix the App or the request, then send it with a new key "
            "(`loopd logs` shows the deaths)"
        )


@dataclass(slots=True)
class Target:
    """Where a request's partial output and its reply go."""

    peer: Peer
    request_id: object
    streams: bool = False  # asked for partials ("stream": true) on its own connection
    dropped: int = 0  # partials not sent because the client did not read them


class ChunkSizer:
    """How many requests the next chunk may hold (slow start, as TCP's congestion window)."""

    def __init__(self, budget: float | None, limit: int = DEFAULT_MAX_BATCH) -> None:
        self.budget = budget
        self.limit = max(1, limit)
        self._size = 1 if budget is not None else self.limit

    def size(self) -> int:
        return self._size

    def took(self, seconds: float, requests: int) -> None:
        """A chunk of ``requests`` took ``seconds``: grow or shrink the next one."""
        if self.budget is None:
            return
        if seconds > self.budget:
            self._size = max(1, self._size // 2)
        elif requests >= self._size:
            self._size = min(self.limit, self._size * 2)


class TurnRunner:
    """Runs chunks of requests through the App: the worker's side of ``worker.app.turn``."""

    def __init__(
        self,
        app: App,
        session: Session,
        *,
        cell: HeartbeatCell | None = None,
        request_deadline: float | None = None,
        hang_timeout: float | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        poisoned: dict[bytes, int] | None = None,
    ) -> None:
        self.app = app
        self.session = session
        self.cell = cell
        self.request_deadline = request_deadline
        budgets = [t / 2 for t in (hang_timeout, request_deadline) if t is not None]
        self.sizer = ChunkSizer(min(budgets) if budgets else None, min(max_batch, MAX_TURN_KEYS))
        self.poisoned = dict(poisoned or {})
        # The runtime Protocol check is slow: made once, not per batch.
        self._many: Callable[[Session, list[Message]], list[Message | SessionError]] | None = (
            app.handle_many if isinstance(app, BatchApp) and not handles_one_by_one(app) else None
        )
        self._thread = threading.get_ident()
        self._targets: dict[int, Target] = {}
        self._chunk: list[tuple[Target, Message]] = []
        self._todo: list[int] = []  # indexes of the chunk's requests the App is handed
        self._current: Target | None = None
        self._alarm = 0.0  # the deadline progress() re-arms, 0: none running
        self.book = book_of(session)
        # What turn.schedule() staged joins the App's next group commit, whichever of
        # append and append_many it calls (append calls append_many): the schedule is in
        # the log exactly when the request's records are (docs/apps.md, "Schedules").
        plain_append_many = session.append_many
        session.append_many = lambda records: plain_append_many(  # type: ignore[method-assign] # the one seam every App's commit goes through
            self.book.with_staged(records)
        )
        turn.install(self)

    def chunk_size(self) -> int:
        return self.sizer.size()

    def run(self, given: list[tuple[Target, Message]]) -> list[Result]:
        """Apply one chunk in order; each request's result or its error."""
        started = time.monotonic()
        # Schedule operations done, due deliveries expanded, early ones refused first.
        scheduled = ScheduledChunk(self.book, given, most=self.sizer.limit)
        chunk = scheduled.items
        results: list[Result | None] = [None] * len(chunk)
        todo: list[int] = []
        for index, (_target, payload) in enumerate(chunk):
            refused = scheduled.decided.get(index) or self._poison(payload)
            if refused is not None:
                results[index] = refused
            else:
                todo.append(index)
        self._targets = {id(chunk[i][1]): chunk[i][0] for i in todo}
        self._chunk, self._todo = chunk, todo  # read only by schedule(): nothing built here
        try:
            if self._many is not None and todo:
                payloads = [chunk[i][1] for i in todo]
                self._current = chunk[todo[0]][0] if len(todo) == 1 else None
                self._begin(payloads, len(payloads))
                for i, result in zip(todo, self._many(self.session, payloads), strict=True):
                    results[i] = result
            else:
                for i in todo:
                    target, payload = chunk[i]
                    self._current = target
                    self._begin([payload], 1)
                    results[i] = self._one(payload)
        except SessionError:
            self._end()
            raise
        except BaseException as exc:
            # The worker is about to die of it: the requests stay named in the cell, so
            # its supervisor charges them with this death (poison requests), and an
            # error such as ConnectionResetError from the App's own backend is never
            # taken for the supervisor hanging up (a clean stop) by the process's main.
            self._disarm()
            if isinstance(exc, Exception):
                raise AppFailed(exc) from exc
            raise
        self._end()
        self.sizer.took(time.monotonic() - started, len(chunk))
        return scheduled.results([r if r is not None else WireError("no result") for r in results])

    def _one(self, payload: Message) -> Result:
        try:
            return self.app.handle(self.session, payload)
        except SessionError as exc:
            return exc

    def _poison(self, payload: Message) -> PoisonRequest | None:
        key = payload.get("key")
        if not self.poisoned or type(key) is not str:
            return None
        deaths = self.poisoned.get(key_digest(key))
        if deaths is None:
            return None
        try:
            if self.session.find_key(key) is not None:
                return None  # applied before a death: the App answers it from the log
        except SessionError:
            return None  # the App's own rule decides (it may refuse it as expired)
        return PoisonRequest(key, deaths)

    # -- deadlines and the heartbeat ----------------------------------------------------

    def _begin(self, payloads: list[Message], requests: int) -> None:
        if self.cell is not None:
            keys = [k for k in (p.get("key") for p in payloads) if type(k) is str]
            self.cell.begin_turn(keys)
        if self.request_deadline is not None:
            # Past its deadline the default action of SIGALRM ends the process; the
            # supervisor restarts it and its clients retry with their keys. A chunk of a
            # handle_many App gets a deadline per request it holds.
            self._alarm = self.request_deadline * requests
            signal.setitimer(signal.ITIMER_REAL, self._alarm)

    def _disarm(self) -> None:
        self.book.staged.clear()  # staged by a turn that wrote nothing: not scheduled
        self._targets = {}
        self._current = None
        if self._alarm:
            self._alarm = 0.0
            signal.setitimer(signal.ITIMER_REAL, 0)

    def _end(self) -> None:
        self._disarm()
        if self.cell is not None:
            self.cell.end_turn()

    # -- worker.app.turn ------------------------------------------------------------------

    def _check_thread(self, call: str) -> None:
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                f"worker.app.turn.{call}() is called from the thread that runs handle(), "
                "not from another thread"
            )

    def progress(self) -> None:
        self._check_thread("progress")
        if self.cell is not None:
            self.cell.beat()
        if self._alarm and self.request_deadline is not None:
            signal.setitimer(signal.ITIMER_REAL, self.request_deadline)

    def schedule(self, at: object, text: object, key: object, untrusted: object) -> str:
        self._check_thread("schedule")
        if not self._targets:
            raise RuntimeError("schedule() is called while handle() runs a request")
        # A key of a request of this chunk would be taken by that request as delivered.
        batch = {self._chunk[i][1].get("key") for i in self._todo}
        return self.book.stage(at, text, key, untrusted, batch)

    def stream(self, text: str, request: Message | None) -> None:
        self._check_thread("stream")
        if request is not None:
            target = self._targets.get(id(request))
            if target is None:
                raise ValueError("stream(): that request is not one being handled now")
        elif self._current is not None:
            target = self._current
        elif self._targets:
            raise ValueError("stream(): several requests are being handled; name one")
        else:
            return  # outside a turn (a resume, a compact): nobody to stream to
        if not target.streams:
            return  # not asked for, or relayed by the supervisor: one reply frame only
        for start in range(0, max(1, len(text)), MAX_PARTIAL_CHARS):
            # The bound is checked before each piece, not once a call: one call of 64 MB
            # to a client that does not read queued all of it (issue #29). Past it, the
            # rest of the call is dropped, counted once.
            if len(target.peer.out) > MAX_PARTIAL_BACKLOG:
                target.dropped += 1
                return
            # Pieces that always fit a frame (4 bytes a character at most in UTF-8).
            piece = text[start : start + MAX_PARTIAL_CHARS]
            target.peer.queue({"id": target.request_id, "partial": piece})
            target.peer.flush()  # what the socket takes now leaves room for the next
