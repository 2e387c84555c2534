"""Crash-state deduplication: recover and check each distinct crash state once.

Many cases leave the same recovery input: a kill just before and just after an fsync
leaves the same page-cache view, a power loss at any boundary between two fsyncs the
same durable image. What the rest of a case does (the resumes, every check after the
fault, the App contract) depends only on:

- the case's own fields other than its first fault (scenario, App, mutant, the
  recovery crash of a compound, anything a later field adds), which say how the
  recovery runs;
- every file and directory in the case's directory (the home and the App's
  ``outside/``), by name, type, mode and bytes: what the fault left (a scan summary by
  what it says of its log, below);
- the client's view (every field of ``ClientLog``: acknowledged keys and epochs, keys
  in flight, whether a worker was ever ready, retries refused);
- for a "then power loss" compound before its resume, the durability model and the
  boundary the power fails at.

The key hashes all of that. Record timestamps (``"time":"...Z"``, fixed width) are
written as one placeholder: no check and no part of the store reads them, and every
run writes new ones, so without this no two cases would ever share a state. So are the
lines' checksums (``"crc"``, and a sealed log's ``"prior_log_crc"``): each covers the
bytes before it, timestamps included, so they differ wherever the times do; the same
writer (the same case fields, mutant included) writes them alike, so two states equal
but for times and checksums are both valid or both not. A line cut inside a timestamp
or a checksum is hashed as it is (no sharing, never a wrong one).

A case whose key was checked already gets that state's verdict (its invariants checked,
its violations, its notes) and names the case that checked it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from typing import Final

from chaos.cases import Case, CaseResult
from chaos.faults.model import DurableModel
from chaos.oracle.oracle import ClientLog
from worker.store.disk.scan_file import SCANS_DIR
from worker.store.format.scan_summary import decode

_TIME: Final = re.compile(
    rb'"time":"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\.[0-9]{6}Z"'
    rb'|"(?:prior_log_)?crc":"[0-9a-f]{8}"'
)


def _placeholder(found: re.Match[bytes]) -> bytes:
    return found.group(0).split(b":", 1)[0] + b':"-"'


_TIME_PLACEHOLDER: Final = _placeholder
# The fields of a case that only say what its first fault was: the files and the
# client's view it left stand for them.
_FIRST_FAULT: Final = frozenset({"fault", "variant", "at"})


def state_key(
    case: Case,
    root: str,
    log: ClientLog,
    *,
    skip: frozenset[str] = frozenset(),
    model: DurableModel | None = None,
) -> str:
    """The key of the recovery input of ``case`` now: its directory ``root`` (less the
    names in ``skip``), the client's view ``log`` and, when given, the durability model
    (module doc). ``power_at`` counts only with a model: after the power loss the files
    say what it left."""
    fields = {
        f.name: getattr(case, f.name)
        for f in dataclasses.fields(case)
        if f.name not in _FIRST_FAULT and (model is not None or f.name != "power_at")
    }
    digest = hashlib.sha256()
    digest.update(json.dumps([fields, _log_fields(log)], sort_keys=True, default=_plain).encode())
    _hash_tree(digest, root, skip)
    if model is not None:
        _hash_model(digest, model)
    return digest.hexdigest()[:32]


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return repr(value)


def _log_fields(log: ClientLog) -> dict[str, object]:
    return {f.name: getattr(log, f.name) for f in dataclasses.fields(log)}


def _hash_tree(digest: hashlib._Hash, root: str, skip: frozenset[str]) -> None:
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        if directory == root:
            dirs[:] = [d for d in dirs if d not in skip]
        for name in sorted(files):
            if directory == root and name in skip:
                continue
            path = os.path.join(directory, name)
            info = os.lstat(path)
            head = f"\0{os.path.relpath(path, root)}\0{info.st_mode:o}\0".encode()
            digest.update(head)
            if stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    data = f.read()
                if os.path.basename(directory) == SCANS_DIR:
                    data = _summary_content(data)
                digest.update(_TIME.sub(_TIME_PLACEHOLDER, data))
            elif stat.S_ISLNK(info.st_mode):
                digest.update(os.readlink(path).encode())
        for name in dirs:
            path = os.path.join(directory, name)
            mode = os.lstat(path).st_mode
            digest.update(f"\0{os.path.relpath(path, root)}/\0{mode:o}\0".encode())
            if stat.S_ISLNK(mode):  # os.walk does not enter a link to a directory
                digest.update(os.readlink(path).encode())


def _summary_content(data: bytes) -> bytes:
    """A scan summary as what it says of its log: its CRC-32 and Adler-32 are of bytes
    that hold timestamps, and so differ wherever the log's times do (module doc)."""
    summary = decode(data)
    if summary is None:
        return data
    said = [summary.epoch, summary.size, summary.lines, summary.names, summary.types.hex(),
            summary.calls.hex(), summary.keys.decode("ascii", "replace")]  # fmt: skip
    return summary.first + json.dumps(said).encode()


