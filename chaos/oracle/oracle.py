"""The oracle: what must hold after a fault and after the resume, read from the real files.

Every check reads the bytes on disk (raw JSON lines, tolerant of a torn tail), not the
store's own view, so a broken store cannot vouch for itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from chaos.cases import CaseResult
from chaos.oracle import (
    salvage_checks,
    schedule_checks,
    summary_checks,
    tool_checks,
    version_checks,
)
from chaos.scenarios.scenarios import SESSION, SLOT, Scenario
from worker.store.disk.layout import SESSIONS_DIR
from worker.store.disk.scan_file import SCANS_DIR, read_summary
from worker.store.errors import SessionError
from worker.store.loader import load_session
from worker.store.session_state import SessionState

_LOG: Final = re.compile(r"(0|[1-9][0-9]*)\.jsonl")


@dataclass(slots=True)
class ClientLog:
    """What the client (the rig) was told: acknowledged keys and epochs, keys in flight."""

    acked: set[str] = field(default_factory=set)
    in_flight: set[str] = field(default_factory=set)
    acked_epoch: int = -1  # the newest epoch a client was told about; -1: none yet
    started: bool = False  # a worker said it was ready: later ones start without --create
    compacted: bool = False  # the operator's compaction was acknowledged
    # Requests sent again (the App contract's retry check) that got an error, not the
    # answer from the log: "key (error code)".
    refused_retries: list[str] = field(default_factory=list)
    answers: dict[str, dict[str, object]] = field(default_factory=dict)  # key -> first reply
    # What the rig saw go wrong while the case ran (invariant, detail), reported at the end.
    problems: list[tuple[str, str]] = field(default_factory=list)
    checks: set[str] = field(default_factory=set)  # the invariants those were judged by

    def problem(self, invariant: str, detail: str) -> None:
        self.problems.append((invariant, detail))

    def start(self, key: str) -> None:
        if key:
            self.in_flight.add(key)

    def ack(self, key: str, epoch: int) -> None:
        if key:
            self.acked.add(key)
            self.in_flight.discard(key)
        self.acked_epoch = max(self.acked_epoch, epoch)


@dataclass(slots=True)
class LogsView:
    """The session's logs as raw records (a torn last line left out), by epoch number."""

    epochs: dict[int, list[dict[str, object]]] = field(default_factory=dict)
    raw: dict[int, bytes] = field(default_factory=dict)
    baselines: dict[int, bytes] = field(default_factory=dict)
    home: str = ""  # where it was read (the operator tools' checks read beside the logs)

    def applied_keys(self) -> list[str]:
        return [
            str(r["key"])
            for n in sorted(self.epochs)
            for r in self.epochs[n]
            if r.get("type") == "User" and r.get("key")
        ]

    def closing_summary(self, epoch: int) -> str | None:
        records = self.epochs.get(epoch, [])
        if records and records[-1].get("type") == "EpochEnd":
            return str(records[-1].get("summary"))
        return None


def continues_group(record: dict[str, object]) -> bool:
    """Whether a raw log line says more lines of its group follow.

    A group commit marks every line but its last with ``"more":true`` (a line without
    it ends its group, as every line written before the marker existed does). A store
    that frames groups as ``"part":i,"parts":n`` instead is read the same way.
    """
    if record.get("more") is True:
        return True
    part, parts = record.get("part"), record.get("parts")
    return isinstance(part, int) and isinstance(parts, int) and part < parts


def incomplete_group_start(records: list[dict[str, object]]) -> int | None:
    """The index of the first line of an incomplete last group, or None if it is whole."""
    if not records or not continues_group(records[-1]):
        return None
    start = len(records) - 1
    while start > 0 and continues_group(records[start - 1]):
        start -= 1
    return start


def session_path(home: str) -> str:
    return os.path.join(home, SESSIONS_DIR, SESSION)


def log_files(home: str) -> list[str]:
    directory = session_path(home)
    if not os.path.isdir(directory):
        return []
    numbers = sorted(int(n[:-6]) for n in os.listdir(directory) if _LOG.fullmatch(n))
    return [os.path.join(directory, f"{n}.jsonl") for n in numbers]


def file_digests(home: str | os.PathLike[str]) -> dict[str, str]:
    """The SHA-256 of every file under ``home`` (to prove nothing changed), but the scan
    summaries (``<home>/scans``: a cache any open may rewrite, no session's state)."""
    digests = {}
    for directory, dirs, files in os.walk(home):
        if os.path.samefile(directory, home) and SCANS_DIR in dirs:
            dirs.remove(SCANS_DIR)
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                digests[path] = hashlib.sha256(f.read()).hexdigest()
    return digests


