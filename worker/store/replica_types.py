"""What an owner ships to a follower's copy of a session, and why a copy refuses it.

A **step** is the unit of shipping (docs/scaling.md, "Replication"): either the bytes of
lines the owner appended to an epoch's log (one group commit, or, in catch-up, every
whole line after an offset), or an epoch commit's new epoch: its baseline's bytes and
its log's first line (``SessionStart``). Each carries where it continues the copy (the
epoch, the offset in that epoch's log and the CRC-32 of the log's bytes before it) and
the sender's fencing token.
"""

from __future__ import annotations

import zlib
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

    def to_message(self) -> list[int]:
        return [self.epoch, self.size, self.crc]

    @classmethod
    def from_message(cls, value: object) -> Position | None:
        """A position as the wire carries it (``[epoch, size, crc]``, or None); ValueError."""
        if value is None:
            return None
        if not isinstance(value, list | tuple) or len(value) != 3:
            raise ValueError("a position must be [epoch, size, crc]")
        if not all(type(v) is int and v >= 0 for v in value):
            raise ValueError("a position's epoch, size and crc must be integers >= 0")
        return cls(*value)


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

    @property
    def end(self) -> Position:
        """Where the copy ends once this step is applied (an epoch step's log is its
        first line)."""
        if self.is_epoch:
            return Position(self.epoch, len(self.data), zlib.crc32(self.data))
        return Position(self.epoch, self.offset + len(self.data),
                        zlib.crc32(self.data, self.prior_crc))  # fmt: skip

    def to_message(self) -> dict[str, object]:
        """The step as a wire message's fields (msgpack carries the bytes as bytes)."""
        return {
            "session": self.session, "epoch": self.epoch, "offset": self.offset,
            "prior_crc": self.prior_crc, "data": self.data, "token": self.token,
            "baseline": self.baseline,
        }  # fmt: skip

    @classmethod
    def from_message(cls, fields: object) -> Step:
        """The step a wire message carries; ValueError naming the first bad field."""
        problem = _step_problem(fields)
        if problem is not None:
            raise ValueError(problem)
        assert isinstance(fields, dict)
        return cls(
            fields["session"], fields["epoch"], fields["offset"], fields["prior_crc"],
            fields["data"], fields["token"], fields.get("baseline"),
        )  # fmt: skip

    def describe(self) -> str:
        """A few words naming the step, for errors and logs."""
        if self.is_epoch:
            return f"epoch {self.epoch}'s first files (token {self.token})"
        return (
            f"{len(self.data)} bytes at epoch {self.epoch} offset {self.offset} "
            f"(token {self.token})"
        )


def _step_problem(fields: object) -> str | None:
    if not isinstance(fields, dict):
        return "a step must be a map"
    for name in ("epoch", "offset", "prior_crc", "token"):
        value = fields.get(name)
        if type(value) is not int or value < 0:
            return f"step field {name!r} must be an integer >= 0"
    if not isinstance(fields.get("session"), str):
        return "step field 'session' must be a string"
    baseline = fields.get("baseline")
    if not isinstance(fields.get("data"), bytes) or not (
        baseline is None or isinstance(baseline, bytes)
    ):
        return "step fields 'data' and 'baseline' must be bytes"
    return None


class ReplicaRefused(PathError):
    """A copy refused a step before writing a byte of it; ``str()`` is ``<path>: <why>``."""


class StaleToken(ReplicaRefused):
    """The step's token is lower than the highest the copy has seen (a deposed owner)."""


class NotContinuing(ReplicaRefused):
    """The step does not continue the copy's chain where it ends (it is behind or diverged)."""
