"""What an owner ships to a follower's copy of a session, and why a copy refuses it.

A **step** is the unit of shipping (docs/scaling.md, "Replication"): either the bytes of
lines the owner appended to an epoch's log (one group commit, or, in catch-up, every
whole line after an offset), or an epoch commit's new epoch: its baseline's bytes and
its log's first line (``SessionStart``). Each carries where it continues the copy (the
epoch, the offset in that epoch's log and the CRC-32 of the log's bytes before it) and
the sender's fencing token.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.store.errors import PathError


@dataclass(frozen=True, slots=True)
class Position:
    """Where a copy's newest log ends: its epoch, its length and the CRC-32 of its bytes."""

    epoch: int
    size: int
    crc: int

    def __str__(self) -> str:
        return f"epoch {self.epoch}, {self.size} bytes, CRC-32 {self.crc:08x}"


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a session's log as its owner wrote it (``baseline`` None: an append).

    An append: ``data`` is whole lines of epoch ``epoch``'s log that follow its first
    ``offset`` bytes, whose CRC-32 is ``prior_crc``. An epoch step: ``data`` is the new
    epoch's log (its ``SessionStart`` line alone), ``baseline`` the bytes of its
    baseline file, ``offset`` and ``prior_crc`` 0 (the ``SessionStart`` records the
    sealed log's length and CRC-32: that is its link to the chain). ``token`` is the
    fencing token of the sender, the owner that ships it.
    """

    session: str
    epoch: int
    offset: int
    prior_crc: int
    data: bytes
    token: int
    baseline: bytes | None = None

    @property
    def is_epoch(self) -> bool:
        """True for an epoch step (the new epoch's files)."""
        return self.baseline is not None

    def describe(self) -> str:
        """A few words naming the step, for errors and logs."""
        if self.is_epoch:
            return f"epoch {self.epoch}'s first files (token {self.token})"
        return (
            f"{len(self.data)} bytes at epoch {self.epoch} offset {self.offset} "
            f"(token {self.token})"
        )


class ReplicaRefused(PathError):
    """A copy refused a step before writing a byte of it; ``str()`` is ``<path>: <why>``."""


class StaleToken(ReplicaRefused):
    """The step's token is lower than the highest the copy has seen (a deposed owner)."""


class NotContinuing(ReplicaRefused):
    """The step does not continue the copy's chain where it ends (it is behind or diverged)."""
