"""Mutants of streaming: partials that reach another request, or come out of order."""

from __future__ import annotations

from worker.ipc.wire import Message


def partial_to_first_request() -> None:
    from worker.loop import turns  # noqa: PLC0415 - only worker-level children load it

    original = turns.TurnRunner.stream

    def stream(self: turns.TurnRunner, text: str, request: Message | None) -> None:
        # The bug: the runner's current target, set to the chunk's first request, is
        # preferred to the request the App named.
        if request is not None and id(request) in self._targets:
            saved, self._current = self._current, next(iter(self._targets.values()))
            try:
                original(self, text, None)
            finally:
                self._current = saved
            return
        original(self, text, request)

    turns.TurnRunner.stream = stream  # type: ignore[method-assign]


def partials_sent_newest_first() -> None:
    from worker.loop import turns  # noqa: PLC0415 - only worker-level children load it

    original_stream = turns.TurnRunner.stream
    original_end = turns.TurnRunner._end
    held: list[tuple[str, Message | None]] = []

    def stream(self: turns.TurnRunner, text: str, request: Message | None) -> None:
        held.append((text, request))  # coalesced, to be written when the turn ends

    def end(self: turns.TurnRunner) -> None:
        while held:
            # The bug: the held partials are taken from a stack where a queue was meant.
            text, request = held.pop()
            original_stream(self, text, request)
        original_end(self)

    turns.TurnRunner.stream = stream  # type: ignore[method-assign]
    turns.TurnRunner._end = end  # type: ignore[method-assign]
