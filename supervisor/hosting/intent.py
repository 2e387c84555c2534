"""The operator's intent (which sessions were stopped), kept across supervisor restarts.

The log is a session's only state and a session directory holds nothing else, so the
intent lives beside the sessions, in ``<home>/intent.json``: ``{"stopped": [id, ...],
"apps": {id: NAME, ...}}`` (the named App, of ``loopd.toml``'s ``[apps]``, a session was
created with; a session without an entry runs serve's ``--app``).
Every change rewrites the whole file atomically (a temporary file in the home, fsync,
rename, fsync of the home), so a crash leaves either the old intent or the new one.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Final

from supervisor.errors import SupervisorError
from supervisor.hosting.regular_file import decode_utf8, read_regular
from worker.store.disk import durable
from worker.store.errors import SessionIOError

INTENT_NAME: Final = "intent.json"
MAX_INTENT_BYTES: Final = 64 << 20
"""A million stopped sessions of 64-byte ids fit; a larger file is not ours."""


class IntentError(SupervisorError):
    """The intent file cannot be read or written; ``str()`` is ``<path>: <why>``."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(path, why)
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


class IntentFile:
    """The set of sessions an operator stopped; a stopped session stays stopped until started."""

    def __init__(self, home: str) -> None:
        self.home = home
        self.path = os.path.join(home, INTENT_NAME)
        self._stopped: set[str] = set()
        self._apps: dict[str, str] = {}

    @property
    def stopped(self) -> frozenset[str]:
        return frozenset(self._stopped)

    def load(self) -> frozenset[str]:
        """Read the file (a missing file means nothing was stopped); IntentError if unusable.

        A FIFO, a link, a device or a file over ``MAX_INTENT_BYTES`` is refused without
        waiting on it; bytes that are not UTF-8 JSON of the expected shape are refused
        whatever their nesting (a deep one is refused, not a RecursionError).
        """
        try:
            raw = read_regular(self.path, MAX_INTENT_BYTES)
        except OSError as exc:
            raise IntentError(self.path, f"cannot read: {exc.strerror}") from exc
        if raw is None:
            self._stopped = set()
            self._apps = {}
            return self.stopped
        try:
            decoded = json.loads(decode_utf8(raw))
        except json.JSONDecodeError as exc:
            raise IntentError(self.path, f"not JSON: {exc}") from exc
        except ValueError as exc:
            raise IntentError(self.path, str(exc)) from exc
        except RecursionError as exc:
            raise IntentError(self.path, "not the intent file: JSON nested too deeply") from exc
        stopped = decoded.get("stopped") if isinstance(decoded, dict) else None
        if not isinstance(stopped, list) or not all(isinstance(s, str) for s in stopped):
            raise IntentError(self.path, 'expected {"stopped": [session id, ...]}')
        apps = decoded.get("apps", {})
        if not isinstance(apps, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in apps.items()
        ):
            raise IntentError(self.path, 'expected "apps": {session id: App name, ...}')
        self._stopped = set(stopped)
        self._apps = dict(apps)
        return self.stopped

    def app_of(self, session_id: str) -> str | None:
        """The named App the session was created with, if any."""
        return self._apps.get(session_id)

    @property
    def apps(self) -> dict[str, str]:
        return dict(self._apps)

    def set_app(self, session_id: str, app: str | None) -> None:
        """Record (or forget, with None) the session's named App; durable on return."""
        wanted = dict(self._apps)
        if app is None:
            wanted.pop(session_id, None)
        else:
            wanted[session_id] = app
        if wanted == self._apps:
            return
        self._write(self._stopped, wanted)
        self._apps = wanted

    def mark(self, session_id: str, *, stopped: bool) -> None:
        """Record that the operator stopped (or started) a session; durable on return."""
        wanted = self._stopped | {session_id} if stopped else self._stopped - {session_id}
        if wanted == self._stopped:
            return
        self._write(wanted, self._apps)
        self._stopped = wanted

    def forget(self, session_id: str) -> None:
        """Clear the session's entries (stopped, its App): it was deleted; durable on return."""
        stopped = self._stopped - {session_id}
        apps = {k: v for k, v in self._apps.items() if k != session_id}
        if stopped == self._stopped and apps == self._apps:
            return
        self._write(stopped, apps)
        self._stopped, self._apps = stopped, apps

    def _write(self, stopped: set[str], apps: dict[str, str]) -> None:
        document: dict[str, object] = {"stopped": sorted(stopped)}
        if apps:
            document["apps"] = dict(sorted(apps.items()))
        data = json.dumps(document, separators=(",", ":")).encode() + b"\n"
        try:
            # Whatever was left at the temporary name (a crash's leftover, or a FIFO
            # planted there, whose open for writing would wait for a reader) goes first,
            # so the create below makes a new regular file.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path + durable.TMP_SUFFIX)
            # The store's one implementation of an atomic replace: tmp in the home, write,
            # fsync, rename, fsync of the home.
            durable.write_file_atomic(self.path, data)
        except (SessionIOError, OSError) as exc:
            raise IntentError(self.path, f"cannot write: {exc}") from exc
