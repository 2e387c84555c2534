"""A node's thread that runs until told to stop: the lease keepalive, the failover watch.

``run`` loops on ``stopping`` (``stopping.wait(seconds)`` between rounds, so a stop never
waits out a round's pause); ``stop`` sets it and joins the thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Background:
    """``run`` on a daemon thread named ``name``, from ``start`` until ``stop``."""

    def __init__(self, name: str, run: Callable[[], None]) -> None:
        self.name = name
        self._run = run
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Set ``stopping`` and wait for ``run`` to return (nothing if never started)."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
