"""``python -m chaos.run.mutant_serve [--proc-stat STAT] MUTANT serve ...``: ``loopd
serve`` with one of ``chaos.mutants.SERVE_MUTANTS`` patched in before it starts (``-``:
none); the templates and workers it forks inherit it (a worker it starts with exec would
not). The CLI is run as ``python -m supervisor`` runs it (no module of the rig imports
the CLI).

``--proc-stat STAT``: serve runs in a mount namespace of its own, where ``/proc/stat`` is
the file ``STAT`` (a copy the rig writes). ``btime`` in ``/proc/stat`` is the wall-clock
second the machine booted: a step of the system clock (NTP at boot, a VM resumed,
``date -s``) moves it, and every wall-clock time derived from it (psutil's
``create_time()``) moves with it. Changing it in ``STAT`` (``step_clock``) steps the
clock for this serve (and what it forks) alone; the machine's clock stays as it is.
Needs root (a mount namespace); each step is taken only once the one before it
succeeded, so a failure never mounts anything in the machine's namespace.
"""

from __future__ import annotations

import ctypes
import os
import re
import runpy
import sys
from typing import Final, NoReturn

from chaos import mutants

_CLONE_NEWNS: Final = 0x00020000
_MS_REC: Final = 0x4000
_MS_PRIVATE: Final = 1 << 18
_MS_BIND: Final = 4096
_BTIME: Final = re.compile(rb"^btime (\d+)$", re.MULTILINE)


def own_proc_stat(path: str) -> None:
    """Enter a mount namespace of its own and show ``path`` at ``/proc/stat`` there."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        _fail("unshare")
    if libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        _fail("make / private")
    if libc.mount(os.fsencode(path), b"/proc/stat", None, _MS_BIND, None) != 0:
        _fail("bind")


def step_clock(path: str, seconds: int) -> None:
    """Move the boot time that ``path`` (a copy of ``/proc/stat``) says by ``seconds``:
    rewritten in place, so that a bind mount of it shows the new content."""
    with open(path, "r+b") as stat:
        text = stat.read()
        found = _BTIME.search(text)
        if found is None:
            raise ValueError(f"{path}: no btime line")
        stepped = _BTIME.sub(b"btime %d" % (int(found.group(1)) + seconds), text, count=1)
        stat.seek(0)
        stat.write(stepped)
        stat.truncate()


def _fail(what: str) -> NoReturn:
    sys.exit(f"chaos.run.mutant_serve: {what}: {os.strerror(ctypes.get_errno())}")


if __name__ == "__main__":
    if sys.argv[1] == "--proc-stat":
        own_proc_stat(sys.argv.pop(2))
        sys.argv.pop(1)
    mutant = sys.argv.pop(1)
    if mutant != "-":
        mutants.apply(mutant)
    runpy.run_module("supervisor", run_name="__main__", alter_sys=True)