def snapshot_logs(home: str) -> LogsView:
    """Parse every log's whole lines (undecodable lines are kept out, not fatal)."""
    view = LogsView(home=home)
    for path in log_files(home):
        epoch = int(os.path.basename(path)[:-6])
        with open(path, "rb") as f:
            data = f.read()
        view.raw[epoch] = data
        records = []
        for line in data.split(b"\n")[:-1]:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        view.epochs[epoch] = records
        baseline = os.path.join(os.path.dirname(path), f"{epoch}.baseline.json")
        if os.path.exists(baseline):
            with open(baseline, "rb") as f:
                view.baselines[epoch] = f.read()
    return view


def check_after_fault(
    result: CaseResult, scenario: Scenario, log: ClientLog, view: LogsView
) -> None:
    """Right after the crash: nothing acknowledged is lost or cut, nothing unasked is there."""
    result.checked += ["acknowledged-on-disk", "on-disk-acknowledged-or-in-flight"]
    check_requests_complete(result, scenario, view, log.acked)
    on_disk = set(view.applied_keys())
    lost = sorted(log.acked - on_disk)
    if lost:
        result.violate("acknowledged-on-disk", f"acknowledged keys lost by the crash: {lost}")
    # A delivered schedule's key was asked for by its Schedule record
    # (chaos.oracle.schedule_checks).
    asked = log.acked | log.in_flight | schedule_checks.scheduled_keys(view.epochs)
    unasked = sorted(on_disk - asked)
    if unasked:
        result.violate("on-disk-acknowledged-or-in-flight", f"keys nobody sent: {unasked}")
    newest = max(view.epochs) if view.epochs else -1
    if newest < log.acked_epoch:
        result.violate(
            "acknowledged-on-disk",
            f"epoch {log.acked_epoch} was acknowledged; the disk has {newest}",
        )
    if tool_checks.drives_tools(scenario) and view.home:
        tool_checks.after_fault(result, scenario, log.acked, view.home)
    if salvage_checks.drives_salvage(scenario) and view.home:
        salvage_checks.after_fault(result, scenario, log.acked, view.home)


def check_requests_complete(
    result: CaseResult, scenario: Scenario, view: LogsView, keys: set[str] | None = None
) -> None:
    """Every keyed request on disk (or only ``keys``) is whole: its User is followed, in
    its group, by exactly the records that request appends; no log's last group is open.
    """
    result.checked.append("keyed-request-complete")
    for epoch, records in sorted(view.epochs.items()):
        for index, record in enumerate(records):
            key = record.get("key")
            if record.get("type") != "User" or not isinstance(key, str):
                continue
            if keys is not None and key not in keys:
                continue
            shape = scenario.shape(key)
            group = records[index : index + len(shape)]
            types = tuple(str(r.get("type")) for r in group)
            # A group commit may hold several requests (a pipelined batch): a request's
            # records may end inside it, where the next request's User begins.
            after = records[index + len(shape)] if index + len(shape) < len(records) else {}
            shared = after.get("type") == "User"
            if types != shape or (continues_group(group[-1]) and not shared):
                result.violate(
                    "keyed-request-complete",
                    f"request {key!r} in epoch {epoch} is {'+'.join(types)}"
                    f"{' (group still open)' if types == shape else ''}, "
                    f"not {'+'.join(shape)}",
                )
        if keys is None and incomplete_group_start(records) is not None:
            result.violate(
                "keyed-request-complete",
                f"epoch {epoch}'s last group is incomplete and the session opened",
            )


def check_final(
    result: CaseResult, scenario: Scenario, log: ClientLog, after_fault: LogsView, home: str
) -> None:
    """After the resume finished the scenario: the whole session, record by record."""
    view = snapshot_logs(home)
    check_final_view(
        result,
        scenario,
        log,
        after_fault,
        view,
        lambda: load_session(session_path(home), SESSION, history=True),
    )
    if tool_checks.drives_tools(scenario):
        tool_checks.final(result, scenario, log.acked, home)
    if salvage_checks.drives_salvage(scenario):
        salvage_checks.final(result, home)
    if view.epochs:
        newest = max(view.epochs)
        where = os.path.join("scans", f"{SESSION}.scan")
        summary = read_summary(home, SESSION)
        summary_checks.final(result, summary, where, newest, view.raw[newest])


