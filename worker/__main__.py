"""``python -m worker``: run one session's worker process."""

from __future__ import annotations

import sys

from worker.process import main

sys.exit(main())
