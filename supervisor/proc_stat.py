"""A process's line of ``/proc/PID/stat``: when it started (its identity across time),
whether it is stopped, and its fields after its name."""

from __future__ import annotations

import errno
import os
from typing import Final

_NO_STAT: Final = frozenset({errno.ENOENT, errno.ESRCH, errno.EACCES})


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/PID/stat``'s starttime);
    None if it is gone (reaped) or cannot be read.

    The identity of a process across time, as psutil's own is on Linux: not its
    ``create_time()``, which adds the boot time in wall-clock seconds read anew at each
    call, so that a step of the system clock (NTP at boot, a VM resumed, ``date -s``)
    made every running worker look like another process: serve then neither signalled
    nor killed any of them (a stopped worker was never killed as hung).
    """
    try:
        fields = stat_fields(pid)
    except OSError:
        return None
    # From the third field, the state; starttime is the 22nd.
    return int(fields[19]) if fields is not None and len(fields) > 19 else None


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the process's name (which may hold spaces
    and parentheses), from the third; None if there is no such file to read."""
    try:
        stat = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in _NO_STAT:
            return None
        raise
    try:
        data = os.read(stat, 1024)
    finally:
        os.close(stat)
    return data[data.rfind(b")") + 2 :].split()


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped or traced (its state: ``T`` or ``t``); False if gone."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return False
    return fields is not None and bool(fields) and fields[0] in (b"T", b"t")
