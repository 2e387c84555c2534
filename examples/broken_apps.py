"""Deliberately broken Apps: each breaks one rule of the App contract (docs/chaos.md).

The chaos rig must report every one of them, with the line that replays the case.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse
from dataclasses import replace

from examples.notes_app import NotesApp
from worker.app import Assistant, Baseline, Message, Session, User, field, optional_field


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
    """Builds the next epoch's baseline with the worker's pid: a worker that resumes an
    interrupted epoch change builds another baseline for the same recorded summary.

    (A summary that differs per worker is fine: it is recorded in ``EpochEnd`` before
    anything depends on it. The baseline built from it is not recorded there.)
    """

    def next_baseline(self, session: Session, summary: str) -> Baseline:
        baseline = super().next_baseline(session, summary)
        return replace(baseline, system=f"{baseline.system} (worker {os.getpid()})")


class ResummarizingNotesApp(NotesApp):
    """Builds the next baseline from a summary it computes again, not the one it is given:
    a resume after ``EpochEnd`` then calls ``summarize`` where it must use the recorded one
    (harmless while the summary is deterministic, wrong once a model writes it)."""

    def next_baseline(self, session: Session, summary: str) -> Baseline:
        return super().next_baseline(session, self.summarize(session))


class LitteringNotesApp(NotesApp):
    """Keeps a scratch file in its working directory, outside the session's directory."""

    def handle(self, session: Session, request: Message) -> Message:
        with open("notes-scratch.txt", "a", encoding="utf-8") as scratch:
            scratch.write(field(request, "text", str) + "\n")
        return super().handle(session, request)


class WebhookNotesApp(NotesApp):
    """Tells a webhook of each new note without the request's key: a crash after the post
    and before the note is durable makes the retry post it again, and the hook, which
    cannot tell the two apart, fires twice for one request.

    Its hook is the rig's effects service (``LOOPD_CHAOS_EFFECTS_URL``, ``/webhook``);
    without it the App posts nothing.
    """

    def handle(self, session: Session, request: Message) -> Message:
        key = optional_field(request, "key", str)
        if key is None or session.find_key(key) is None:
            # The bug: no Idempotency-Key header; the key is in the body, which the hook
            # does not dedupe by.
            _post_webhook({"note": field(request, "text", str), "key": key})
        return super().handle(session, request)


def _post_webhook(event: dict[str, object]) -> None:
    base = os.environ.get("LOOPD_CHAOS_EFFECTS_URL")
    if not base:
        return
    parts = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.request("POST", "/webhook", body=json.dumps(event).encode(),
                           headers={"Content-Type": "application/json"})  # fmt: skip
        connection.getresponse().read()
    finally:
        connection.close()
