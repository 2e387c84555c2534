"""Choosing whom to hibernate: idle past the limit, or the least recently used past the cap."""

from __future__ import annotations

import pytest

from supervisor.errors import IllegalTransition
from supervisor.hosting.hibernation import UsageClock
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
