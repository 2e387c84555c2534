"""The control socket as both ends see it: its path, who is at the other end, and a home
only its owner can enter (the daemon binds it, the clients check it before trusting it).
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
from typing import Final

SOCKET_NAME: Final = "loopd.sock"
MAX_SOCKET_PATH: Final = 107  # sun_path holds 108 bytes with the terminating NUL
_PEERCRED: Final = struct.Struct("3i")  # pid, uid, gid
PRIVATE_DIR: Final = 0o700
_ABSENT: Final = frozenset({errno.ENOENT, errno.ENOTDIR})


def socket_path(home: str) -> str:
    """``<home>/loopd.sock``."""
    return os.path.join(home, SOCKET_NAME)


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of ``sock`` (SO_PEERCRED)."""
    _pid, uid, _gid = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    return int(uid)


def make_private_dirs(path: str) -> None:
    """Create ``path`` and any missing parents 0700 whatever the umask; make ``path`` 0700.

    ``os.makedirs`` applies its mode to the leaf only (parents get 0777 minus the umask),
    so each missing component is made here, and chmod-ed, since the umask only removes
    bits. Parents that already existed are the operator's and are left as they are.
    """
    missing: list[str] = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
        os.chmod(directory, PRIVATE_DIR)
    if stat.S_IMODE(os.stat(path).st_mode) != PRIVATE_DIR:
        os.chmod(path, PRIVATE_DIR)


def socket_owner_problem(path: str) -> str | None:
    """Why the socket at ``path`` must not be trusted by this uid, or None if it may be."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        if exc.errno in _ABSENT:
            return None  # nothing there: connect will say so
        raise
    if not stat.S_ISSOCK(st.st_mode):
        return f"{path} is not a socket"
    if st.st_uid != os.getuid():
        return f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()})"
    return None
