"""The history of a ``loopd chaos cluster`` run: what the clients were told, what the disks hold.

``Request`` is one keyed request's end as its client saw it (``chaos/cluster/load.py``);
``LogEntry`` one record of a session's log that the checker reads (``User`` by its key,
``Owner`` and ``Handoff`` by their node and token), read raw from the files of every
epoch, oldest first; ``History`` all of it, with each session's final placement and the
verdict of ``loopd verify`` on every home. ``chaos/cluster/checker.py`` judges it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from worker.store.disk.layout import SESSIONS_DIR

OUTCOMES: Final = ("ack", "refused", "unknown")
STALLED_AFTER: Final = 30.0
"""A session with no acknowledgement for this long at the end of the load is reported."""
_LOG: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")


@dataclass(frozen=True)
class Request:
    """One keyed request: its outcome and, if acknowledged, the reply's token and node."""

    process: int
    session: str
    key: str
    outcome: str
    start: float
    end: float
    token: int | None = None
    node: str | None = None
    duplicate: bool = False
    attempts: int = 1
    errors: tuple[str, ...] = ()

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> Request:
        return cls(process=int(event["p"]), session=str(event["s"]), key=str(event["k"]),
                   outcome=str(event["outcome"]), start=float(event["t0"]),
                   end=float(event["t1"]), token=event.get("token"), node=event.get("node"),
                   duplicate=bool(event.get("duplicate")), attempts=int(event["attempts"]),
                   errors=tuple(event.get("errors", ())))  # fmt: skip


@dataclass(frozen=True)
class LogEntry:
    """``kind`` "user" (``key``), "owner" (``node``, ``token``) or "handoff" (``node``: to)."""

    kind: str
    key: str | None = None
    node: str | None = None
    token: int | None = None


@dataclass
class SessionLog:
    """One copy of a session on one node's disk, and what ``loopd verify`` said of it."""

    node: str
    session: str
    entries: list[LogEntry]
    verified: bool
    verdict: str


@dataclass
class History:
    requests: list[Request] = field(default_factory=list)
    placement: dict[str, str | None] = field(default_factory=dict)
    """Each session's final node (etcd's placement at the end)."""
    logs: dict[tuple[str, str], SessionLog] = field(default_factory=dict)
    """(node, session) -> its copy on that node's disk."""
    faults: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": [asdict(r) for r in self.requests],
            "placement": self.placement,
            "logs": [asdict(log) for log in self.logs.values()],
            "faults": self.faults,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        requests = [Request(**{**r, "errors": tuple(r["errors"])}) for r in data["requests"]]
        return cls(requests=requests, placement=data["placement"], logs=_logs(data["logs"]),
                   faults=data["faults"])  # fmt: skip


def _logs(raws: list[dict[str, Any]]) -> dict[tuple[str, str], SessionLog]:
    logs = {}
    for raw in raws:
        entries = [LogEntry(**entry) for entry in raw["entries"]]
        log = SessionLog(**{**raw, "entries": entries})
        logs[(log.node, log.session)] = log
    return logs


