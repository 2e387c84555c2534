"""A worked example of a user's App: a notebook session that keeps every note it is given.

Run the crash rig through it::

    loopd chaos run --app examples.notes_app:NotesApp
    pytest --loopd-chaos=examples.notes_app:NotesApp -n auto

Each request ``{"text": ..., "key": ...}`` adds a note: a ``User`` record
with the request's key and an ``Assistant`` record that numbers it, in one group commit.
An epoch closes once it holds enough notes for the context budget, and the next epoch's
baseline carries the summary as its memory.
"""

from __future__ import annotations

from typing import Final

from worker.app import (
    Assistant,
    Baseline,
    Message,
    Session,
    SessionError,
    User,
    field,
    optional_field,
)

TOKENS_PER_NOTE: Final = 20  # a fixed, deterministic stand-in for a tokenizer


class NotesApp:
    """Keeps notes; answers a retried key from the log; closes an epoch on a full context."""

    def __init__(self, budget: int) -> None:
        self.budget = budget

    def initial_baseline(self, session_id: str) -> Baseline:
        return Baseline(system=f"the notebook {session_id}", memory="", tools=[])

    def next_baseline(self, session: Session, summary: str) -> Baseline:
        # Only the session's own state and the summary: a resumed worker, which calls
        # this again for the same epoch change, must get the same baseline.
        return Baseline(system=session.baseline.system, memory=summary, tools=[])

    def summarize(self, session: Session) -> str:
        notes = [r.text for r in session.records if isinstance(r, User)]
        return f"epoch {session.epoch}: {len(notes)} notes; " + "; ".join(n[:16] for n in notes)

    def handle(self, session: Session, request: Message) -> Message:
        key = optional_field(request, "key", str)
        if key is not None:
            # A retry of a request that reached the log, in any epoch, is answered from
            # the log.
            ref = session.find_key(key)
            if ref is not None:
                return {"duplicate": True, "key": key, "epoch": ref.epoch, "line": ref.line}
        return self.add_note(session, field(request, "text", str), key)

    def add_note(self, session: Session, text: str, key: str | None) -> Message:
        """Add the note: one group commit; close the epoch once the notes fill the budget."""
        number = self.notes(session) + 1
        # One group commit: a crash leaves the note and its answer, or neither.
        session.append_many([User(text=text, key=key), Assistant(text=f"note {number} kept")])
        result: Message = {"duplicate": False, "key": key, "epoch": session.epoch, "note": number}
        if number * TOKENS_PER_NOTE > self.budget:
            try:
                summary = self.summarize(session)
                session.commit_epoch(summary, self.next_baseline(session, summary))
            except SessionError as exc:
                # The note is on disk and stays applied; the restarted worker finishes
                # the epoch change from the log.
                result["commit_error"] = str(exc)
        return result

    @staticmethod
    def notes(session: Session) -> int:
        """The notes of the current epoch."""
        return sum(1 for r in session.records if isinstance(r, User))
