"""What the hosting features see of a hosted session, and the two things they do to one:
hibernate it, or restart it for its memory."""

from __future__ import annotations

from collections.abc import Sized
from typing import Protocol

from supervisor.states import State


class Worker(Protocol):
    @property
    def pid(self) -> int: ...
    def rss_bytes(self) -> int | None: ...
    def kill(self) -> bool: ...
    def in_request(self) -> bool: ...
    def last_batch_ended(self) -> float | None: ...


class Hosted(Protocol):
    """What the hosting features need of a hosted session."""

    hibernating: bool

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> State: ...
    @property
    def worker(self) -> Worker | None: ...
    @property
    def in_flight(self) -> Sized: ...
    @property
    def queued(self) -> Sized: ...
    @property
    def ready_waiters(self) -> Sized: ...
    @property
    def epoch(self) -> int | None: ...
    @property
    def exit_pid(self) -> int | None: ...
    @property
    def exit_code(self) -> int | None: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def app(self) -> str | None:
        """Its App's target (``module:attribute``); None for the default App."""

    def stop(self, *, restart: bool = False) -> None: ...
    def kill_for(self, why: str) -> None: ...
    def start(self) -> None: ...


def is_busy(hosted: Hosted) -> bool:
    """Requests or clients are waiting on the session's worker, or it is serving a batch
    of requests (from any connection, direct ones included: its heartbeat cell says)."""
    if hosted.in_flight or hosted.queued or hosted.ready_waiters:
        return True
    worker = hosted.worker
    return worker is not None and worker.in_request()


def hibernate(hosted: Hosted) -> None:
    """Stop an unused worker the ordinary way; the session then rests IDLE until used."""
    if hosted.state is State.RUNNING and not is_busy(hosted):
        hosted.hibernating = True
        hosted.stop()


def restart_for_memory(hosted: Hosted, why: str) -> bool:
    """Kill a worker past its memory cap (the restart policy brings it back, ``why`` in
    its last error); False if it has no running worker."""
    if hosted.worker is None or hosted.state is not State.RUNNING:
        return False
    hosted.kill_for(why)
    return True
