"""The App and version a session's current epoch was started with, for its status row.

Read from the first line of its newest log (the epoch's ``SessionStart``, docs/format.md
"Apps"), whether or not a worker runs: a hibernated session has one too. The line is
written once, by the rename that makes the log, and never again, so it is read once per
log file (its device and inode) and kept; a status row then costs a ``stat``.

A session in a database has no log here: its worker reports its epoch's App with its
state (ready, each state report), and ``serve --store`` reads every session's newest
SessionStart once at start, in one query (``remember_stored``), for the rows of the
sessions no worker has reported yet (a hibernated one); no status call asks the database.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Final

from supervisor.hosting.regular_file import open_regular
from worker.store.disk.layout import session_dir
from worker.store.errors import SessionError
from worker.store.format.records import SessionStart, decode_record

_LOG: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")
_READ: Final = 1 << 16
MAX_START_LINE: Final = 64 << 20
"""Bytes of a SessionStart line read at most (its recent_keys may be long)."""
KEPT: Final = 100_000
"""Logs whose App is remembered; the least recently asked for go first."""

EpochApp = tuple[str | None, str | None]
_NONE: Final[EpochApp] = (None, None)
_known: OrderedDict[tuple[int, int], EpochApp] = OrderedDict()
# Read by serve at start, per (store URI, session id); each taken by the session's first
# host (later ones, a session created again, wait for their worker's report).
_stored: dict[tuple[str, str], EpochApp] = {}


def remember_stored(uri: str, starts: Mapping[str, bytes]) -> None:
    """Keep the App of each session's newest SessionStart line in ``starts`` (by id)."""
    for session_id, line in starts.items():
        _stored[(uri, session_id)] = start_app(line)


def take_stored(uri: str | None, session_id: str) -> EpochApp | None:
    """The App serve read at start for the session in the database at ``uri``, once
    (None: not read, or ``uri`` None: a session in a home)."""
    return None if uri is None else _stored.pop((uri, session_id), None)


def app_reported(state: object) -> EpochApp | None:
    """``(app, app_version)`` a worker's state report names; None if it names none (a
    worker from before it reported them)."""
    if not isinstance(state, dict) or "app" not in state:
        return None
    app, version = state.get("app"), state.get("app_version")
    if isinstance(app, str) and isinstance(version, str):
        return app, version
    return _NONE


def epoch_app(home: str, session_id: str, epoch: int | None) -> EpochApp:
    """``(app, app_version)`` of the session's newest epoch (``epoch`` if known); (None,
    None) when it names none (written before versions) or cannot be read now."""
    try:
        directory = session_dir(home, session_id)
        if epoch is None:
            epoch = max(int(m.group(1)) for n in os.listdir(directory) if (m := _LOG.fullmatch(n)))
        path = os.path.join(directory, f"{epoch}.jsonl")
        fd = open_regular(path, os.O_RDONLY)
    except (OSError, ValueError, SessionError):
        return _NONE  # no log yet, gone, or not a file: nothing to show
    try:
        info = os.fstat(fd)
        place = (info.st_dev, info.st_ino)
        if place in _known:
            _known.move_to_end(place)
            return _known[place]
        found = _read_start(fd)
    except OSError:
        return _NONE
    finally:
        os.close(fd)
    _known[place] = found
    if len(_known) > KEPT:
        _known.popitem(last=False)
    return found


def _read_start(fd: int) -> EpochApp:
    """The App of the SessionStart on the first line of the log open at ``fd``."""
    data = b""
    while b"\n" not in data and len(data) < MAX_START_LINE:
        chunk = os.read(fd, _READ)
        if not chunk:
            break
        data += chunk
    return start_app(data.split(b"\n", 1)[0])


def start_app(line: bytes) -> EpochApp:
    """The App a SessionStart ``line`` (no newline) names; (None, None) if it is not one."""
    try:
        record = decode_record(line)
    except ValueError:
        return _NONE
    if not isinstance(record, SessionStart):
        return _NONE
    return record.app, record.app_version
