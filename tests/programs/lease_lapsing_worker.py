"""A real worker process (``python -m tests.programs.lease_lapsing_worker`` + the worker's flags)
whose node lease lapses at the fsync of a group commit, once the test has armed it.

Armed: the file named by ``LOOPD_TEST_LAPSE_ARM`` exists. At the next fsync of a log the
file is removed and the lease file (``--lease-file``) is made to say nothing is proven,
as a node whose lease ended writes it; the fsync then runs, and the worker's check
before its reply finds the lease lapsed.
"""

from __future__ import annotations

import os
import sys

from worker.process import main, parse_args
from worker.store.disk import durable


def _lapse_at_the_fsync(arm: str, lease_file: str) -> durable.BoundaryHook:
    def hook(boundary: durable.Boundary) -> None:
        if boundary.step is not durable.Step.FSYNC or not boundary.path.endswith(".jsonl"):
            return
        if not os.path.exists(arm):
            return
        os.unlink(arm)
        fd = os.open(lease_file, os.O_WRONLY)
        try:
            os.pwrite(fd, bytes(32), 0)  # (0.0, lease 0) twice: not proven
        finally:
            os.close(fd)

    return hook


if __name__ == "__main__":
    lease_file = parse_args(sys.argv[1:]).lease_file
    assert lease_file is not None, "--lease-file is required"
    durable.set_hook(_lapse_at_the_fsync(os.environ["LOOPD_TEST_LAPSE_ARM"], lease_file))
    sys.exit(main())
