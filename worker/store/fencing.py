"""The fencing token in the log: ``Owner`` and ``Handoff`` records (docs/scaling.md).

One rule, used by open (every epoch it reads) and by append (before a byte is written):
tokens never go backwards; a ``Handoff`` is made by the current owner with its own
token; after a ``Handoff`` only an ``Owner`` with a higher token may follow. The rule
spans epochs: the commit carries the fence (its token and node; a log never ends an
epoch sealed) in the next ``SessionStart``, and open of the newest epoch starts from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from worker.store.errors import NotOwnerNow
from worker.store.format.dataclass_methods import Value
from worker.store.format.records import Handoff, Owner, Record


@dataclass(frozen=True, slots=True, repr=False, eq=False)
class Fence(Value):
    """What the records read so far say about ownership."""

    token: int = 0  # the newest token of an Owner or Handoff; 0 when there is none
    node: str | None = None  # the node of the newest Owner
    sealed: Handoff | None = None  # the Handoff that ends the log, if nothing came after it


NO_FENCE = Fence()


def advance(fence: Fence, record: Record) -> Fence | str:
    """Return the fence after ``record``, or why ``record`` may not come after ``fence``."""
    if fence.sealed is not None:
        if not isinstance(record, Owner):
            return (
                f"{record.TYPE} after Handoff to {fence.sealed.to!r}: the log is sealed, only "
                "an Owner with a higher token may follow"
            )
        if record.token <= fence.sealed.token:
            return (
                f"Owner.token {record.token} after Handoff with token {fence.sealed.token}: "
                "the new owner's token must be higher"
            )
        return Fence(record.token, record.node, None)
    if isinstance(record, Owner):
        if record.token < fence.token:
            return f"Owner.token {record.token} goes backwards (the log holds token {fence.token})"
        return Fence(record.token, record.node, None)
    if isinstance(record, Handoff):
        if fence.token == 0 or record.token != fence.token:
            return (
                f"Handoff.token {record.token} is not the current owner's token "
                f"({fence.token or 'no Owner in this epoch'})"
            )
        return Fence(fence.token, fence.node, record)
    return fence


class _Appending(Protocol):
    """What ``write_owner`` needs of a session (``worker.session.Session``)."""

    @property
    def fence(self) -> Fence: ...

    @property
    def log_path(self) -> str: ...

    def append(self, record: Record) -> None: ...


def write_owner(session: _Appending, node: str, token: int) -> None:
    """Record that ``node`` writes with ``token`` from now on; refuse a log with a newer token.

    A log whose newest token is higher was written by a later owner: this node lost the
    session and must not serve this copy (NotOwnerNow; the node quarantines it).
    """
    fence = session.fence
    if fence.token > token:
        raise NotOwnerNow(
            session.log_path, f"the log holds token {fence.token}, newer than this node's {token}"
        )
    if fence.token < token or fence.sealed is not None:
        session.append(Owner(node=node, token=token))
