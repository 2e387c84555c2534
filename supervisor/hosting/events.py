"""State-change events: built once per move, written to the supervisor's log and streamed
to every ``loopd events`` follower.

A follower that does not keep up is dropped (its ``deliver`` says so) instead of having
events buffered for it without bound: the daemon's memory never depends on a reader.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from worker.wire import Message


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

    def to_message(self) -> Message:
        message: Message = asdict(self)
        message["from"] = message.pop("from_state")
        message["to"] = message.pop("to_state")
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
    """Someone streaming events; ``deliver`` returns False when it cannot keep up."""

    def deliver(self, message: Message) -> bool: ...


class EventHub:
    """Publishes each event to the log and to every follower."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.followers: set[Follower] = set()
        self.published = 0

    def publish(self, event: Event) -> None:
        self.published += 1
        self.log(f"event: {event.line()}")
        message = event.to_message()
        for follower in list(self.followers):
            if not follower.deliver(message):
                self.followers.discard(follower)
