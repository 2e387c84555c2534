"""Events: one line each, as text or JSON, and a follower that cannot keep up is dropped."""

from __future__ import annotations

import json

from supervisor.hosting.events import Event, EventHub, format_event
from worker.ipc.wire import Message


class Collecting:
    def __init__(self, room: int) -> None:
        self.room = room
        self.got: list[Message] = []
        self.backlog = 0

    def deliver(self, message: Message) -> bool:
        if len(self.got) >= self.room:
            return False
        self.got.append(message)
        return True

    def send(self, message: Message) -> bool:
        return True

    def close(self) -> None:
        """Nothing to close."""

    def abort(self) -> None:
        """Nothing to abort."""


def test_an_event_reaches_the_log_and_every_follower_until_one_falls_behind() -> None:
    logged: list[str] = []
    hub = EventHub(logged.append)
    roomy, slow = Collecting(10), Collecting(1)
    hub.followers.update((roomy, slow))
    for n in range(3):
        hub.publish(Event(session="s1", from_state="RUNNING", to_state="BACKOFF",
                          reason="crashed", pid=100 + n, signal=9))  # fmt: skip
    assert len(roomy.got) == 3
    assert len(slow.got) == 1
    assert list(hub.followers) == [roomy]
    assert logged[0].startswith("event: ")
    assert "s1 RUNNING -> BACKOFF (crashed) pid=100 signal=9" in logged[0]


def test_an_event_prints_as_one_line_of_text_or_of_json() -> None:
    event = Event(session="s1", from_state="STOPPING", to_state="IDLE", reason="idle 30 s",
                  pid=7, exit_code=0, time="2026-11-30T10:00:00.000000Z")  # fmt: skip
    message = event.to_message()
    assert format_event(message, as_json=False) == (
        "2026-11-30T10:00:00.000000Z s1 STOPPING -> IDLE (idle 30 s) pid=7 exit=0"
    )
    decoded = json.loads(format_event(message, as_json=True))
    assert decoded["from"] == "STOPPING"
    assert decoded["to"] == "IDLE"
    assert decoded["signal"] is None
