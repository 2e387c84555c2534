"""Mutants of the bugs the rig once missed: a retry's age, call numbers across a commit,
the cluster lease, an answer that lies, and a hostile disk (docs/chaos.md)."""

from __future__ import annotations

import bisect
import os

from worker.ipc.wire import Message
from worker.store import key_index, session
from worker.store.disk import durable
from worker.store.errors import SessionError


def key_index_search_off_by_one() -> None:
    def find(
        self: key_index.KeyIndex, key: str, confirm: key_index.Confirm
    ) -> tuple[int, int] | None:
        if not self.segments:
            return None
        wanted = key_index.key_hash(key)
        for segment in reversed(self.segments):
            hashes = segment.hashes
            at = bisect.bisect_right(hashes, wanted)  # the bug: _left finds the first equal
            while at < len(hashes) and hashes[at] == wanted:
                place = segment.places[at]
                epoch, line = place >> 32, place & 0xFFFFFFFF
                if confirm(epoch, line):
                    return epoch, line
                at += 1
        return None

    key_index.KeyIndex.find = find  # type: ignore[method-assign]


def commit_resets_call_counter() -> None:
    original = session.Session.commit_epoch

    def commit_epoch(self: session.Session, summary: str, baseline: object) -> None:
        original(self, summary, baseline)  # type: ignore[arg-type]
        # The bug: the live counter restarts from the carried number, which leaves out the
        # numbers handed out for tool calls still in progress.
        self._next_call = self._state.next_call

    session.Session.commit_epoch = commit_epoch  # type: ignore[method-assign]


def lease_read_before_write_only() -> None:
    from worker.loop import server  # noqa: PLC0415 - only worker-level children load it

    def lease_lost(self: server.Server) -> None:
        return None  # the bug: the lease is not read again after the group commit

    server.Server._lease_lost = lease_lost  # type: ignore[method-assign]


def commit_failure_fails_request() -> None:
    from worker import app  # noqa: PLC0415 - only worker-level children load it

    original = app.DefaultApp._apply_many

    def apply_many(
        self: app.DefaultApp, session: session.Session, requests: list[Message]
    ) -> list[Message | SessionError]:
        results = original(self, session, requests)
        # The bug: a request whose epoch commit failed is answered as failed, though it
        # is on disk (the commit is retried later; the request stays applied).
        return [
            SessionError(str(r["commit_error"])) if isinstance(r, dict) and "commit_error" in r
            else r
            for r in results
        ]  # fmt: skip

    app.DefaultApp._apply_many = apply_many  # type: ignore[method-assign]


def create_follows_links() -> None:
    # The bug: O_NOFOLLOW dropped from the flags a temporary file is created with.
    durable._CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC  # type: ignore[misc]
