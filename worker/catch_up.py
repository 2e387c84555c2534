"""Catching a follower up from its last valid line, a slice at a time (docs/scaling.md 9.2).

A follower out of sync (a new copy added by a move, one back after a fault) is sent
what the owner's log holds after the copy's position: the steps are read once, cut into
pieces of at most ``MAX_STEP`` bytes, and shipped in order. Between batches the worker
ships them for at most ``budget`` seconds a call, so a session of any size is caught up
while it keeps taking writes (and its worker keeps its heartbeat): nothing it writes
meanwhile goes to that follower, and once the pieces are shipped the copy's position is
compared with the owner's; what was written since is read and sent the same way, until
the copy ends where the owner's log ends (then ``Shipper.rejoin`` adds it back).
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Final, Protocol

from worker.store.replica_roles import shared_prefix
from worker.store.replica_source import split_step, steps_after
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


@dataclass(slots=True)
class _Pending:
    pieces: collections.deque[Step]
    at: Position | None  # the copy's position after the last piece it acknowledged


class CatchUps:
    """The catch-ups in progress of one owner session's followers."""

    def __init__(
        self, home: str, session_id: str, token: int, max_step: int, lost: list[tuple[str, str]]
    ) -> None:
        self._home = home
        self._session = session_id
        self._token = token
        self._max_step = max_step
        self._lost = lost  # the shipper's: a copy cut back is reported there
        self._pending: dict[str, _Pending] = {}

    def under_way(self, node: str) -> bool:
        """True while pieces read for ``node`` are left to ship."""
        pending = self._pending.get(node)
        return pending is not None and bool(pending.pieces)

    def copy_at(self, node: str) -> Position | None:
        """Where ``node``'s copy ended at its last acknowledged piece (None: not known)."""
        pending = self._pending.get(node)
        return None if pending is None else pending.at

    def forget(self, node: str) -> None:
        self._pending.pop(node, None)

    def run(self, channel: FollowerChannel, budget: float | None) -> Position | None:
        """Ship the next pieces to ``channel``'s follower, for at most ``budget`` seconds
        (None: all of them); the copy's position once every piece read is shipped, None
        while some are left. A failure (ShipFailed, SessionError) forgets the catch-up:
        the next call starts again from the copy's position."""
        node = channel.node
        deadline = None if budget is None else time.monotonic() + budget
        try:
            pending = self._pending.get(node)
            if pending is None or not pending.pieces:
                pending = self._pending[node] = self._read(channel)
            while pending.pieces:
                pending.at = channel.ship(pending.pieces[0])
                pending.pieces.popleft()
                if pending.pieces and deadline is not None and time.monotonic() >= deadline:
                    return None
        except BaseException:
            self._pending.pop(node, None)
            raise
        return pending.at

    def _read(self, channel: FollowerChannel) -> _Pending:
        """The pieces after the copy's position (cut back first if it diverged)."""
        position = channel.position(self._session)
        try:
            steps = steps_after(self._home, self._session, position, self._token)
        except NotContinuing:
            assert position is not None  # a copy without a position continues nothing
            position = self._rewind(channel, position)
            steps = steps_after(self._home, self._session, position, self._token)
        pieces = [piece for step in steps for piece in split_step(step, self._max_step)]
        return _Pending(collections.deque(pieces), position)

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
