"""Deprecated: ``worker.session`` moved to ``worker.store.session``; import from ``worker.app``.

Kept for one release so that an App written before ``worker/store/`` still imports; the
import warns (DeprecationWarning) at the App's line. docs/apps.md lists the public names.
"""

from __future__ import annotations

from worker.app import warn_moved
from worker.store.session import (
    Session,
)

warn_moved("worker.session")

__all__ = [
    "Session",
]
