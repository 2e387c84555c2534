"""A salvage's plan: what it cuts, written durably before its first rename.

Salvage moves several files (the later epochs' logs, baselines and index files) into
quarantine one rename at a time, then truncates the kept log. A kill or a power loss
between those steps would leave a session with a gap in its epochs and acknowledged
keys in quarantine that nothing reported. So before it changes anything, salvage
writes this plan into the session directory (``salvage.plan``: written, fsynced,
renamed into place, the directory fsynced); every step after it can be done again
from the plan, whether or not it happened; the plan is moved last, into the quarantine
directory beside what it cut, where it stays as the record of the salvage.

While the plan is in the session directory the session is half cut: open, verify and
every operator tool refuse it, pointing to ``loopd salvage``, which finishes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from worker.store.errors import PathError

# Open's check for a plan is its own module, which open loads without the plan's types.
from worker.store.unfinished_salvage import (
    PLAN_NAME,
    UnfinishedSalvage,
    plan_present,
    refuse_unfinished_salvage,
    unfinished_why,
)

__all__ = [
    "FORMAT",
    "PLAN_NAME",
    "BadPlan",
    "Cut",
    "SalvagePlan",
    "UnfinishedSalvage",
    "plan_present",
    "refuse_unfinished_salvage",
    "unfinished_why",
]

FORMAT: Final = "loopd-salvage-plan 1"


class BadPlan(PathError):
    """The plan file is not one salvage wrote; ``why`` says what is wrong."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cut:
    """What was cut from one log: its epoch, the lines, the records' types and keys."""

    epoch: int
    first_line: int  # the first line cut (from 1)
    last_line: int
    whole: bool  # the whole epoch went (its log and baseline)
    records: tuple[str, ...]  # "line 9: User key=k3", "line 12: undecodable"
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SalvagePlan:
    """Everything a salvage does, decided before it does any of it."""

    session: str
    refusal: str  # what the loader said first
    target: str  # the quarantine directory's name, in <home>/quarantine/<id>/
    keep_epoch: int
    keep_bytes: int  # of the kept newest log
    moves: tuple[str, ...]  # the session's files moved whole, newest epoch first
    tail_sha256: str | None  # of the kept newest log's lines cut, None if none are
    cuts: tuple[Cut, ...]

    def to_json(self) -> bytes:
        document = {
            "format": FORMAT,
            "session": self.session,
            "refusal": self.refusal,
            "target": self.target,
            "keep_epoch": self.keep_epoch,
            "keep_bytes": self.keep_bytes,
            "moves": list(self.moves),
            "tail_sha256": self.tail_sha256,
            "cuts": [
                {
                    "epoch": c.epoch,
                    "first_line": c.first_line,
                    "last_line": c.last_line,
                    "whole": c.whole,
                    "records": list(c.records),
                    "keys": list(c.keys),
                }
                for c in self.cuts
            ],
        }
        return json.dumps(document, indent=1).encode() + b"\n"

    @classmethod
    def from_json(cls, path: str, data: bytes) -> SalvagePlan:
        """Parse a plan; BadPlan naming ``path`` if it is not one."""
        try:
            document = json.loads(data)
            if document["format"] != FORMAT:
                raise ValueError(f"format {document['format']!r:.40}, not {FORMAT!r}")
            cuts = tuple(
                Cut(
                    epoch=int(c["epoch"]),
                    first_line=int(c["first_line"]),
                    last_line=int(c["last_line"]),
                    whole=bool(c["whole"]),
                    records=tuple(str(r) for r in c["records"]),
                    keys=tuple(str(k) for k in c["keys"]),
                )
                for c in document["cuts"]
            )
            tail = document["tail_sha256"]
            return cls(
                session=str(document["session"]),
                refusal=str(document["refusal"]),
                target=_plain_name(str(document["target"])),
                keep_epoch=int(document["keep_epoch"]),
                keep_bytes=int(document["keep_bytes"]),
                moves=tuple(_plain_name(str(m)) for m in document["moves"]),
                tail_sha256=None if tail is None else str(tail),
                cuts=cuts,
            )
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise BadPlan(path, f"is not a salvage plan loopd can read: {exc!s:.200}") from exc

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(key for cut in self.cuts for key in cut.keys)


def _plain_name(name: str) -> str:
    """A file name of one directory, never a path out of it."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"{name!r:.80} is not a plain file name")
    return name
