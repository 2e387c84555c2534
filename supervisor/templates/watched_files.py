"""What a template watches to know its App changed: the file of each module its import
added, and each regular file that import opened for reading (a prompt, a configuration).

The files read are recorded by an audit hook (``sys.addaudithook``, the ``open`` event),
added once, in the template only, just before the App's import. A hook cannot be removed
and every worker the template forks inherits it: outside the import it returns at its
first line (one global compared with None), about 0.1 us an audited event, and a worker
raises few of those per request (docs/templates.md, "What the watch costs a worker").
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Iterator
from typing import Final

MAX_READ_FILES: Final = 1000
"""Files read at import a template watches at most (the first ones the import opened):
each is a stat at every order, in the supervisor's wait for the template's answer."""
_NOT_APP_DATA: Final = ("/proc/", "/sys/", "/dev/")
_UNRESOLVABLE: Final = (OSError, TypeError, ValueError)
"""What deriving a path from an open's arguments may raise (a deleted working directory,
a path that is no path): that open is not recorded. A hook that raised would fail the
App's own open."""


class ImportReads:
    """The files an import opened: for reading (the first ``MAX_READ_FILES``), for writing."""

    def __init__(self) -> None:
        self.read: dict[str, None] = {}
        """Absolute paths, in the order first opened."""
        self.written: set[str] = set()
        """Absolute paths opened for writing: the App's own output, never watched."""
        self.unwatched = 0
        """Opens for reading past the bound (not told apart: some may be of one file)."""

    def note(self, path: str, flags: int) -> None:
        if flags & os.O_ACCMODE != os.O_RDONLY:
            self.written.add(path)
        elif path not in self.read:
            if len(self.read) < MAX_READ_FILES:
                self.read[path] = None
            else:
                self.unwatched += 1

    def past_bound(self) -> str:
        """One line for the operator if the bound was reached, else empty."""
        if not self.unwatched:
            return ""
        return (
            f"its import read more than {MAX_READ_FILES} files: the first "
            f"{MAX_READ_FILES} are watched, {self.unwatched} later opens are not"
        )


_reads: ImportReads | None = None
"""What the hook records into; None outside the App's import (the hook does nothing)."""
_hooked = False


def _on_audit(event: str, args: tuple[object, ...]) -> None:
    if _reads is None:  # every audited event of every worker passes here: keep it first
        return
    if event == "open":
        _record(_reads, args)


def _record(reads: ImportReads, args: tuple[object, ...]) -> None:
    """Note an ``open`` event's (path, mode, flags) unless it is not App data."""
    if len(args) != 3:
        return  # not the interpreter's event (anything may call sys.audit("open", ...))
    path, _mode, flags = args
    if not isinstance(path, str | bytes | os.PathLike) or not isinstance(flags, int):
        return  # a descriptor (an int): what it is open on was opened, and recorded, before
    try:
        name = os.path.abspath(os.fsdecode(os.fspath(path)))  # against this open's cwd
    except _UNRESOLVABLE:
        return
    if name.startswith(_NOT_APP_DATA) or name.endswith(".pyc") or "/__pycache__/" in name:
        return  # the kernel's, or bytecode: the source is watched through __file__
    reads.note(name, flags)


@contextlib.contextmanager
def recording_reads(reads: ImportReads) -> Iterator[None]:
    """Record into ``reads`` the files opened while the block runs (the App's import)."""
    global _reads, _hooked  # noqa: PLW0603 - the hook is process-wide, and so is its state
    if not _hooked:
        sys.addaudithook(_on_audit)
        _hooked = True
    _reads = reads
    try:
        yield
    finally:
        _reads = None


def hook_added() -> bool:
    """This process carries the hook (a template, or a worker one forked)."""
    return _hooked


def watched_files(modules: set[str], reads: ImportReads, began: int) -> dict[str, int]:
    """The file of each of ``modules`` and each regular file of ``reads`` the import did not
    write, with its mtime (ns); gone files are left out.

    A file written while the import ran (``began`` to now) may hold other code or data than
    what was imported: its mtime is kept as -1, so that the first order finds it changed and
    the next template imports it again. A file dated past now (a clock or an archive's
    dates) is not taken for one.
    """
    paths = [getattr(sys.modules.get(name), "__file__", None) for name in modules]
    files = {}
    for path in [p for p in paths if isinstance(p, str)]:
        with contextlib.suppress(OSError):
            files[path] = os.stat(path).st_mtime_ns
    for path in reads.read:
        if path in files or path in reads.written:
            continue
        with contextlib.suppress(OSError):
            found = os.stat(path)
            if stat.S_ISREG(found.st_mode):
                files[path] = found.st_mtime_ns
    now = time.time_ns()
    return {path: -1 if began <= mtime <= now else mtime for path, mtime in files.items()}


def first_changed(files: dict[str, int]) -> str | None:
    """The first of ``files`` changed or gone since the import (a new App version)."""
    for path, mtime in files.items():
        try:
            if os.stat(path).st_mtime_ns != mtime:
                return path
        except OSError:
            return path
    return None
