"""systemd's notification protocol: one datagram to ``$NOTIFY_SOCKET`` per state change.

Written on the standard library (the protocol is a ``KEY=VALUE`` newline-separated
datagram on a Unix socket; see sd_notify(3)), so libsystemd is not a dependency. Outside
systemd (no ``$NOTIFY_SOCKET``) every call does nothing. Sending never blocks: the socket
is non-blocking and a full queue drops the message, as systemd's own client does.

Sending never raises either: it is called from the daemon's state callbacks, where an
exception would leave a session half moved (STOPPING for ever) and the loop unable to
stop. An address that cannot work (over the 108 bytes of ``sun_path``, a path under a
file, a stream socket, a NUL byte) is reported once and notifications are off from then
on; a manager that is gone or busy loses the one message, as before.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable, Mapping
from typing import Final

NOTIFY_SOCKET_ENV: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC_ENV: Final = "WATCHDOG_USEC"
WATCHDOG_PID_ENV: Final = "WATCHDOG_PID"
_DROPPED: Final = frozenset({errno.EAGAIN, errno.ECONNREFUSED, errno.ENOENT, errno.ENOBUFS})
"""A manager that is gone or too busy: the notification is lost, the daemon goes on."""
MAX_WATCHDOG_USEC: Final = 7 * 86_400 * 1_000_000
MAX_ADDRESS: Final = 108
"""Bytes of ``sun_path``; a path address also needs its terminating NUL."""


class Notifier:
    """Sends READY=1, STATUS=, STOPPING=1 and WATCHDOG=1 to the service manager, if any."""

    def __init__(
        self,
        address: str | None,
        watchdog_usec: int | None = None,
        report: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self.address = address
        self.watchdog_usec = watchdog_usec
        self.report = report
        self.dropped = 0
        self._sock: socket.socket | None = None
        # Said at the first send, when the daemon's output is ready for it.
        self._problem = _address_problem(address) if address is not None else None

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        report: Callable[[str], None] = lambda _line: None,
    ) -> Notifier:
        """A notifier for ``$NOTIFY_SOCKET`` and ``$WATCHDOG_USEC`` (the latter only if
        ``$WATCHDOG_PID`` is unset or names this process)."""
        env = os.environ if environ is None else environ
        address = env.get(NOTIFY_SOCKET_ENV) or None
        watchdog: int | None = None
        pid = env.get(WATCHDOG_PID_ENV)
        if pid is None or pid == str(os.getpid()):
            try:
                watchdog = int(env.get(WATCHDOG_USEC_ENV, ""))
            except ValueError:
                watchdog = None
            if watchdog is not None and not 0 < watchdog <= MAX_WATCHDOG_USEC:
                watchdog = None  # systemd never sets these: no watchdog is asked for
        return cls(address, watchdog, report)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half the manager's timeout, as sd_watchdog_enabled(3)
        advises; None when no watchdog is asked for."""
        if self.address is None or self.watchdog_usec is None or self._problem is not None:
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
        if self._problem is not None:
            problem, self._problem = self._problem, None
            self._give_up(problem)
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
            self._sock.sendto(payload.encode("utf-8", "replace"), os.fsencode(target))
        except OSError as exc:
            if exc.errno in _DROPPED:
                self.dropped += 1
                return False
            # EPROTOTYPE (a stream socket), ENOTDIR (a path under a file), EACCES, ...:
            # no later message can get through either.
            self._give_up(f"cannot send to it: {exc.strerror or exc}")
            return False
        except (ValueError, UnicodeError) as exc:  # a NUL byte or an unencodable name
            self._give_up(f"unusable address: {exc}")
            return False
        return True

    def _give_up(self, why: str) -> None:
        self.report(f"${NOTIFY_SOCKET_ENV}={self.address!r}: {why}; notifications to the "
                    "service manager are off")  # fmt: skip
        self.address = None
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _address_problem(address: str) -> str | None:
    """Why ``address`` cannot be a notify socket's, or None if it may be."""
    if "\0" in address:
        return "it holds a NUL byte"
    try:
        size = len(os.fsencode(address))
    except UnicodeError:
        return "it cannot be encoded as a file name"
    if address.startswith("@") and size > MAX_ADDRESS:
        return f"an abstract address of {size} bytes, over the {MAX_ADDRESS}-byte limit"
    if not address.startswith("@") and size >= MAX_ADDRESS:
        return (f"a path of {size} bytes, over the {MAX_ADDRESS - 1}-byte limit of a Unix "
                "socket")  # fmt: skip
    if not address.startswith(("/", "@")):
        return "not an absolute path nor an abstract address (@name)"
    return None
