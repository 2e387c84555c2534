"""The log records: frozen dataclasses built with keyword arguments.

Their encoding lives beside them in ``worker.records`` (which re-exports them); no
other module touches the bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import ClassVar, Final

from worker.store.format.dataclass_methods import Value
from worker.store.format.writer_app import stamped_app, stamped_version

_second: tuple[int, str] = (-1, "")  # the last whole second formatted, and its text


def utc_now() -> str:
    """Return the current time as RFC 3339 UTC with microseconds, e.g. ``...T20:17:57.123456Z``."""
    # Every record pays for this on the append path: the date and time of day are
    # formatted once per second (time.gmtime and an f-string), the microseconds per call.
    # One tuple read and written whole, so that threads never mix two seconds.
    global _second  # noqa: PLW0603 - a one-entry cache
    seconds, fraction = divmod(time.time_ns() // 1000, 1_000_000)
    cached = _second
    if cached[0] != seconds:
        t = time.gmtime(seconds)
        cached = _second = (
            seconds,
            f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T"
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}.",
        )
    return f"{cached[1]}{fraction:06d}Z"


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class SessionStart(Value):
    """First record of every epoch log: names the session, the epoch, slot and baseline hash."""

    TYPE: ClassVar[str] = "SessionStart"
    # Optional blocks of fields, each written whole or not at all, and a block only
    # with every block before it: lines from before a block existed read as before.
    OPTIONAL: ClassVar[tuple[tuple[str, ...], ...]] = (
        ("next_call", "prior_users", "prior_untrusted", "recent_keys"),
        ("key_index",),
        ("prior_log_size", "prior_log_crc"),
        ("fence_token", "fence_node"),
        ("forked_from",),
    )
    # Blocks that may join any of those shapes, after all of them: the App that wrote
    # this SessionStart, in every epoch's, the first included (docs/format.md, "Apps").
    FREE: ClassVar[tuple[tuple[str, ...], ...]] = (("app", "app_version"),)
    # The fields the closing EpochEnd's ``carried`` digest binds: the first two blocks,
    # and the fence block when the line holds it (logs written before it bind five).
    CARRIED: ClassVar[tuple[str, ...]] = (
        "next_call",
        "prior_users",
        "prior_untrusted",
        "recent_keys",
        "key_index",
    )
    FENCE: ClassVar[tuple[str, ...]] = ("fence_token", "fence_node")
    time: str = field(default_factory=utc_now)
    session: str
    epoch: int
    slot: int
    baseline: str
    # What open needs from the older epochs, carried forward by the epoch commit so
    # that open reads the newest epoch only (docs/format.md). All four or none: epoch 0
    # and logs written before they existed have none.
    next_call: int | None = None
    prior_users: int | None = None
    prior_untrusted: int | None = None
    recent_keys: str | None = None  # JSON object {key: line} of the previous epoch's keys
    # The key index of every older epoch: its segment files and their digests
    # (worker.store.key_index); absent in logs written before it existed.
    key_index: str | None = None
    # The previous epoch's log as it was sealed: its length and the CRC-32 of all its
    # bytes, 8 lowercase hex digits (worker.store.format.line_checksums); absent in logs
    # written before checksums.
    prior_log_size: int | None = None
    prior_log_crc: str | None = None
    # The fence of the older epochs (worker.store.fencing): the newest Owner's token and
    # node, 0 and "" when none wrote one; absent in logs written before it was carried.
    fence_token: int | None = None
    fence_node: str | None = None
    # The session this one was forked from (``loopd fork``), in the SessionStart of the
    # first epoch the fork wrote: the epochs before it are that session's, shared with
    # it, and name it (docs/format.md, "Forks"). Absent in every other SessionStart.
    forked_from: str | None = None
    # The App (``module:attribute``) and version (worker.app.version) of the worker that
    # wrote this line, stamped by it (worker.store.format.writer_app); absent in lines written
    # before Apps were versioned and by a process that hosts no App (``loopd fork``).
    app: str | None = field(default_factory=stamped_app)
    app_version: str | None = field(default_factory=stamped_version)

    @property
    def carries_state(self) -> bool:
        """True when this SessionStart carries the cumulative state of the older epochs."""
        return self.next_call is not None

    @property
    def carried_fields(self) -> dict[str, object]:
        """The carried fields by name, as the previous EpochEnd's ``carried`` digest binds them."""
        names = self.CARRIED + (self.FENCE if self.fence_token is not None else ())
        return {name: getattr(self, name) for name in names}


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class User(Value):
    """A user's message; ``key`` is the client's request key (None when it gave none)."""

    TYPE: ClassVar[str] = "User"
    time: str = field(default_factory=utc_now)
    text: str
    untrusted: bool = False
    key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class Assistant(Value):
    """The assistant's reply text."""

    TYPE: ClassVar[str] = "Assistant"
    time: str = field(default_factory=utc_now)
    text: str


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class ToolResult(Value):
    """The result of tool call number ``call`` (>= 1, unique across all epochs)."""

    TYPE: ClassVar[str] = "ToolResult"
    time: str = field(default_factory=utc_now)
    call: int
    tool: str
    output: str
    ok: bool


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class Usage(Value):
    """Token accounting after a turn; ``context_tokens`` drives the automatic epoch commit."""

    TYPE: ClassVar[str] = "Usage"
    time: str = field(default_factory=utc_now)
    prompt_tokens: int
    completion_tokens: int
    context_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class EpochEnd(Value):
    """Last record of a closed epoch: the next epoch's number and the carried summary."""

    TYPE: ClassVar[str] = "EpochEnd"
    OPTIONAL: ClassVar[tuple[tuple[str, ...], ...]] = (("carried",),)
    time: str = field(default_factory=utc_now)
    next: int
    summary: str
    # SHA-256 (hex) of the carried fields the next SessionStart must hold
    # (worker.store.epochs.carried_state.carried_digest); absent in logs written before it.
    carried: str | None = None


