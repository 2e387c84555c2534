"""A worker resuming a session mid-epoch under another version of its App says so.

The epoch's SessionStart names the App and version it was started with (stamped by
the worker that wrote it); a worker of the same App at another version appends one
``AppChanged`` before it serves anything, and tells the supervisor, whose event stream
carries it (docs/format.md, "Apps"). The next epoch's SessionStart names the new one.
"""

from __future__ import annotations

from worker.ipc.wire import Message
from worker.store.errors import LogSealed
from worker.store.format.app_records import serving_app
from worker.store.format.records import AppChanged
from worker.store.session import Session


def note_app_change(session: Session, app: str, version: str) -> Message | None:
    """Append ``AppChanged`` if ``session``'s epoch is served by another version of ``app``;
    what changed (``app``, ``from``, ``to``, ``epoch``, ``line``), or None if nothing did.

    Nothing is written for an epoch whose SessionStart names no App (written before
    versions) or another App: only a version of the same one moves.
    """
    serving = serving_app(session.records)
    if serving is None or serving[0] != app or serving[1] == version:
        return None
    try:
        session.append(AppChanged(app=app, from_version=serving[1], to_version=version))
    except LogSealed:
        return None  # sealed for a move: nothing may follow, and nothing is served here
    return {
        "app": app,
        "from": serving[1],
        "to": version,
        "epoch": session.epoch,
        "line": len(session.records),
    }
