"""``loopd serve`` in a mount namespace of its own, where ``/proc/stat`` is a file a test
writes: a test steps the system clock for serve alone by changing the boot time there.

Run as ``python -m tests.programs.serve_own_boot_time serve ...`` with ``LOOPD_TEST_STAT``
naming the file (a copy of ``/proc/stat``). ``btime`` in ``/proc/stat`` is the wall-clock
second the machine booted: a step of the system clock (NTP at boot, a VM resumed,
``date -s``) moves it, and every wall-clock time derived from it (psutil's
``create_time()``) moves with it. The machine's own clock is left alone. Needs root.
"""

from __future__ import annotations

import ctypes
import os
import sys
from typing import Final, NoReturn

from supervisor.cli.group import main

_CLONE_NEWNS: Final = 0x00020000
_MS_REC: Final = 0x4000
_MS_PRIVATE: Final = 1 << 18
_MS_BIND: Final = 4096


def _own_proc_stat(path: str) -> None:
    """Enter a mount namespace of its own and show ``path`` at ``/proc/stat`` there; each
    step only once the one before it succeeded (never a mount in the machine's)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        _fail("unshare")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        _fail("make / private")
    if libc.mount(path.encode(), b"/proc/stat", None, _MS_BIND, None) != 0:
        _fail("bind")


def _fail(what: str) -> NoReturn:
    sys.exit(f"serve_own_boot_time: {what}: {os.strerror(ctypes.get_errno())}")


if __name__ == "__main__":
    _own_proc_stat(os.environ["LOOPD_TEST_STAT"])
    main()
