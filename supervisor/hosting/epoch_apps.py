"""The App and version a session's current epoch was started with, for its status row.

Read from the first line of its newest log (the epoch's ``SessionStart``, docs/format.md
"Apps"), whether or not a worker runs: a hibernated session has one too. The line is
written once, by the rename that makes the log, and never again, so it is read once per
log file (its device and inode) and kept; a status row then costs a ``stat``.
"""

from __future__ import annotations

import os
import re
from collections import OrderedDict
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
    line = data.split(b"\n", 1)[0]
    try:
        record = decode_record(line)
    except ValueError:
        return _NONE
    if not isinstance(record, SessionStart):
        return _NONE
    return record.app, record.app_version
