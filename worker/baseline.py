"""Deprecated: ``worker.baseline`` moved to ``worker.store.baseline``; import from ``worker.app``.

Kept for one release so that an App written before ``worker/store/`` still imports; the
import warns (DeprecationWarning) at the App's line. docs/apps.md lists the public names.
"""

from __future__ import annotations

from worker.app import warn_moved
from worker.store.baseline import (
    Baseline,
    hash_bytes,
)

warn_moved("worker.baseline")

__all__ = [
    "Baseline",
    "hash_bytes",
]
