"""A port served by an asyncio loop on a thread of its own, off the daemon's loop.

The node's TLS port and the HTTP port each run one: started once their socket is
bound, stopped and joined by the daemon's stop. What the port serves is one coroutine
``serve(ready, stopped)``: it sets itself up, calls ``ready()``, waits for ``stopped``
and tears itself down (``cancel_the_rest`` ends what its connections left running).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

Serve = Callable[[Callable[[], None], asyncio.Event], Coroutine[Any, Any, None]]


class LoopThread:
    """One asyncio loop on a daemon thread named ``name``, running ``serve`` to its end."""

    def __init__(self, name: str, serve: Serve) -> None:
        self.name = name
        self._serve = serve
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the thread; return once ``serve`` said ready (or ended without)."""
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name=self.name, daemon=True
        )
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        """Tell ``serve`` to stop, and join the thread (nothing if never started)."""
        if self._loop is not None and self._stopped is not None:
            with contextlib.suppress(RuntimeError):  # its loop already ended
                self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(ready))
        finally:
            ready.set()  # a serve that failed before it was ready must not hang start()
            loop.close()

    async def _main(self, ready: threading.Event) -> None:
        self._stopped = asyncio.Event()
        await self._serve(ready.set, self._stopped)


async def cancel_the_rest() -> None:
    """Cancel every task of the running loop but this one, and wait for them to end."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
