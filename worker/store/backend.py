"""The log backend seam: what a session's storage offers the store (docs/format.md).

A session is the same named byte strings on every backend: ``<n>.baseline.json`` and
``<first>-<last>.keys`` written whole, ``<n>.jsonl`` appended to one group at a time.
The reading code (open, verify, inspect, a key's confirmation) reads them through
``StoredFiles``; a session directory's fd (the file store, the embedded default) is
read with ``worker.store.disk.files`` as before, any other backend through its object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from worker.store.baseline import Baseline

_Opened_co = TypeVar("_Opened_co", covariant=True)


class StoredFiles(Protocol):
    """A session's named byte strings, read as the loader reads a directory."""

    def names(self) -> list[str]:
        """The names the session holds (logs, baselines, key index segments)."""
        ...

    def read(self, name: str, path: str) -> bytes:
        """The whole of ``name``'s bytes; SessionIOError (``path``, ENOENT) if absent."""
        ...


class LogBackend(StoredFiles, Protocol):
    """A session's storage as a writer holds it: every durable operation of the store.

    A call returns once its bytes are durable (the file backend's fsync, a database's
    COMMIT) and the owner's fence was checked in the same step; it raises NotOwnerNow
    when another owner holds the session, and SessionIOError when the outcome is unknown.
    """

    def append_group(self, epoch: int, offset: int, data: bytes) -> None:
        """Append ``data`` (one group commit's lines) at ``offset`` of epoch ``epoch``'s log."""
        ...

    def start_epoch(self, epoch: int, files: dict[str, bytes], first_line: bytes) -> None:
        """Write ``files`` whole, then epoch ``epoch``'s log holding ``first_line``, at once."""
        ...

    def remove(self, names: list[str]) -> None:
        """Remove ``names`` (key index segments no SessionStart names any more)."""
        ...

    def check_fence(self) -> None:
        """Raise NotOwnerNow unless this writer's token is still the session's owner's."""
        ...

    def close(self) -> None:
        """Give the storage up (the lock, the connection); idempotent."""
        ...


class SessionStore(Protocol[_Opened_co]):
    """A store other than a home directory, passed where ``Session.create/open`` take a home."""

    def create_session(self, session_id: str, baseline: Baseline, slot: int) -> _Opened_co:
        """Create the session; SessionExists if it exists."""
        ...

    def open_session(self, session_id: str) -> _Opened_co:
        """Open the session as its owner; SessionNotFound if absent."""
        ...

    def open_or_create(self, session_id: str, baseline: Baseline, slot: int) -> _Opened_co:
        """Open the session, creating it if absent."""
        ...
