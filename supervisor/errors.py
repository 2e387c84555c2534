"""The supervisor's error family."""

from __future__ import annotations


class SupervisorError(Exception):
    """Root of every error the supervisor package raises."""


class IllegalTransition(SupervisorError):
    """A session's state machine was asked for a move its table does not allow."""

    def __init__(self, session: str, current: str, wanted: str) -> None:
        super().__init__(session, current, wanted)
        self.session = session
        self.current = current
        self.wanted = wanted

    def __str__(self) -> str:
        return f"session {self.session}: no move from {self.current} to {self.wanted}"


class HomeLocked(SupervisorError):
    """Another ``loopd serve`` holds this home."""

    def __init__(self, home: str, pid: int | None) -> None:
        super().__init__(home, pid)
        self.home = home
        self.pid = pid

    def __str__(self) -> str:
        holder = f"pid {self.pid}" if self.pid is not None else "another process"
        return f"{self.home}: a supervisor ({holder}) already serves this home"


class ControlError(SupervisorError):
    """The control socket could not be reached, or a request was refused."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class ServeError(SupervisorError):
    """``loopd serve`` cannot run on this home; the message says what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
