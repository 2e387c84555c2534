"""Blocking client calls (``supervisor.client.Client``) on a pool of threads, awaited.

The client is blocking by design (kernel timeouts on its sockets); the HTTP loop must
never block, so each call runs on one of ``THREADS`` daemon threads, each with its own
``Client`` (a client is not shared between threads; its connections to the workers
are kept between calls). Daemon threads: a call still waiting on a worker when serve
exits holds nothing that needs an orderly end. A send is not run here but on the
port's loop (``worker_links``), save for asking the daemon for a connection and a send
retried by key after its worker died.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

from supervisor.client import Client
from supervisor.errors import ControlError

THREADS: Final = 64
MAX_IN_FLIGHT: Final = 256
"""Calls running or waiting for a thread at once; one more is refused ``busy`` (429)."""
RETRY_FOR: Final = 10.0
"""Seconds a call retries a session whose worker restarts (``Client.retry_for``)."""

_T = TypeVar("_T")
_Job = tuple[
    Callable[[Client], object], asyncio.Future[object], asyncio.AbstractEventLoop, str | None
]


class ClientPool:
    """``THREADS`` threads, each with a Client of ``home``; ``run`` awaits one call."""

    def __init__(self, home: str) -> None:
        self.home = home
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0  # threads done with their job, free for another (under _lock)
        self.in_flight = 0  # calls not yet answered (the loop's thread only)

    async def run(self, call: Callable[[Client], _T], tenant: str | None = None) -> _T:
        """``call(client)`` on a pool thread, with a client asking as ``tenant`` (None: the
        operator); its result or its exception. Refused ``busy`` past ``MAX_IN_FLIGHT``."""
        with self.admitted():
            return await self.run_admitted(call, tenant)

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """One call in flight for its duration; ControlError ``busy`` past ``MAX_IN_FLIGHT``
        (the loop's thread only: a send answered on the loop counts as a call)."""
        self.admit()
        try:
            yield
        finally:
            self.release()

    def admit(self) -> None:
        """Count one call in flight until ``release``; ControlError ``busy`` (not counted)
        past ``MAX_IN_FLIGHT`` (the loop's thread only)."""
        if self.in_flight >= MAX_IN_FLIGHT:
            raise ControlError("busy", f"{MAX_IN_FLIGHT} calls in flight; retry later")
        self.in_flight += 1

    def release(self) -> None:
        """The end of a call ``admit`` counted."""
        self.in_flight -= 1

    async def run_admitted(self, call: Callable[[Client], _T], tenant: str | None = None) -> _T:
        """``run`` within a call already ``admitted`` (not counted again)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[object] = loop.create_future()
        self._start_one()
        self._jobs.put((call, future, loop, tenant))
        return await future  # type: ignore[return-value]

    def close(self) -> None:
        """Ask every thread to end after its call (not waited for: see the module)."""
        for _ in self._threads:
            self._jobs.put(None)

    def _start_one(self) -> None:
        with self._lock:
            if self._idle > 0:
                self._idle -= 1  # this job is that thread's
            elif len(self._threads) < THREADS:
                thread = threading.Thread(target=self._serve, name="loopd-http-call", daemon=True)
                self._threads.append(thread)
                thread.start()

    def _serve(self) -> None:
        # A client per tenant: a client keeps its connections to the workers, and one
        # tenant's connection must never serve another's call.
        clients: dict[str | None, Client] = {}
        try:
            while (job := self._jobs.get()) is not None:
                call, future, loop, tenant = job
                client = clients.get(tenant)
                if client is None:
                    client = clients[tenant] = Client(self.home, retry_for=RETRY_FOR, tenant=tenant)
                try:
                    result = call(client)
                except Exception as exc:  # noqa: BLE001 (a thread's boundary: the awaiting coroutine decides)
                    _hand(loop, _set_exception, future, exc)
                else:
                    _hand(loop, _set_result, future, result)
                with self._lock:
                    self._idle += 1
        finally:
            for client in clients.values():
                client.close()


def _hand(
    loop: asyncio.AbstractEventLoop,
    setter: Callable[[asyncio.Future[object], _T], None],
    future: asyncio.Future[object],
    value: _T,
) -> None:
    try:
        loop.call_soon_threadsafe(setter, future, value)
    except RuntimeError:  # the loop closed (serve exits): nobody waits for it any more
        return


def _set_result(future: asyncio.Future[object], result: object) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[object], exc: Exception) -> None:
    if not future.done():
        future.set_exception(exc)