# -- cluster ownership (docs/scaling.md): the fencing token in the log ----------------


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class Owner(Value):
    """From here on ``node`` writes this session with fencing token ``token`` (etcd's revision)."""

    TYPE: ClassVar[str] = "Owner"
    time: str = field(default_factory=utc_now)
    node: str
    token: int


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class Handoff(Value):
    """The owner holding ``token`` sealed the log for a move to ``to``: no write follows it.

    Only an ``Owner`` with a higher token may come after it (the new owner).
    """

    TYPE: ClassVar[str] = "Handoff"
    time: str = field(default_factory=utc_now)
    to: str
    token: int


# -- durable timers (docs/format.md, "Schedules") ---------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class Schedule(Value):
    """A request to apply at or after ``at`` (the records' time format), under key ``key``.

    Pending while no request with ``key`` was applied and no ``Unschedule`` cancelled it;
    an epoch commit carries every pending one into the next epoch's log, unchanged.
    """

    TYPE: ClassVar[str] = "Schedule"
    time: str = field(default_factory=utc_now)
    key: str
    at: str
    text: str
    untrusted: bool = False


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class Unschedule(Value):
    """The pending ``Schedule`` with ``key`` is cancelled: it is never delivered."""

    TYPE: ClassVar[str] = "Unschedule"
    time: str = field(default_factory=utc_now)
    key: str


# -- App versions (docs/format.md, "Apps") ---------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True, repr=False, eq=False)
class AppChanged(Value):
    """From here on the epoch is served by ``app`` at ``to_version``, not ``from_version``.

    Written alone by a worker that resumes a session mid-epoch under another version of
    the App its epoch's SessionStart (or the last AppChanged after it) names.
    """

    TYPE: ClassVar[str] = "AppChanged"
    time: str = field(default_factory=utc_now)
    app: str
    from_version: str
    to_version: str


Record = (
    SessionStart | User | Assistant | ToolResult | Usage | EpochEnd | Owner | Handoff
    | Schedule | Unschedule | AppChanged
)  # fmt: skip
RECORD_TYPES: Final[tuple[type[Record], ...]] = (
    SessionStart,
    User,
    Assistant,
    ToolResult,
    Usage,
    EpochEnd,
    Owner,
    Handoff,
    Schedule,
    Unschedule,
    AppChanged,
)