def _hash_model(digest: hashlib._Hash, model: DurableModel) -> None:
    """The model's namespaces relative to its root, each inode named by first sight."""
    inodes: dict[int, int] = {}

    def rel(path: str) -> str:
        return os.path.relpath(path, model.root)

    def inode(state: object) -> int:
        return inodes.setdefault(id(state), len(inodes))

    described = []
    for name, space in (("volatile", model.volatile), ("durable", model.durable)):
        for path in sorted(space):
            state = space[path]
            content = None
            if state.content is not None:
                content = hashlib.sha256(_TIME.sub(_TIME_PLACEHOLDER, state.content)).hexdigest()
            described.append([name, rel(path), inode(state), state.size, state.durable,
                              content, state.lost])  # fmt: skip
    dirs = [sorted(rel(d) for d in model.volatile_dirs), sorted(rel(d) for d in model.durable_dirs)]
    digest.update(json.dumps([described, dirs]).encode())


@dataclass(slots=True)
class Mark:
    """How much of a result existed when its state's key was taken."""

    checked: int
    violations: int
    notes: int

    @classmethod
    def of(cls, result: CaseResult) -> Mark:
        return cls(len(result.checked), len(result.violations), len(result.notes))


@dataclass(slots=True)
class Verdict:
    """What checking one crash state added to its case's result."""

    state: str
    checked_by: str
    checked: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def give(self, result: CaseResult) -> None:
        """Give this verdict to a case that reached the same state."""
        result.checked += self.checked
        for violation in self.violations:
            result.violations.append(violation)
            result.outcome = "violation"
        result.notes += self.notes
        result.notes.append(f"same crash state as {self.checked_by}: its verdict")
        result.state = self.state
        result.checked_by = self.checked_by


class StateCache:
    """The verdicts of the crash states checked so far, in this process and (through
    ``directory``, one small file per state) in the other processes of the run."""

    def __init__(self, directory: str | None = None) -> None:
        self.directory = directory
        self.known: dict[str, Verdict] = {}
        if directory is not None:
            os.makedirs(directory, exist_ok=True)

    def get(self, key: str) -> Verdict | None:
        found = self.known.get(key)
        if found is not None or self.directory is None:
            return found
        try:
            with open(os.path.join(self.directory, key), encoding="utf-8") as f:
                found = Verdict(**json.load(f))
        except FileNotFoundError:
            return None
        self.known[key] = found
        return found

    def put(self, key: str, result: CaseResult, mark: Mark) -> None:
        """Keep what ``result`` gained since ``mark`` as the verdict of state ``key``."""
        verdict = Verdict(
            state=result.state or key,
            checked_by=result.checked_by or result.case,
            checked=result.checked[mark.checked :],
            violations=result.violations[mark.violations :],
            notes=result.notes[mark.notes :],
        )
        self.known[key] = verdict
        if self.directory is None:
            return
        path = os.path.join(self.directory, key)
        partial = f"{path}.{os.getpid()}.part"
        with open(partial, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(verdict), f)
        os.replace(partial, path)
