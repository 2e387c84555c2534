"""``loopd serve`` in a mount namespace of its own, where ``/proc/stat`` is a file a test
writes (chaos/run/mutant_serve.py, --proc-stat): a test steps the system clock for serve alone.

Run as ``python -m tests.programs.serve_own_boot_time serve ...`` with ``LOOPD_TEST_STAT``
naming the file (a copy of ``/proc/stat``; ``chaos.run.mutant_serve.step_clock`` moves its
boot time). Needs root.
"""

from __future__ import annotations

import os

from chaos.run.mutant_serve import own_proc_stat
from supervisor.cli.group import main

if __name__ == "__main__":
    own_proc_stat(os.environ["LOOPD_TEST_STAT"])
    main()
