"""An App's version: what names the code a session's epoch was started with.

One rule for the worker (which stamps it on each ``SessionStart`` it writes) and for
the supervisor's check of what a worker would load now (``loopd status``, ``loopd
upgrade``): both import ``module`` and resolve ``attribute`` of ``module:attribute``,
never calling the factory, so they agree (docs/apps.md, "Versions"):

1. the ``version`` of what ``attribute`` names (an App class's class attribute, which its
   objects share; a factory function's own attribute), if it is a non-empty string;
2. else the module's ``version``, if it is a non-empty string;
3. else ``src-`` and the first 12 hex digits of the SHA-256 of the module's source file's
   bytes (``module.__file__``: a package's ``__init__.py``); ``src-none`` if it has none.
"""

from __future__ import annotations

import hashlib
import importlib
from typing import Final

MAX_VERSION: Final = 200
"""Characters of a declared version kept in the log: longer ones are cut."""
NO_SOURCE: Final = "src-none"


def app_version(spec: str) -> str:
    """The version of the App ``module:attribute`` names (imported here if not already)."""
    module_name, _sep, attribute = spec.partition(":")
    module = importlib.import_module(module_name)
    target: object = module
    for part in attribute.split("."):
        target = getattr(target, part)
    for holder in (target, module):
        declared = getattr(holder, "version", None)
        if isinstance(declared, str) and declared.strip():
            return declared.strip()[:MAX_VERSION]
    return source_digest(getattr(module, "__file__", None))


def source_digest(path: str | None) -> str:
    """``src-`` and 12 hex digits of the SHA-256 of the file at ``path``; NO_SOURCE if none.

    A file that cannot be read counts as none: the module imported, so the version is
    never a reason for a worker not to start."""
    if not path:
        return NO_SOURCE
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return NO_SOURCE
    return "src-" + hashlib.sha256(data).hexdigest()[:12]
