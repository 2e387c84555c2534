"""The operator CLI (``loopd ...``): every click command, its options and its tables.

Nothing else of loopd imports this package (import-linter checks it).
"""

from __future__ import annotations

from supervisor.cli.group import main

__all__ = ["main"]
