"""Catching a follower up from its last valid line (docs/scaling.md 9.2).

A follower out of sync (a new copy added by a move, one back after a fault) states its
position; the owner checks that its own log begins with the copy's bytes (reading it in
chunks), cuts the copy back to the prefix they share if not, and then ships what follows,
reading one step at a time from a cursor (the copy's position): the whole groups after
it, about ``MAX_STEP`` bytes each, then each later epoch's first files. Nothing of the
log is held between steps, so memory stays bounded whatever the session's size.

The worker runs this off its own thread (``Shipper.rejoin_answering``: one task per
follower), so the session takes writes meanwhile and a follower that stops answering
holds up no batch; nothing it writes then goes to that follower. Once a task has shipped
everything whole, the worker, between two batches, ships the few steps written since
(for at most ``budget`` seconds) and, if the copy then ends where its log ends, adds
the follower back (``Shipper.rejoin``); otherwise another task goes on from there.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Final, Protocol

from worker.store.replica_roles import shared_prefix
from worker.store.replica_source import next_step, verify_prefix
from worker.store.replica_types import NotContinuing, Position, Step

CATCH_UP_SLICE: Final = 0.2
"""Seconds of catch-up shipping in one call between batches (at least one piece)."""


class FollowerChannel(Protocol):
    """A connection to one follower node, speaking the ``replicate`` protocol."""

    @property
    def node(self) -> str: ...

    def ship(self, step: Step) -> Position:
        """Send one step; the copy's position once it is durable, or ShipFailed."""
        ...

    def position(self, session: str) -> Position | None:
        """Where the follower's copy ends (None: it has none), or ShipFailed."""
        ...

    def line_ends(self, session: str, epoch: int) -> tuple[int, list[list[int]]]:
        """The copy's ``[size, crc]`` line ends in ``epoch`` (or its newest below), or
        ShipFailed."""
        ...

    def rewind(self, session: str, keep: Position, token: int) -> Position:
        """Cut the copy back to ``keep`` (its suffix to quarantine); its position."""
        ...


class ShipFailed(Exception):
    """A follower did not acknowledge a step (unreachable, refused it, timed out)."""


@dataclass(slots=True)
class _Cursor:
    at: Position | None  # where the copy ends: the end of the last step it acknowledged


class CatchUps:
    """The catch-ups in progress of one owner session's followers: for each, where its
    copy ends (a cursor into this log; nothing of the log is held between calls)."""

    def __init__(
        self,
        home: str,
        session_id: str,
        token: int,
        max_step: int,
        lost: collections.deque[tuple[str, str]],
    ) -> None:
        self._home = home
        self._session = session_id
        self._token = token
        self._max_step = max_step
        self._lost = lost  # the shipper's: a copy cut back is reported there
        self._cursors: dict[str, _Cursor] = {}
        self.progressed = False  # a step acknowledged since the worker last looked

    def under_way(self, node: str) -> bool:
        """True while ``node`` is being caught up (its copy's position known here)."""
        return node in self._cursors

    def copy_at(self, node: str) -> Position | None:
        """Where ``node``'s copy ended at its last acknowledged step (None: not known)."""
        cursor = self._cursors.get(node)
        return None if cursor is None else cursor.at

    def forget(self, node: str) -> None:
        self._cursors.pop(node, None)

    def run(self, channel: FollowerChannel, budget: float | None) -> Position | None:
        """Ship the steps that follow ``channel``'s copy, read one at a time, until none
        is left whole (then the copy's position) or ``budget`` seconds have passed (then
        None; None: no limit). A failure (ShipFailed, SessionError) forgets the cursor:
        the next call starts again from the position the follower states."""
        node = channel.node
        deadline = None if budget is None else time.monotonic() + budget
        try:
            cursor = self._cursors.get(node)
            if cursor is None:
                cursor = self._cursors[node] = _Cursor(self._start(channel))
            shipped = False
            while (step := next_step(self._home, self._session, cursor.at, self._token,
                                     self._max_step)) is not None:  # fmt: skip
                if shipped and deadline is not None and time.monotonic() >= deadline:
                    return None  # at least one step a call, and the rest at the next
                at = channel.ship(step)
                if at != step.end:
                    raise ShipFailed(f"{node}: its copy is at {at} after a step ending at "
                                     f"{step.end}")  # fmt: skip
                cursor.at, shipped, self.progressed = at, True, True
        except BaseException:
            self._cursors.pop(node, None)
            raise
        return cursor.at

    def _start(self, channel: FollowerChannel) -> Position | None:
        """The copy's position, checked to continue this log (cut back first if not)."""
        position = channel.position(self._session)
        if position is None:
            return None
        try:
            verify_prefix(self._home, self._session, position)
        except NotContinuing:
            position = self._rewind(channel, position)
            verify_prefix(self._home, self._session, position)
        return position

    def _rewind(self, channel: FollowerChannel, position: Position) -> Position:
        """The follower's copy diverged (it holds what this log does not: groups its old
        owner wrote and never had acknowledged): cut it back to the prefix they share."""
        keep = _shared(self._home, self._session, channel, position)
        at = channel.rewind(self._session, keep, self._token)
        self._lost.append((channel.node, f"its copy was cut back from {position} to {at}"))
        return at


def _shared(home: str, session: str, channel: FollowerChannel, at: Position) -> Position:
    """The longest prefix the follower's copy shares with this log (epochs from ``at``'s
    down); NotContinuing if they share not even a first line."""
    for epoch in range(at.epoch, -1, -1):
        found, ends = channel.line_ends(session, epoch)
        keep = shared_prefix(home, session, found, ends)
        if keep is not None:
            return keep
    raise NotContinuing(session, f"{channel.node}'s copy shares no line with this log")
