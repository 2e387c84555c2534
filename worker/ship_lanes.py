"""Each follower's lane: an owner's sends to one follower in log order, by the worker's thread.

A replicated owner hands a group to its followers as soon as the group is written,
while its own fdatasync is still to come (``Session.on_written``), and what it could not
hand over (an epoch commit's new files) once it is synced. The worker's thread puts
each step on every follower's connection itself (``PipelinedChannel.send``: a TLS write
that waits for no answer), so the followers write and fdatasync their copies while the
owner syncs its own; ``collect``, after the owner's fdatasync, reads every answer
(``acknowledged``) and says, for each follower, why the first of its sends that failed
did. Each answer is due ``timeout`` seconds after the later of its step's send and
the start of ``collect``: a follower that falls further behind than that is dropped,
so no write waits much past ``timeout`` for its followers, however many steps it has
(a follower slow at every step but never silent for ``timeout`` once held writes for
four times as long when each answer was due ``timeout`` after the one before it).
Past its deadline an answer that has arrived is still read, so a follower that does
not answer fails alone.

Before, each follower had a sending thread: a step reached it only once that thread
was scheduled and held the interpreter's lock, which the worker's thread gave up only
when it blocked, and the worker's thread woke from its wait for the answers only once
the lane's thread let go again (docs/benchmarks.md, "The owner's thread sends").

After a failure a lane sends nothing more until it is collected: what follows a step a
follower did not take would not continue its copy. A channel that cannot send without
waiting (a ``FollowerChannel`` with ``ship`` only) is shipped to in full at ``send``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Mapping
from typing import Final, Protocol, runtime_checkable

from worker.catch_up import FollowerChannel, ShipFailed
from worker.store.replica_types import Position, Step

ANSWER_TIMEOUT: Final = 5.0
"""Seconds ``collect`` waits for the followers' answers (one deadline for all)."""
WINDOW: Final = 32
"""Steps sent to one follower and not yet answered, at most: past it ``send`` reads an
answer first (the follower's answers then never fill its socket while it waits)."""


@runtime_checkable
class PipelinedChannel(Protocol):
    """A follower's connection that can send a step now and read its answer later."""

    def send(self, step: Step) -> None:
        """Put ``step`` on the wire; ShipFailed if it could not be sent."""
        ...

    def acknowledged(self, deadline: float) -> Position:
        """The copy's position in the answer to the oldest step sent and not answered."""
        ...

    def close(self) -> None: ...


class Lanes:
    """The sends to each follower since the last ``collect``, and their answers."""

    def __init__(
        self, channels: Mapping[str, FollowerChannel], *, timeout: float = ANSWER_TIMEOUT
    ) -> None:
        self._channels = channels
        self._pipelined = {
            node: channel
            for node, channel in channels.items()
            if isinstance(channel, PipelinedChannel)  # once: a Protocol's check is slow
        }
        self._timeout = timeout
        # Each lane's steps sent and not answered: where each one ends, and when it was sent.
        self._unanswered: dict[str, collections.deque[tuple[Position, float]]] = {}
        self._failed: dict[str, str] = {}  # a lane's first failure since its last collect

    def send(self, node: str, pieces: Iterable[Step]) -> None:
        """Send ``pieces`` to ``node`` after everything sent to it before; a failure is
        kept for ``collect`` (nothing is raised: this runs inside the store's write)."""
        unanswered = self._unanswered.setdefault(node, collections.deque())
        if node in self._failed:
            return  # an earlier step was not taken: this one would not continue it
        pipelined = self._pipelined.get(node)
        try:
            for piece in pieces:
                if pipelined is None:
                    _check(node, self._channels[node].ship(piece), piece.end)
                    continue
                while len(unanswered) >= WINDOW:
                    self._take(node, pipelined, unanswered, 0.0)
                pipelined.send(piece)
                unanswered.append((piece.end, time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - never lost: the follower failed
            self._fail(node, exc)

    def collect(self) -> dict[str, str | None]:
        """Wait for the answers to every step sent: each lane's node, None if all its
        steps were acknowledged, else why the first that failed was not."""
        began = time.monotonic()
        results: dict[str, str | None] = {}
        lanes, self._unanswered = self._unanswered, {}
        for node, unanswered in sorted(lanes.items()):
            try:
                while unanswered and node not in self._failed:
                    self._take(node, self._pipelined[node], unanswered, began)
            except Exception as exc:  # noqa: BLE001 - never lost: the follower failed
                self._fail(node, exc)
            results[node] = self._failed.pop(node, None)
        return results

    def close(self) -> None:
        """Forget what was not collected (a worker ending: nothing of it is acknowledged);
        a connection with answers still to come is closed."""
        for node, unanswered in self._unanswered.items():
            if unanswered and node in self._pipelined:
                self._pipelined[node].close()
        self._unanswered.clear()
        self._failed.clear()

    def _take(
        self,
        node: str,
        channel: PipelinedChannel,
        unanswered: collections.deque[tuple[Position, float]],
        began: float,
    ) -> None:
        """Read the oldest step's answer, due ``timeout`` after the later of its send
        and ``began`` (the start of ``collect``)."""
        end, sent = unanswered.popleft()
        _check(node, channel.acknowledged(max(sent, began) + self._timeout), end)

    def _fail(self, node: str, exc: Exception) -> None:
        why = str(exc) if isinstance(exc, ShipFailed) else f"{node}: {type(exc).__name__}: {exc}"
        self._failed.setdefault(node, why)
        channel = self._channels[node]
        if isinstance(channel, PipelinedChannel):
            channel.close()  # its answers still to come would line up with nothing


def _check(node: str, at: Position, expected: Position) -> None:
    if at != expected:
        raise ShipFailed(f"its copy is at {at}, the owner's at {expected}")
