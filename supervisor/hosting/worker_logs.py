"""Workers' output into their logs: read from each worker's pipe on the daemon's loop.

A log that cannot be written (a FIFO or a link planted in its place, a full disk) is
reported once, and the output is dropped and counted until it can be written again; it
never blocks the loop (session_log.py opens the file non-blocking, regular files only).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import Callable
from typing import Final

from supervisor.hosting.session_log import SessionLog, log_path
from supervisor.hosting.settings import HostingSettings

READ_SIZE: Final = 64 * 1024
_AGAIN: Final = frozenset({errno.EAGAIN, errno.EINTR})


class WorkerLogs:
    """Every session's log, written from the output pipes of its workers."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        home: str,
        settings: HostingSettings,
        report: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.home = home
        self.settings = settings
        self.report = report
        self._logs: dict[str, SessionLog] = {}
        self._lost: dict[str, int] = {}  # session -> bytes of output its log could not take

    def watch(self, session: str, pid: int, fd: int) -> None:
        """Read a worker's stdout and stderr (one pipe) into its log file."""
        os.set_blocking(fd, False)
        log = self._log(session)
        self._note(session, log, f"worker {pid} started")
        self.loop.add_reader(fd, self._read_output, session, fd, log)

    def note_exit(self, session: str, text: str) -> None:
        """The supervisor's line about a worker's end; the file is closed after it."""
        log = self._log(session)
        self._note(session, log, text)
        with contextlib.suppress(OSError):
            log.close()

    def close(self) -> None:
        for session, log in self._logs.items():
            try:
                log.close()
            except OSError as exc:
                self._failed(session, exc, 0)
        self._logs.clear()

    def _log(self, session: str) -> SessionLog:
        # The object stays (a few hundred bytes); its file is open only while written to.
        log = self._logs.get(session)
        if log is None:
            log = self._logs[session] = SessionLog(
                log_path(self.home, session), max_bytes=self.settings.log_max_bytes,
                backups=self.settings.log_backups,
            )  # fmt: skip
        return log

    def _note(self, session: str, log: SessionLog, text: str) -> None:
        try:
            log.note(text)
            log.release()
        except OSError as exc:
            self._failed(session, exc, len(text))
        else:
            self._works(session)

    def _failed(self, session: str, exc: OSError, lost: int) -> None:
        """Said once until the log works again: a line per chunk of output would flood the
        daemon's own output."""
        if session not in self._lost:
            self.report(f"session {session}: cannot write its log: {exc}; its output is "
                        "dropped until it can")  # fmt: skip
        self._lost[session] = self._lost.get(session, 0) + lost

    def _works(self, session: str) -> None:
        lost = self._lost.pop(session, None)
        if lost is not None:
            self.report(f"session {session}: its log is written again ({lost} bytes of output "
                        "were dropped)")  # fmt: skip

    def _read_output(self, session: str, fd: int, log: SessionLog) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except OSError as exc:
            if exc.errno in _AGAIN:
                return
            data = b""
        if data:
            try:
                # Written and closed at once: a worker that says little (most do) costs
                # the supervisor no descriptor between its lines.
                log.feed(data)
                log.release()
            except OSError as exc:
                self._failed(session, exc, len(data))
            else:
                self._works(session)
            return
        # End of the pipe: every holder of its write end (the worker) is gone.
        self.loop.remove_reader(fd)
        os.close(fd)
        with contextlib.suppress(OSError):
            log.close()
