"""Deliberately broken Apps: each breaks one rule of the App contract (docs/chaos.md).

The chaos rig must report every one of them, with the line that replays the case.
"""

from __future__ import annotations

import os

from examples.notes_app import NotesApp
from worker.store.records import Assistant, User
from worker.store.session import Session
from worker.wire import Message, field, optional_field


class TwiceNotesApp(NotesApp):
    """Looks a key up in the current epoch's records instead of with ``find_key``: a retry
    of a request from an earlier epoch is applied again, or (as the store refuses to write
    a key twice) fails, instead of being answered from the log."""

    def handle(self, session: Session, request: Message) -> Message:
        key = optional_field(request, "key", str)
        if key is not None and any(isinstance(r, User) and r.key == key for r in session.records):
            return {"duplicate": True, "key": key}
        return self.add_note(session, field(request, "text", str), key)


class SplitNotesApp(NotesApp):
    """Writes a note and its answer with two appends: a crash between leaves half."""

    def handle(self, session: Session, request: Message) -> Message:
        key = optional_field(request, "key", str)
        if key is not None and session.find_key(key):
            return {"duplicate": True, "key": key}
        number = self.notes(session) + 1
        session.append(User(text=field(request, "text", str), key=key))
        session.append(Assistant(text=f"note {number} kept"))
        return {"duplicate": False, "key": key, "epoch": session.epoch, "note": number}


class DriftingNotesApp(NotesApp):
    """Summarizes with the worker's pid: a resumed worker gets another summary."""

    def summarize(self, session: Session) -> str:
        return f"{super().summarize(session)} (by worker {os.getpid()})"


class LitteringNotesApp(NotesApp):
    """Keeps a scratch file in its working directory, outside the session's directory."""

    def handle(self, session: Session, request: Message) -> Message:
        with open("notes-scratch.txt", "a", encoding="utf-8") as scratch:
            scratch.write(field(request, "text", str) + "\n")
        return super().handle(session, request)