def check_final_view(
    result: CaseResult,
    scenario: Scenario,
    log: ClientLog,
    after_fault: LogsView,
    view: LogsView,
    load: Callable[[], SessionState],
) -> None:
    """The final checks on ``view`` (the logs as stored) and ``load`` (the store's loader)."""
    result.checked += sorted(log.checks)
    for invariant, detail in log.problems:
        result.violate(invariant, detail)
    check_requests_complete(result, scenario, view)
    result.checked.append("final-state-opens")
    try:
        state: SessionState | None = load()
    except SessionError as exc:
        result.violate("final-state-opens", str(exc))
        state = None
    _check_keys(result, scenario, log, view)
    if scenario.compact is not None and log.compacted:
        result.checked.append("operator-summary-recorded")
        summaries = [view.closing_summary(n) for n in view.epochs]
        if scenario.compact[1] not in summaries:
            result.violate(
                "operator-summary-recorded",
                f"the operator's summary {scenario.compact[1]!r} closes no epoch: {summaries}",
            )
    _check_epochs(result, view)
    _check_resume(result, after_fault, view)
    if schedule_checks.drives_schedules(scenario):
        schedule_checks.final(result, scenario, log.acked, view.epochs)
    if version_checks.drives_versions(scenario):
        version_checks.final(result, scenario, after_fault.epochs, view.epochs, view.baselines)
    if state is not None and state.epoch >= 1:
        result.checked.append("carry-is-recorded-summary")
        if state.carry != view.closing_summary(state.epoch - 1):
            result.violate(
                "carry-is-recorded-summary",
                f"carry {state.carry!r} is not the last EpochEnd's summary",
            )


def _check_keys(result: CaseResult, scenario: Scenario, log: ClientLog, view: LogsView) -> None:
    result.checked += ["no-key-twice", "acknowledged-on-disk"]
    keys = view.applied_keys()
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        result.violate("no-key-twice", f"applied more than once: {twice}")
    wanted = {op.key for op in scenario.ops if op.key} | {k for k, _ in scenario.requests}
    missing = sorted((wanted | log.acked) - set(keys))
    if missing:
        result.violate("acknowledged-on-disk", f"after the resume, keys missing: {missing}")


def _check_epochs(result: CaseResult, view: LogsView) -> None:
    result.checked += [
        "one-epoch-end-last",
        "epochs-contiguous-and-consistent",
        "call-numbers-unique",
    ]
    numbers = sorted(view.epochs)
    if numbers != list(range(len(numbers))):
        result.violate("epochs-contiguous-and-consistent", f"epochs on disk: {numbers}")
    newest = numbers[-1] if numbers else -1
    last_call = 0
    for epoch in numbers:
        records = view.epochs[epoch]
        ends = [i for i, r in enumerate(records) if r.get("type") == "EpochEnd"]
        if len(ends) > 1 or (ends and ends[0] != len(records) - 1):
            result.violate("one-epoch-end-last", f"epoch {epoch}: EpochEnd at records {ends}")
        if epoch != newest and not ends:
            result.violate("one-epoch-end-last", f"older epoch {epoch} has no EpochEnd")
        start = records[0] if records else {}
        digest = hashlib.sha256(view.baselines.get(epoch, b"")).hexdigest()
        if (
            start.get("type"),
            start.get("epoch"),
            start.get("slot"),
            start.get("baseline"),
            start.get("session"),
        ) != ("SessionStart", epoch, SLOT, digest, SESSION):
            result.violate(
                "epochs-contiguous-and-consistent",
                f"epoch {epoch}: SessionStart {start} does not match its file, "
                f"slot {SLOT} and baseline {digest[:12]}",
            )
        if epoch >= 1:
            summary = view.closing_summary(epoch - 1)
            memory = _memory(view.baselines.get(epoch))
            if summary is not None and memory != summary:
                result.violate(
                    "carry-is-recorded-summary",
                    f"epoch {epoch} starts from memory {memory!r}, not {summary!r}",
                )
        for record in records:
            if record.get("type") == "ToolResult":
                call = int(str(record.get("call")))
                if call <= last_call:
                    result.violate("call-numbers-unique", f"call {call} after {last_call}")
                last_call = call


def _memory(baseline: bytes | None) -> object:
    """The ``memory`` of a baseline file's bytes; None if missing or unparsable."""
    try:
        document = json.loads(baseline or b"")
    except ValueError:
        return None
    return document.get("memory") if isinstance(document, dict) else None


def _check_resume(result: CaseResult, after_fault: LogsView, final: LogsView) -> None:
    """An EpochEnd that survived the crash is kept as it was: no second one, same summary."""
    result.checked += ["no-second-epoch-end-on-resume", "carry-is-recorded-summary"]
    for epoch, data in after_fault.raw.items():
        recorded = after_fault.closing_summary(epoch)
        if recorded is None or not data.endswith(b"\n"):
            continue
        if final.raw.get(epoch) != data:
            result.violate(
                "no-second-epoch-end-on-resume",
                f"epoch {epoch} ended with EpochEnd after the crash and was rewritten",
            )
        if final.closing_summary(epoch) != recorded:
            result.violate(
                "carry-is-recorded-summary",
                f"epoch {epoch}'s recorded summary {recorded!r} was replaced by "
                f"{final.closing_summary(epoch)!r}",
            )
