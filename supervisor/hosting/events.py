"""State-change events: built once per move, written to the supervisor's log and streamed
to every ``loopd events`` follower.

A follower that does not keep up is dropped instead of having events buffered for it
without bound: one follower may leave at most ``FOLLOWER_BACKLOG`` bytes unread, all of
them together ``TOTAL_BACKLOG`` (past it the slowest go first), so the daemon's memory
never depends on its readers. A dropped follower is sent one last message saying why
(``{"dropped": why}``, after the events it has not read) and is cut off once it reads
nothing for ``DROP_GRACE`` seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Final, Protocol

from worker.ipc.wire import Message

FOLLOWER_BACKLOG: Final = 1 << 20
"""Bytes of events one follower may leave unread before it is dropped."""
TOTAL_BACKLOG: Final = 16 << 20
"""Bytes of events all followers together may leave unread; past it the slowest go."""
DROP_GRACE: Final = 5.0
"""Seconds a dropped follower may read nothing of what was sent to it before it is cut off."""


def _now() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z"


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One state change of one session."""

    session: str
    from_state: str
    to_state: str
    reason: str
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    time: str = field(default_factory=_now)
    app_changed: Message | None = None
    """A worker resumed the session mid-epoch under another App version (its state is the
    same before and after): ``{app, from, to, epoch, line}`` of the AppChanged it wrote."""

    def to_message(self) -> Message:
        message: Message = asdict(self)
        message["from"] = message.pop("from_state")
        message["to"] = message.pop("to_state")
        if message["app_changed"] is None:
            del message["app_changed"]  # every other event is as it always was
        return message

    def line(self) -> str:
        """One human line: ``time session FROM -> TO (reason) pid=N exit=N signal=N``."""
        parts = [self.time, self.session, f"{self.from_state} -> {self.to_state}"]
        if self.reason:
            parts.append(f"({self.reason})")
        for name, value in (("pid", self.pid), ("exit", self.exit_code), ("signal", self.signal)):
            if value is not None:
                parts.append(f"{name}={value}")
        return " ".join(parts)


def app_changed_event(session: str, state: str, changed: Message) -> Event:
    """The event of a worker that wrote AppChanged at its start (docs/format.md, "Apps")."""
    reason = (
        f"app {changed.get('app')} version {changed.get('from')} -> {changed.get('to')} "
        f"mid-epoch {changed.get('epoch')} (AppChanged at line {changed.get('line')})"
    )
    return Event(
        session=session, from_state=state, to_state=state, reason=reason, app_changed=changed
    )


def format_event(message: Message, *, as_json: bool) -> str:
    """A streamed event as ``loopd events`` prints it."""
    if as_json:
        return json.dumps(message, sort_keys=True)
    event = Event(
        session=str(message.get("session")), from_state=str(message.get("from")),
        to_state=str(message.get("to")), reason=str(message.get("reason") or ""),
        pid=_int_or_none(message.get("pid")), exit_code=_int_or_none(message.get("exit_code")),
        signal=_int_or_none(message.get("signal")), time=str(message.get("time")),
    )  # fmt: skip
    return event.line()


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Follower(Protocol):
    """Someone streaming events (a control connection)."""

    @property
    def backlog(self) -> int:
        """Bytes sent to it that it has not read yet."""
        ...

    def deliver(self, message: Message) -> bool:
        """Send one event; False if the connection is gone."""
        ...

    def send(self, message: Message) -> bool: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


class EventHub:
    """Publishes each event to the log and to every follower, within the backlog bounds."""

    def __init__(
        self,
        log: Callable[[str], None],
        call_later: Callable[[float, Callable[[], None]], object] | None = None,
    ) -> None:
        self.log = log
        self.call_later = call_later
        self.followers: set[Follower] = set()
        self.published = 0
        self.dropped = 0

    def publish(self, event: Event) -> None:
        self.published += 1
        self.log(f"event: {event.line()}")
        message = event.to_message()
        total = 0
        for follower in list(self.followers):
            backlog = follower.backlog
            if backlog > FOLLOWER_BACKLOG:
                self.drop(follower, f"{backlog} bytes of events unread, over the "
                          f"{FOLLOWER_BACKLOG}-byte limit of one follower")  # fmt: skip
            elif not follower.deliver(message):
                self.followers.discard(follower)
            else:
                total += follower.backlog
        while total > TOTAL_BACKLOG and self.followers:
            slowest = max(self.followers, key=lambda f: f.backlog)
            total -= slowest.backlog
            self.drop(slowest, f"the slowest of {len(self.followers)} followers, whose unread "
                      f"events passed {TOTAL_BACKLOG} bytes together")  # fmt: skip

    def drop(self, follower: Follower, why: str) -> None:
        """Stop streaming to ``follower``: tell it why and close; cut it off if it reads
        nothing more for ``DROP_GRACE`` seconds."""
        self.followers.discard(follower)
        self.dropped += 1
        self.log(f"events follower dropped: {why}")
        follower.send({"dropped": f"the supervisor stopped streaming events to you: {why}"})
        follower.close()
        self._cut_if_stuck(follower, None)

    def _cut_if_stuck(self, follower: Follower, before: int | None) -> None:
        unread = follower.backlog  # 0 once its connection is gone
        if not unread:
            return
        if self.call_later is None or (before is not None and unread >= before):
            follower.abort()  # read nothing since the last look: it is not reading
            return
        self.call_later(DROP_GRACE, lambda: self._cut_if_stuck(follower, unread))
