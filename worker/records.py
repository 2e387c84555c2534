"""Deprecated: ``worker.records`` is ``worker.store.format.records``; import from ``worker.app``.

Kept for one release so that an App written before ``worker/store/`` still imports; the
import warns (DeprecationWarning) at the App's line. docs/apps.md lists the public names.
"""

from __future__ import annotations

from worker.app import warn_moved
from worker.store.format.records import *  # noqa: F403 - the old module's names, all of them

warn_moved("worker.records")
