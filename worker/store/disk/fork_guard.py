"""Descriptors a forked child of the worker must not keep: the session's lock, and the
sockets of its supervisor and its clients.

An App may fork (``os.fork``, multiprocessing's ``fork`` context), and its child may
outlive the worker. A child holding a copy of the lock's descriptor holds the flock (a
flock belongs to the open file description, which fork shares), so the next worker
finds the session locked; one holding a client's socket keeps that client from seeing
the end of stream when the worker dies. O_CLOEXEC covers exec. Linux has no
close-on-fork, so a hook that Python runs in every child of ``os.fork``
(``os.register_at_fork``) covers each guarded descriptor there with ``dup2`` of
/dev/null: the child no longer refers to the open file description, and the number
stays taken, so an object of the worker's that the child closes later closes /dev/null,
never a file the child opened since. Locks are covered first: by the time the
supervisor sees the channel's end, the child holds the lock no more.

A child forked by C code without Python's hooks keeps them: the supervisor kills the
worker's whole process group when the worker dies (supervisor/sessions/spawn.py).
"""

from __future__ import annotations

import errno
import os
import weakref
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # only named in annotations: socket costs every importer 3 ms (issue 32)
    import selectors
    import socket

_NO_NULL: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOENT, errno.EACCES})
"""Why /dev/null may not open: out of descriptors, or a sandbox without it."""
_FDS: Final[dict[int, None]] = {}  # ordered: covered in the order they were guarded
_SOCKETS: Final[weakref.WeakSet[socket.socket]] = weakref.WeakSet()
_SELECTORS: Final[weakref.WeakSet[selectors.BaseSelector]] = weakref.WeakSet()


def guard_fd(fd: int) -> None:
    """Cover ``fd`` in every child forked from now until ``release_fd``."""
    _FDS[fd] = None


def release_fd(fd: int) -> None:
    """Stop covering ``fd`` (call before closing it: its number may then be reused)."""
    _FDS.pop(fd, None)


def guard_socket(sock: socket.socket) -> None:
    """Cover ``sock`` in every child forked while it is open (held weakly)."""
    _SOCKETS.add(sock)


def guard_selector(selector: selectors.BaseSelector) -> None:
    """Cover every descriptor registered with ``selector`` at the fork (held weakly)."""
    _SELECTORS.add(selector)


def _guarded() -> list[int]:
    """The open descriptors to cover, locks first; a closed socket's fileno() is -1."""
    fds = list(_FDS)
    fds += [sock.fileno() for sock in list(_SOCKETS)]
    for selector in list(_SELECTORS):
        mapping = selector.get_map()  # None once the selector is closed
        for key in list(mapping.values()) if mapping is not None else []:
            fileobj = key.fileobj
            fds.append(fileobj if isinstance(fileobj, int) else fileobj.fileno())
    return [fd for fd in dict.fromkeys(fds) if fd >= 0]


def _cover_in_child() -> None:
    """In a forked child: cover every guarded descriptor, then forget them all."""
    fds = _guarded()
    _FDS.clear()
    _SOCKETS.clear()
    _SELECTORS.clear()
    if not fds:
        return
    try:
        # Read and write: a signal's wake-up byte written to a covered socket is dropped.
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno not in _NO_NULL:
            raise
        for fd in fds:  # no /dev/null to spare: closed outright, the lesser harm
            os.close(fd)
        return
    try:
        for fd in fds:
            if fd != null:
                os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)


os.register_at_fork(after_in_child=_cover_in_child)
