"""Choosing whom to hibernate: idle past the limit, or the least recently used past the cap."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import cast

import pytest

from supervisor.errors import IllegalTransition
from supervisor.hosting.hibernation import Hibernation, UsageClock
from supervisor.hosting.session_actions import Hosted
from supervisor.states import State, StateMachine


def test_sessions_unused_for_the_idle_limit_are_found_oldest_first() -> None:
    clock = UsageClock(idle_stop=10.0, max_live=None)
    clock.used("a", 0.0)
    clock.used("b", 5.0)
    clock.used("c", 8.0)
    clock.used("a", 9.0)  # a use moves a session to the back
    assert clock.next_idle_check() == 15.0
    assert clock.idle(16.0) == ["b"]
    assert clock.idle(19.0) == ["b", "c", "a"]
    clock.forget("b")
    assert clock.next_idle_check() == 18.0


def test_past_the_cap_the_least_recently_used_idle_sessions_make_room() -> None:
    clock = UsageClock(idle_stop=None, max_live=2)
    for n, session in enumerate(["a", "b", "c"]):
        clock.used(session, float(n))
    assert clock.over_cap(busy=lambda s: False) == ["a"]
    assert clock.over_cap(busy=lambda s: s == "a") == ["b"]  # a request waits on a
    assert clock.over_cap(busy=lambda s: False, room_for=1) == ["a", "b"]
    assert clock.idle(100.0) == []  # no idle limit set


def test_with_neither_limit_nothing_is_ever_hibernated() -> None:
    clock = UsageClock(idle_stop=None, max_live=None)
    clock.used("a", 0.0)
    assert not clock.enabled
    assert clock.over_cap(busy=lambda s: False) == []
    assert clock.next_idle_check() is None


def test_a_session_hibernates_through_stopping_and_wakes_only_by_starting() -> None:
    moves: list[tuple[State, State]] = []
    machine = StateMachine("s1", State.RUNNING, observer=lambda a, b: moves.append((a, b)))
    machine.move(State.STOPPING)
    machine.move(State.IDLE)
    with pytest.raises(IllegalTransition, match="no move from IDLE to RUNNING"):
        machine.move(State.RUNNING)
    machine.move(State.STARTING)
    assert moves == [
        (State.RUNNING, State.STOPPING), (State.STOPPING, State.IDLE),
        (State.IDLE, State.STARTING),
    ]  # fmt: skip


class _Worker:
    """A worker between batches, its last one ended at ``ended`` (its heartbeat cell's)."""

    pid = 1

    def __init__(self, ended: float | None) -> None:
        self.ended = ended

    def rss_bytes(self) -> int | None:
        return None

    def kill(self) -> bool:
        return False

    def in_request(self) -> bool:
        return False

    def last_batch_ended(self) -> float | None:
        return self.ended


@dataclass
class _Hosted:
    id: str
    worker: _Worker
    state: State = State.RUNNING
    hibernating: bool = False
    in_flight: tuple[()] = ()
    queued: tuple[()] = ()
    ready_waiters: tuple[()] = ()


@pytest.mark.parametrize(("ended_ago", "hibernated"), [(0.5, False), (10.0, True), (None, True)])
def test_the_idle_check_counts_from_the_end_of_the_last_batch(
    ended_ago: float | None, hibernated: bool
) -> None:
    """A session seen busy at one idle check whose batch ended just before the next, its
    worker's report of it not in yet, is not idle yet: not stopped the moment its
    long request was answered (a 6 s request under a 3 s limit was, now and then)."""
    now = time.monotonic()
    ended = None if ended_ago is None else now - ended_ago
    hosted = _Hosted("s", _Worker(ended))
    stopped: list[str] = []
    loop = asyncio.new_event_loop()
    try:
        sessions = cast("dict[str, Hosted]", {"s": hosted})  # the part the idle check reads
        hibernation = Hibernation(loop, sessions, lambda s, _why: stopped.append(s),
                                  idle_stop=3.0, max_live=None)  # fmt: skip
        hibernation.clock.used("s", now - 6.0)  # last seen in use 6 s ago (busy then)
        hibernation._idle_check()
        assert stopped == (["s"] if hibernated else [])
        if not hibernated:
            assert ended is not None
            due = hibernation.clock.next_idle_check()
            assert due is not None
            assert due >= ended + 3.0  # looked at again no sooner than a period after it
        hibernation.close()
    finally:
        loop.close()
