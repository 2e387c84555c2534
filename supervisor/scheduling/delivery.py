"""How a session's due schedules are delivered: the request that asks its worker to apply
them, and what its answer says of the next delivery (the daemon's and the rig's).

The daemon never sends a schedule's text: it sends ``DELIVER_DUE`` to the session (which
wakes it), and the worker applies every pending schedule whose time has come, each as
an ordinary request with the schedule's key, in one chunk. A retry is the same request
again: a key already applied is a duplicate, never applied twice, and a schedule not
yet due is never applied (docs/operations.md, "Scheduled requests").
"""

from __future__ import annotations

from typing import Final

from worker.ipc.wire import Message
from worker.store.schedules import parse_time

DELIVER_DUE: Final[Message] = {"deliver_due": True}
RETRY_FIRST: Final = 0.25
"""Seconds before the first retry of a delivery that failed (a worker that died, ...)."""
RETRY_MOST: Final = 5.0
"""The longest pause between two retries (doubled from ``RETRY_FIRST``)."""


def next_after(answer: Message) -> float | None:
    """The next due time (seconds since the epoch) a delivery's answer names, or None."""
    when = answer.get("next")
    return parse_time(when) if isinstance(when, str) else None


def failed_keys(answer: Message) -> list[str]:
    """The due schedules the worker tried and did not apply (each stays pending)."""
    failed = answer.get("failed")
    return [str(key) for key in failed] if isinstance(failed, dict) else []
