"""The rig's boundary hook, installed in a real worker process (the child of a case).

It counts the store's durable steps, records each one *before* the step runs and hands
the records to the rig over a pipe (at the latest just before the hook's own SIGKILL,
or at exit), so the rig knows exactly which steps completed when the process died; and
at boundary k it injects the case's fault: a SIGKILL, a torn write then a SIGKILL, an
errno raised from the step, or a file size limit that makes the real write short.
"""

from __future__ import annotations

import enum
import errno
import json
import os
import resource
import signal
from typing import Final

from chaos.faults.damage import DAMAGE_VARIANTS, damage_sealed
from worker.store.disk.durable import Boundary, Step

_FULL: Final = frozenset({errno.ENOSPC, errno.EDQUOT})


class FaultKind(enum.Enum):
    """The faults of the rig (SPEC section 7)."""

    NONE = "none"
    KILL = "kill"
    TORN = "torn"
    POWER = "power"
    IO = "io"
    SHORT = "short"
    DAMAGE = "damage"  # a sealed log changed on disk, outside any crash (chaos.faults.damage)
    LEASE = "lease"  # the cluster node's lease lapses at the step (chaos.cluster)
    HOSTILE = "hostile"  # a kill, then the disk is made hostile (chaos.run.hostile)


TORN_VARIANTS: Final = ("1byte", "half", "allbutlast", "lines")
POWER_VARIANTS: Final = ("drop", "prefix", "zeros", "names")
IO_ERRNOS: Final = {
    "eio": errno.EIO,
    "enospc": errno.ENOSPC,
    "edquot": errno.EDQUOT,
    "erofs": errno.EROFS,
}
# Which errors each step can really return (write(2), fsync(2), rename(2), mkdir(2),
# open(2) with O_CREAT, ftruncate(2)); a directory fsync only reports a failed writeback.
IO_VARIANTS_BY_STEP: Final = {
    Step.WRITE: ("eio", "enospc", "edquot"),
    Step.FSYNC: ("eio", "enospc", "edquot"),
    Step.FSYNC_DIR: ("eio",),
    Step.RENAME: ("eio", "enospc", "edquot", "erofs"),
    Step.MKDIR: ("eio", "enospc", "edquot", "erofs"),
    Step.CREATE: ("eio", "enospc", "edquot", "erofs"),
    Step.TRUNCATE: ("eio", "erofs"),
}
IO_VARIANTS: Final = tuple(IO_ERRNOS)
SHORT_VARIANTS: Final = ("fsize",)
LEASE_VARIANTS: Final = ("lapse",)
# What a hostile disk holds after the kill: a link where the next create writes; a FIFO
# or a socket in place of the log or baseline; a line with a trailing space or its keys
# in another order; a group whose middle part is gone; a damaged group before the last.
HOSTILE_AT_CREATE: Final = ("link",)
HOSTILE_AT_FSYNC: Final = ("fifo", "socket", "space", "reordered", "gap", "earlier")
# The fault kinds that apply only to the scenarios naming them (Scenario.extra_faults).
EXTRA_FAULTS: Final = frozenset({FaultKind.LEASE, FaultKind.HOSTILE})
# The cluster node's lease file, in a cluster worker's child (set by chaos.cluster).
lease_file: str | None = None
VARIANTS: Final = {
    FaultKind.NONE: ("-",),
    FaultKind.KILL: ("-",),
    FaultKind.TORN: TORN_VARIANTS,
    FaultKind.POWER: POWER_VARIANTS,
    FaultKind.IO: IO_VARIANTS,
    FaultKind.SHORT: SHORT_VARIANTS,
    FaultKind.DAMAGE: DAMAGE_VARIANTS,
    FaultKind.LEASE: LEASE_VARIANTS,
    FaultKind.HOSTILE: HOSTILE_AT_CREATE + HOSTILE_AT_FSYNC,
}


def applies(kind: FaultKind, step: Step) -> bool:
    """Whether a fault of ``kind`` can happen at a boundary of ``step``."""
    return bool(variants_at(kind, step))


def variants_at(kind: FaultKind, step: Step) -> tuple[str, ...]:
    """The variants of ``kind`` that can happen at a boundary of ``step`` (none: empty)."""
    if kind is FaultKind.NONE:
        return ()
    if kind in (FaultKind.TORN, FaultKind.SHORT):
        return VARIANTS[kind] if step is Step.WRITE else ()
    if kind is FaultKind.IO:
        return IO_VARIANTS_BY_STEP[step]
    if kind is FaultKind.LEASE:
        return LEASE_VARIANTS if step in (Step.WRITE, Step.FSYNC) else ()
    if kind is FaultKind.HOSTILE:
        return {Step.CREATE: HOSTILE_AT_CREATE, Step.FSYNC: HOSTILE_AT_FSYNC}.get(step, ())
    return VARIANTS[kind]


