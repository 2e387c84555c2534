"""Each follower's lane: an owner's sends to one follower, in log order, off its thread.

A replicated owner hands a group to its followers as soon as the group is written,
while its own fdatasync runs (``Session.on_written``), and what it could not hand over
(an epoch commit's new files) once it is synced; both go to each follower's lane, one
thread per follower, so a follower receives the steps in the order of the log while
the followers are sent to at once. ``collect`` waits for every send queued so far and
says, for each follower, why the first of its sends that failed did. After a failure
a lane sends nothing more until it is collected: what follows a step a follower did
not take would not continue its copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

Send = Callable[[], str | None]
"""One send to a follower: None once it acknowledged, else why it did not (one line)."""


class Lanes:
    """One sending thread per follower node."""

    def __init__(self, nodes: Iterable[str]) -> None:
        self._pools = {
            node: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ship-{node}")
            for node in nodes
        }
        self._queued: list[tuple[str, Future[str | None]]] = []
        # A lane's first failure since it was last collected; written only by that lane's
        # thread, read by the owner's once every send of the lane is done.
        self._failed: dict[str, str] = {}

    @property
    def busy(self) -> bool:
        """True while sends are queued that ``collect`` has not waited for."""
        return bool(self._queued)

    def send(self, node: str, send: Send) -> None:
        """Queue ``send`` on ``node``'s lane, after every send queued there before it."""
        self._queued.append((node, self._pools[node].submit(self._run, node, send)))

    def _run(self, node: str, send: Send) -> str | None:
        failed = self._failed.get(node)
        if failed is not None:
            return failed  # an earlier step was not taken: this one would not continue it
        try:
            why = send()
        except Exception as exc:  # noqa: BLE001 - never lost: the follower failed
            why = f"{node}: {type(exc).__name__}: {exc}"
        if why is not None:
            self._failed[node] = why
        return why

    def collect(self) -> dict[str, str | None]:
        """Wait for every queued send: each lane's node, None if all its sends were
        acknowledged, else why the first that failed did not."""
        queued, self._queued = self._queued, []
        results: dict[str, str | None] = {}
        for node, future in queued:
            why = future.result()
            if results.get(node) is None:
                results[node] = why
        for node in results:
            self._failed.pop(node, None)
        return results

    def close(self) -> None:
        """Wait for the sends in progress and stop every lane's thread."""
        for pool in self._pools.values():
            pool.shutdown(wait=True)
