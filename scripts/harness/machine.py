"""How a section of docs/benchmarks.md describes the machine its figures come from."""

from __future__ import annotations

import os
import platform


def machine_line() -> str:
    """``Machine: x86_64, 2 cores, Python 3.11.2``: a section goes on with its own facts."""
    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )


def filesystem_of(path: str) -> str:
    """The type of the filesystem ``path`` is on (the longest mount point above it), or ``?``."""
    best = ("?", "")
    with open("/proc/mounts", encoding="utf-8") as mounts:
        for row in mounts:
            parts = row.split()
            mount_point, fs_type = parts[1], parts[2]
            if path.startswith(mount_point) and len(mount_point) > len(best[1]):
                best = (fs_type, mount_point)
    return best[0]