def read_requests(path: Path) -> tuple[list[Request], list[str]]:
    """The requests of one load process's output; lines that are not events, as notes."""
    requests, notes = [], []
    for line in path.read_text(errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            notes.append(line[:300])
            continue
        if isinstance(event, dict) and event.get("ev") == "request":
            requests.append(Request.from_event(event))
    return requests, notes


def read_entries(session_dir: Path) -> list[LogEntry]:
    """The User, Owner and Handoff records of every epoch's log, oldest first (raw JSON
    lines: a line that does not decode is skipped, ``loopd verify`` judges the files)."""
    numbers = sorted(int(n[:-6]) for n in os.listdir(session_dir) if _LOG.fullmatch(n))
    entries = []
    for number in numbers:
        for line in (session_dir / f"{number}.jsonl").read_bytes().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            kind = record.get("type") if isinstance(record, dict) else None
            if kind == "User":
                entries.append(LogEntry("user", key=record.get("key")))
            elif kind == "Owner":
                entries.append(LogEntry("owner", node=record["node"], token=record["token"]))
            elif kind == "Handoff":
                entries.append(LogEntry("handoff", node=record["to"], token=record["token"]))
    return entries


def verify_home(home: Path) -> dict[str, str]:
    """``loopd verify --home`` on a stopped node's home: each session's line."""
    done = subprocess.run(
        [sys.executable, "-m", "supervisor", "verify", "--home", str(home)],
        check=False, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    verdicts = {}
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("ok", "REFUSED"):
            verdicts[os.path.basename(words[1].rstrip(":"))] = line.strip()
    return verdicts


def read_node(node: str, home: Path) -> list[SessionLog]:
    """Every session copy on ``node``'s home (``home``: as the machine sees it)."""
    sessions = home / SESSIONS_DIR
    if not sessions.is_dir():
        return []
    verdicts = verify_home(home)
    logs = []
    for name in sorted(os.listdir(sessions)):
        verdict = verdicts.get(name, "not judged by loopd verify")
        logs.append(SessionLog(node=node, session=name, entries=read_entries(sessions / name),
                               verified=verdict.startswith("ok"), verdict=verdict))  # fmt: skip
    return logs


def stalled(history: History, *, longer_than: float = STALLED_AFTER) -> list[str]:
    """Each session no request of which was acknowledged for the last ``longer_than``
    seconds of the load (or at all), with the last error its clients got."""
    if not history.requests:
        return []
    end = max(r.end for r in history.requests)
    found = []
    for session in sorted({r.session for r in history.requests}):
        mine = [r for r in history.requests if r.session == session]
        acks = [r.end for r in mine if r.outcome == "ack"]
        last = max(acks) if acks else min(r.start for r in mine)
        if end - last > longer_than:
            errors = [e for r in sorted(mine, key=lambda r: r.end) for e in r.errors]
            said = errors[-1][:200] if errors else "no error recorded"
            found.append(f"{session}: nothing acknowledged for the last {end - last:.0f} s "
                         f"of the load; last error: {said}")  # fmt: skip
    return found


def recovery_times(history: History) -> None:
    """How long each fault kept writes away, into its detail: for a promotion of the
    database's standby, the seconds from it to the first acknowledgement that ended
    after it (``resumed_s``); for a killed node's host, for each session whose last
    acknowledgement before the kill came from that node, the seconds from the last of
    its processes reaped to the session's next acknowledgement of a request begun after
    it (``served_again_s``); None if there was none before the next fault began (that
    fault's time is not this one's); for a standby's loss, the requests acknowledged
    while it was down and the longest time without one (``writes_while_down``)."""
    acks = sorted((r for r in history.requests if r.outcome == "ack"), key=lambda r: r.end)
    starts = sorted(float(f["applied"]) for f in history.faults if f.get("applied"))
    for fault in history.faults:
        detail = fault["detail"]
        at = detail.get("promoted_at")
        if fault["kind"] == "kill-db-primary" and at is not None:
            after = [r.end for r in acks if r.end > at]
            detail["resumed_s"] = round(after[0] - at, 3) if after else None
        if fault["kind"] == "kill-db-standby" and "killed_at" in detail:
            detail.update(writes_while_down(acks, detail["killed_at"], detail["heal_began"]))
        if fault["kind"] == "kill-host" and fault["applied"]:
            applied, node = float(fault["applied"]), fault["targets"][0]
            killed = float(detail.get("killed_at", applied))
            until = next((s for s in starts if s > applied), float("inf"))
            last: dict[str, Request] = {}
            for request in acks:
                if request.end < applied:
                    last[request.session] = request
            served: dict[str, float | None] = {}
            for session in sorted(s for s, r in last.items() if r.node == node):
                mine = [r for r in acks if r.session == session and r.start > killed]
                later = [r.end for r in mine if r.end < until]
                served[session] = round(later[0] - killed, 3) if later else None
            detail["served_again_s"] = served


def writes_while_down(acks: list[Request], down: float, up: float) -> dict[str, Any]:
    """Of a standby's loss, from the last of its processes reaped (``down``) to the start
    of its heal (``up``): how many requests begun after the one were acknowledged before
    the other (each needed a COMMIT the other standby confirmed; a reply in flight at the
    kill is not counted), and the longest time without an acknowledgement."""
    ends = [r.end for r in acks if down < r.start and r.end < up]
    edges = [down, *ends, up]
    pause = max(b - a for a, b in itertools.pairwise(edges))
    return {"acked_while_down": len(ends), "longest_pause_s": round(pause, 3)}


_SERVED: Final = "served again after a host kill"
_RESUMED: Final = "writes resumed after a promotion"
_PAUSED: Final = "longest pause in writes while a standby was down"
_NEVER: Final = {_SERVED: "not before the next fault", _RESUMED: "not before the next fault",
                 _PAUSED: "nothing acknowledged while it was down"}  # fmt: skip


def recovery_summary(history: History) -> list[str]:
    """One line per measure of ``recovery_times``: how many, p50, p99, max, never."""
    measures: dict[str, list[float | None]] = {what: [] for what in _NEVER}
    for fault in history.faults:
        detail = fault["detail"]
        measures[_SERVED] += detail.get("served_again_s", {}).values()
        if "resumed_s" in detail:
            measures[_RESUMED].append(detail["resumed_s"])
        if "longest_pause_s" in detail:
            paused = detail["longest_pause_s"] if detail["acked_while_down"] else None
            measures[_PAUSED].append(paused)
    lines = []
    for what, values in measures.items():
        seen = sorted(v for v in values if v is not None)
        if not values:
            continue
        never = len(values) - len(seen)
        if not seen:
            lines.append(f"{what}: {_NEVER[what]}, {never} times")
            continue
        p99 = seen[min(len(seen) - 1, int(0.99 * len(seen)))]
        lines.append(f"{what}: {len(seen)} times, p50 {seen[len(seen) // 2]:.2f} s, "
                     f"p99 {p99:.2f} s, max {seen[-1]:.2f} s; {_NEVER[what]} "
                     f"{never}")  # fmt: skip
    return lines
