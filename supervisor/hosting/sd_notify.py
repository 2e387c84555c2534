"""systemd's notification protocol: one datagram to ``$NOTIFY_SOCKET`` per state change.

Written on the standard library (the protocol is a ``KEY=VALUE`` newline-separated
datagram on a Unix socket; see sd_notify(3)), so libsystemd is not a dependency. Outside
systemd (no ``$NOTIFY_SOCKET``) every call does nothing. Sending never blocks: the socket
is non-blocking and a full queue drops the message, as systemd's own client does.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Mapping
from typing import Final

NOTIFY_SOCKET_ENV: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV: Final = "WATCHDOG_USEC"
WATCHDOG_PID_ENV: Final = "WATCHDOG_PID"
_DROPPED: Final = frozenset({errno.EAGAIN, errno.ECONNREFUSED, errno.ENOENT, errno.ENOBUFS})
"""A manager that is gone or too busy: the notification is lost, the daemon goes on."""


class Notifier:
    """Sends READY=1, STATUS=, STOPPING=1 and WATCHDOG=1 to the service manager, if any."""

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_usec = watchdog_usec
        self._sock: socket.socket | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET`` and ``$WATCHDOG_USEC`` (the latter only if
        ``$WATCHDOG_PID`` is unset or names this process)."""
        env = os.environ if environ is None else environ
        address = env.get(NOTIFY_SOCKET_ENV) or None
        watchdog: int | None = None
        pid = env.get(WATCHDOG_PID_ENV)
        if pid is None or pid == str(os.getpid()):
            try:
                watchdog = int(env.get(WATCHDOG_USEC_ENV, "")) or None
            except ValueError:
                watchdog = None
        return cls(address, watchdog)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half the manager's timeout, as sd_watchdog_enabled(3)
        advises; None when no watchdog is asked for."""
        if self.address is None or self.watchdog_usec is None:
            return None
        return self.watchdog_usec / 2_000_000

    def ready(self, status: str) -> bool:
        return self.send(READY="1", STATUS=status)

    def status(self, status: str) -> bool:
        return self.send(STATUS=status)

    def stopping(self, status: str) -> bool:
        return self.send(STOPPING="1", STATUS=status)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG="1")

    def send(self, **fields: str) -> bool:
        """Send one datagram of ``KEY=VALUE`` lines; True if it was queued."""
        if self.address is None:
            return False
        payload = "".join(f"{k}={v.replace(chr(10), ' ')}\n" for k, v in fields.items())
        # An address starting with '@' is in the abstract namespace (a leading NUL byte).
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(payload.encode(), target)
        except OSError as exc:
            if exc.errno in _DROPPED:
                return False
            raise
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