class EventPipe:
    """The child's end of the trace: JSON lines, buffered until ``flush``.

    Buffering is sound because the child only ever dies at the hook's own SIGKILL
    (which flushes first) or at its exit (which flushes too); events that need an
    answer (``opened``) flush at once.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer: list[str] = []

    def send(self, event: dict[str, object], *, flush: bool = False) -> None:
        self._buffer.append(json.dumps(event, separators=(",", ":")))
        if flush:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        data = ("\n".join(self._buffer) + "\n").encode()
        self._buffer.clear()
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]


class ChaosHook:
    """Counts boundaries, traces them, and injects one fault at boundary ``at``."""

    def __init__(
        self, events: EventPipe, kind: FaultKind, variant: str, at: int, *, trace: bool = True
    ) -> None:
        self.events = events
        self.kind = kind
        self.variant = variant
        self.at = at
        self.trace = trace  # only a power loss needs the rig to replay every step
        self.count = 0

    def __call__(self, boundary: Boundary) -> None:
        self.count += 1
        if not self.trace and self.count != self.at:
            return
        event: dict[str, object] = {
            "e": "step", "k": self.count, "step": boundary.step.value, "path": boundary.path,
        }  # fmt: skip
        if boundary.step is Step.WRITE:
            event["n"] = len(boundary.data)
        elif boundary.step is Step.TRUNCATE:
            event["n"] = boundary.length
        elif boundary.step is Step.RENAME:
            event["target"] = boundary.target
            event["old"] = _content_or_none(boundary.target)
        if self.count != self.at or self.variant not in variants_at(self.kind, boundary.step):
            self.events.send(event)
            return
        if self.kind is FaultKind.HOSTILE:
            self.events.send(event)  # the rig plants its damage where this step writes
        if self.kind in (FaultKind.KILL, FaultKind.POWER, FaultKind.HOSTILE):
            self._die()
        if self.kind is FaultKind.LEASE:
            self.events.send(event)
            _lapse_lease()
            self.events.send({"e": "lease_lapsed", "k": self.count}, flush=True)
            return
        if self.kind is FaultKind.TORN:
            assert boundary.fd is not None
            data = boundary.data
            keep = _torn_keep(data, self.variant)
            written = os.write(boundary.fd, data[:keep]) if keep > 0 else 0
            self.events.send({**event, "n": written, "torn": True})
            self._die()
        if self.kind is FaultKind.DAMAGE:
            self.events.send(event)
            damage_sealed(boundary.path, self.variant)
            return
        if self.kind is FaultKind.SHORT:
            assert boundary.fd is not None
            self.events.send(event)
            _limit_file_size(os.fstat(boundary.fd).st_size + len(boundary.data) // 2)
            return
        if self.kind is FaultKind.IO:
            code = IO_ERRNOS[self.variant]
            if boundary.step is Step.WRITE and code in _FULL and boundary.fd is not None:
                # A full disk (or quota) usually takes part of the write first.
                part = os.write(boundary.fd, boundary.data[: len(boundary.data) // 2])
                self.events.send({**event, "n": part})
            else:
                self.events.send({**event, "n": 0, "failed": True})
            self.events.send({"e": "io_error", "k": self.count, "errno": code})
            raise OSError(code, os.strerror(code))

    def _die(self) -> None:
        self.events.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("SIGKILL did not kill the process")


def _torn_keep(data: bytes, variant: str) -> int:
    """How many bytes of ``data`` a torn write of ``variant`` leaves.

    ``lines`` is a tear that lands on a line boundary: the whole lines of the first
    half (at least the first line), so a group commit cut short reads as whole lines.
    """
    if variant == "lines":
        return max(data.rfind(b"\n", 0, len(data) // 2), data.find(b"\n")) + 1
    return {"1byte": 1, "half": len(data) // 2, "allbutlast": len(data) - 1}[variant]


def _limit_file_size(limit: int) -> None:
    """Make the real ``write`` stop at ``limit`` bytes of any file from now on.

    With RLIMIT_FSIZE the kernel cuts a write that crosses the limit short (returning
    the count it wrote) and fails the next one with EFBIG; SIGXFSZ, which would kill the
    process, is ignored so the store sees both as a real short write and a full file.
    """
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))


def _lapse_lease() -> None:
    """The node's lease lapses: its file says nothing is proven (a deadline of 0)."""
    if lease_file is None:
        return
    fd = os.open(lease_file, os.O_WRONLY)
    try:
        os.pwrite(fd, bytes(32), 0)  # two copies of (0.0, lease 0): unproven
    finally:
        os.close(fd)


def _content_or_none(path: str | None) -> str | None:
    if path is None or not os.path.exists(path):
        return None
    with open(path, "rb") as f:
        return f.read().hex()
