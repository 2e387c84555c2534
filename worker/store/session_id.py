"""Validation of session ids, done before any path is built from one."""

from __future__ import annotations

import re
from typing import Final

from worker.store.errors import InvalidSessionId

MAX_LENGTH: Final = 64
_VALID: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a valid id, else raise InvalidSessionId saying why."""
    if not isinstance(session_id, str):
        raise InvalidSessionId(repr(session_id), "must be a string")
    if not session_id:
        raise InvalidSessionId(session_id, "must not be empty")
    if len(session_id) > MAX_LENGTH:
        raise InvalidSessionId(session_id, f"longer than {MAX_LENGTH} characters")
    if session_id[0] in ".-":
        raise InvalidSessionId(session_id, "must not start with '.' or '-'")
    # fullmatch: re's $ would accept a trailing newline.
    if _VALID.fullmatch(session_id) is None:
        raise InvalidSessionId(session_id, "may only hold the characters A-Z a-z 0-9 . _ -")
    return session_id
