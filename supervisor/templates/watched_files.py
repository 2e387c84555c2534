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
    elif event == "os.rename" and len(args) == 4:  # os.rename and os.replace (and moves)
        # Both names are the App's own output: a file written beside and put in place
        # (``tmp`` + ``os.replace``), then read back, is no data it was given.
        for path in args[:2]:
            name = _absolute(path)
            if name is not None:
                _reads.written.add(name)


def _record(reads: ImportReads, args: tuple[object, ...]) -> None:
    """Note an ``open`` event's (path, mode, flags) unless it is not App data."""
    if len(args) != 3:
        return  # not the interpreter's event (anything may call sys.audit("open", ...))
    path, _mode, flags = args
    if not isinstance(flags, int):
        return
    name = _absolute(path)  # None for a descriptor (an int): its file was recorded before
    if name is None:
        return
    if name.startswith(_NOT_APP_DATA) or name.endswith(".pyc") or "/__pycache__/" in name:
        return  # the kernel's, or bytecode: the source is watched through __file__
    reads.note(name, flags)


def _absolute(path: object) -> str | None:
    """``path`` made absolute against the working directory now; None if it is no path."""
    if not isinstance(path, str | bytes | os.PathLike):
        return None
    try:
        return os.path.abspath(os.fsdecode(os.fspath(path)))
    except _UNRESOLVABLE:
        return None


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


Fingerprint = tuple[int, ...] | None
"""A watched file's device, inode, size, mtime and ctime (ns); ``ABSENT``: the import
looked for it and it was not there; None: changed while the import ran (the first order
finds it changed)."""
ABSENT: Final[tuple[int, ...]] = ()


def _fingerprint(found: os.stat_result) -> tuple[int, int, int, int, int]:
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


def watched_files(modules: set[str], reads: ImportReads, began: int) -> dict[str, Fingerprint]:
    """The file of each of ``modules`` and each regular file of ``reads`` the import did not
    write, with its fingerprint; a file the import opened (or tried to) that is not there
    at its end is ``ABSENT``: an optional file created later (an override a
    ``configparser.read`` skipped) is a change too.

    A file is told by more than its mtime, which a deploy can keep or set back (``cp -p``,
    ``rsync -t``, an archive's dates, a file renamed into place): by its inode and its
    ctime too, which only the kernel sets. A file whose ctime falls inside the import
    (``began`` to now: written, renamed into place or touched while the import ran) may
    hold other code or data than what was imported: ``None``, so that the first order
    finds it changed and the next template imports it again. ``began`` is read from the
    clock the kernel dates files by (``files_clock_ns``).
    """
    paths = [getattr(sys.modules.get(name), "__file__", None) for name in modules]
    found: dict[str, os.stat_result | None] = {}
    for path in [p for p in paths if isinstance(p, str)]:
        with contextlib.suppress(OSError):
            found[path] = os.stat(path)
    for path in reads.read:
        if path in found or path in reads.written:
            continue
        try:
            status = os.stat(path)
        except FileNotFoundError:
            found[path] = None  # looked for, not there
            continue
        except OSError:
            continue
        if stat.S_ISREG(status.st_mode):
            found[path] = status
    now = time.time_ns()
    return {path: _at_import(status, began, now) for path, status in found.items()}


def _at_import(status: os.stat_result | None, began: int, now: int) -> Fingerprint:
    if status is None:
        return ABSENT
    return None if began <= status.st_ctime_ns <= now else _fingerprint(status)


_CLOCK_REALTIME_COARSE: Final = 5
"""Linux's clock id of the wall clock as the kernel dates files (a tick at a time)."""


def files_clock_ns() -> int:
    """Now, as the kernel would date a file changed now: its coarse wall clock, up to a
    tick behind ``time.time_ns()`` (compared with that, a change in an import's first
    milliseconds would pass for one before it)."""
    return time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)


def first_changed(files: dict[str, Fingerprint]) -> str | None:
    """The first of ``files`` changed, gone or come since the import (a new App version)."""
    for path, fingerprint in files.items():
        try:
            if fingerprint is None or _fingerprint(os.stat(path)) != fingerprint:
                return path
        except FileNotFoundError:
            if fingerprint != ABSENT:
                return path
        except OSError:
            return path
    return None


def printable(path: str) -> str:
    """``path`` as a line can say it: its bytes that are no UTF-8 and its control
    characters escaped (a file's name may hold any byte but NUL and "/")."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
