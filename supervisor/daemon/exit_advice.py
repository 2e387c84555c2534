"""What a worker's exit code says about its session: FATAL, and what the operator does next."""

from __future__ import annotations

from worker.process import EXIT_CANNOT_OPEN, EXIT_LOCKED, EXIT_NOT_FOUND, EXIT_REFUSED


def fatal_reason(
    code: int, said: str | None, home: str, session: str, holder: int | None = None
) -> str | None:
    """The ``last_error`` of a session whose worker exited with ``code``, if that code is
    one a restart will not fix (None: restart it, or it exited cleanly)."""
    if code == EXIT_REFUSED:
        return (
            f"{said or 'log refused'} -- the log is refused and will not be restarted. "
            f"Next: `loopd inspect --home {home} {session}`; if the last line is torn, "
            f"`loopd repair --home {home} {session}`, then `loopd start {session}`"
        )
    if code == EXIT_CANNOT_OPEN:
        return (
            f"{said or 'the session cannot be opened'} -- opening the session failed in a "
            f"way a restart will not fix, so it is not restarted. Next: fix the file or "
            f"directory named (its type, owner, mode, or the free space), then "
            f"`loopd start {session}`"
        )
    if code == EXIT_LOCKED:
        why = said or "the session is locked by another process"
        if holder is not None:
            why += f" (pid {holder} holds it; it is not ours: not fighting it)"
        return why
    if code == EXIT_NOT_FOUND:
        return said or "no such session"
    return None
