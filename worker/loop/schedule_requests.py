"""The schedule operations a chunk of requests may hold, done before its App requests.

Three kinds of request payload are the worker's own, never handed to the App as such
(docs/operations.md, "Scheduled requests"):

- ``{"key": K, "schedule": {"at", "text", "untrusted"}}`` writes ``Schedule{K}``, or is
  answered as a duplicate if K is pending; refused if a request with K was applied;
- ``{"unschedule": K}`` writes ``Unschedule{K}`` if K is pending (cancelled);
- ``{"deliver_due": true}`` (the supervisor's) becomes one request per due schedule (at
  most a chunk's worth), each with the schedule's key, text and untrusted flag, applied
  by the App in this chunk; its answer lists the keys delivered and what is pending now.

A request whose key names a pending schedule not yet due is refused (``NotDue``).
"""

from __future__ import annotations

import time
from typing import Generic, TypeVar

from worker.ipc.wire import Message, WireError, field, optional_field
from worker.loop.schedule_book import (
    ScheduleBook,
    ScheduleRefused,
    check_key,
    delivery,
    normalize_at,
)
from worker.store.errors import SessionError
from worker.store.format.records import Schedule, Unschedule

T = TypeVar("T")
Result = Message | SessionError | WireError


class ScheduledChunk(Generic[T]):
    """A chunk with its schedule operations done and its deliveries expanded."""

    def __init__(
        self, book: ScheduleBook, chunk: list[tuple[T, Message]], *, most: int = 64
    ) -> None:
        self.book = book
        self.items: list[tuple[T, Message]] = []  # what the App applies, in order
        self.decided: dict[int, Result] = {}  # item index -> its result, found here
        self._chunk = chunk
        self._spans: list[tuple[int, int]] = []  # per entry: its first item and how many
        for target, payload in chunk:
            if payload.get("deliver_due") is True:
                start = len(self.items)
                # At most a chunk's worth: the answer's "next" is then already due, and
                # the daemon asks again at once (the App's deadline and the heartbeat
                # see chunks of the usual size).
                due = book.due(time.time())[: max(1, most)]
                self.items += [(target, delivery(s)) for s in due]
                self._spans.append((start, len(self.items) - start))
                continue
            self._spans.append((len(self.items), 1))
            index = len(self.items)
            self.items.append((target, payload))
            decided = self._decide(payload)
            if decided is not None:
                self.decided[index] = decided

    def results(self, item_results: list[Result]) -> list[Result]:
        """One result per entry of the chunk, a delivery's folded into one answer."""
        out: list[Result] = []
        for (_target, payload), (start, count) in zip(self._chunk, self._spans, strict=True):
            if payload.get("deliver_due") is not True:
                out.append(item_results[start])
                continue
            delivered: list[str] = []
            failed: dict[str, str] = {}
            for (_t, item), result in zip(
                self.items[start : start + count], item_results[start : start + count], strict=True
            ):
                if isinstance(result, dict):
                    delivered.append(str(item["key"]))
                else:
                    failed[str(item["key"])] = str(result)
            count_now, next_due = self.book.summary()
            out.append({
                "delivered": delivered, "failed": failed,
                "pending": count_now, "next": next_due,
            })  # fmt: skip
        return out

    def _decide(self, payload: Message) -> Result | None:
        try:
            if "schedule" in payload:
                return self._schedule(payload)
            if "unschedule" in payload:
                return self._unschedule(payload)
        except WireError as exc:
            return exc
        except SessionError as exc:
            return exc
        return self.book.refusal(payload.get("key"))

    def _schedule(self, payload: Message) -> Result:
        try:
            key = check_key(payload.get("key"))
            spec = field(payload, "schedule", dict)
            at = normalize_at(field(spec, "at", str))
            text = field(spec, "text", str)
            untrusted = bool(optional_field(spec, "untrusted", bool))
        except (TypeError, ValueError) as exc:
            raise WireError(str(exc)) from exc
        pending = self.book.pending().get(key)
        if pending is not None:
            return {"duplicate": True, "key": key, "at": pending.at}
        delivered = self.book.delivered_at(key)
        if delivered is not None:  # a retry whose answer was lost: written, then delivered
            return {"duplicate": True, "key": key, "at": delivered, "delivered": True}
        # Written as the chunk is built, before its requests: one of its key would take it.
        if any(p.get("key") == key and "schedule" not in p for _t, p in self._chunk):
            raise ScheduleRefused(key, "a request of this batch has this key; pick a new key")
        if self.book.session.find_key(key) is not None:
            raise ScheduleRefused(
                key, "a request with this key was already applied; pick a new key"
            )
        self.book.session.append_many([Schedule(key=key, at=at, text=text, untrusted=untrusted)])
        return {"duplicate": False, "key": key, "at": at}

    def _unschedule(self, payload: Message) -> Result:
        try:
            key = check_key(payload.get("unschedule"))
        except ValueError as exc:
            raise WireError(str(exc)) from exc
        if key in self.book.pending():
            self.book.session.append_many([Unschedule(key=key)])
            return {"cancelled": True, "key": key}
        why = "already delivered" if self.book.session.find_key(key) is not None else "not pending"
        return {"cancelled": False, "key": key, "why": why}
