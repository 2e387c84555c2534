"""Which live sessions to hibernate: idle past ``--idle-stop``, or least recently used past
``--max-live``.

Sessions are kept in one ordered map, least recently used first, so a use is O(1) and
finding who is idle or who must make room reads only the front of it: with ten thousand
sessions the daemon needs one timer, for the oldest, not one per session.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class UsageClock:
    """When each live session was last used, in order of use."""

    def __init__(self, *, idle_stop: float | None, max_live: int | None) -> None:
        self.idle_stop = idle_stop
        self.max_live = max_live
        self._last: OrderedDict[str, float] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.idle_stop is not None or self.max_live is not None

    def __len__(self) -> int:
        return len(self._last)

    def __contains__(self, session: object) -> bool:
        return session in self._last

    def used(self, session: str, now: float) -> None:
        """The session served something (or its worker started): it is the newest."""
        self._last[session] = now
        self._last.move_to_end(session)

    def forget(self, session: str) -> None:
        """The session's worker is gone (stopped, crashed, hibernated)."""
        self._last.pop(session, None)

    def last_used(self, session: str) -> float | None:
        return self._last.get(session)

    def idle(self, now: float) -> list[str]:
        """Sessions unused for ``idle_stop`` seconds, oldest first."""
        if self.idle_stop is None:
            return []
        found = []
        for session, last in self._last.items():
            if now - last < self.idle_stop:
                break  # the rest were used later still
            found.append(session)
        return found

    def next_idle_check(self) -> float | None:
        """When the least recently used session becomes idle (None: nothing to watch)."""
        if self.idle_stop is None or not self._last:
            return None
        return next(iter(self._last.values())) + self.idle_stop

    def over_cap(self, busy: Callable[[str], bool], room_for: int = 0) -> list[str]:
        """Least recently used sessions to stop so that at most ``max_live - room_for`` stay;
        sessions for which ``busy`` is true (a request waiting on them) are passed over."""
        if self.max_live is None:
            return []
        excess = len(self._last) + room_for - self.max_live
        found: list[str] = []
        for session in self._last:
            if len(found) >= excess:
                break
            if not busy(session):
                found.append(session)
        return found
