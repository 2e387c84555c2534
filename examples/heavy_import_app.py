"""The default App behind a heavy import, as an App built on an SDK is (``openai`` costs
seconds to import on a loaded machine): what a template saves (docs/templates.md).

    LOOPD_HEAVY_IMPORTS=openai loopd serve --home H --app examples.heavy_import_app:HeavyImportApp

``LOOPD_HEAVY_IMPORTS`` is a comma-separated list of modules imported with this one
(default: the standard library's email, http and asyncio stacks, installed everywhere).
"""

from __future__ import annotations

import importlib
import os
from typing import Final

from worker.app import DefaultApp

DEFAULT_IMPORTS: Final = "email.mime.multipart,email.policy,http.client,http.server,asyncio"
IMPORTED: Final = tuple(
    importlib.import_module(name.strip())
    for name in os.environ.get("LOOPD_HEAVY_IMPORTS", DEFAULT_IMPORTS).split(",")
    if name.strip()
)


class HeavyImportApp(DefaultApp):
    """The default App; its module imported the heavy modules once."""
