"""Run one case at the PostgreSQL seam: a worker with its fault, the resume, the oracle.

The child is forked from the warm rig, as a file case's is, and runs a store-level
scenario against ``PostgresStore`` in the case's own schema. The rig records what was
acknowledged, acts on the database when the fault asks it to, lets fresh workers
resume (each claims the session, so a deposed one is fenced out), then judges the
session as stored with the file cases' oracle and reads it back through the loader.
"""

from __future__ import annotations

import gc
import json
import os
import traceback
from dataclasses import dataclass
from typing import Final

from chaos import mutants
from chaos.cases import CaseResult
from chaos.faults.hook import EventPipe
from chaos.lifeline import die_with_parent
from chaos.oracle import summary_checks
from chaos.oracle.oracle import ClientLog, check_after_fault, check_final_view
from chaos.postgres import database
from chaos.postgres.faults import SeamFault, SeamHook
from chaos.postgres.retry_probe import retry_probe
from chaos.scenarios.scenarios import RETRY_SUMMARY, SCENARIOS, SESSION, SLOT, Scenario, apply_op
from chaos.scenarios.scenarios import baseline_for as _baseline_for
from worker.store.errors import SessionError
from worker.store.format.records import EpochEnd
from worker.store.postgres import PostgresStore, boundaries
from worker.store.postgres.backend import SUMMARY_NAME
from worker.store.session import Session

MAX_RESUMES: Final = 4
SEAM_SCENARIOS: Final = ("basic", "schedules")  # the store-level ones whose ops reach no files


@dataclass(frozen=True, slots=True, kw_only=True)
class SeamCase:
    """One case: ``scenario:fault:k[@mutant]``, the fault at the k-th fenced write."""

    scenario: str
    fault: SeamFault
    at: int = 0
    mutant: str | None = None

    @property
    def id(self) -> str:
        text = f"{self.scenario}:{self.fault.value}:{self.at}"
        return f"{text}@{self.mutant}" if self.mutant else text

    @classmethod
    def parse(cls, text: str) -> SeamCase:
        """Parse an id the seam's rig printed; ValueError naming what is wrong."""
        body, _, mutant = text.partition("@")
        parts = body.split(":")
        if len(parts) != 3 or not parts[2].isdigit():
            raise ValueError(f"seam case id {text!r} is not scenario:fault:k[@mutant]")
        try:
            fault = SeamFault(parts[1])
        except ValueError as exc:
            raise ValueError(f"seam case id {text!r}: unknown fault {parts[1]!r}") from exc
        return cls(scenario=parts[0], fault=fault, at=int(parts[2]), mutant=mutant or None)


def clean_writes(uri: str, scenario: str) -> int:
    """How many fenced writes a clean run of ``scenario`` makes (its boundaries)."""
    with database.case_schema(uri) as case_uri:
        log = ClientLog()
        code, _, writes = _fork(case_uri, SCENARIOS[scenario], log, resume=False)
    if code != 0 or log.in_flight:
        raise AssertionError(f"a clean run of {scenario} at the seam failed (exit {code})")
    return writes


def run_seam_case(uri: str, case: SeamCase) -> CaseResult:
    """Run ``case`` in a fresh schema of the database ``uri``; the result names violations."""
    scenario = SCENARIOS[case.scenario]
    result = CaseResult(case=case.id, fault=case.fault.value, boundary=f"write {case.at}")
    with database.case_schema(uri) as case_uri:
        log = ClientLog()
        _code, claim, _ = _fork(
            case_uri, scenario, log, resume=False, case=case, notes=result.notes
        )
        after_fault = database.read_view(case_uri)
        check_after_fault(result, scenario, log, after_fault)
        if claim is not None:
            _check_fenced(result, claim, database.chunks(case_uri))
        for _ in range(MAX_RESUMES):
            _fork(case_uri, scenario, log, resume=True, mutant=case.mutant, notes=result.notes)
            if not log.in_flight and _all_sent(scenario, log):
                break
        final = database.read_view(case_uri)
        check_final_view(
            result,
            scenario,
            log,
            after_fault,
            final,
            lambda: database.load_stored(case_uri),
        )
        if final.epochs:  # the summary the writers kept in the database
            newest = max(final.epochs)
            where = f"the {SUMMARY_NAME!r} row"
            stored = database.stored_summary(case_uri)
            summary_checks.final(result, stored, where, newest, final.raw[newest])
        if not result.violations:  # as the next owner meets it: each key read back
            retry_probe(result, case_uri, final, case.mutant)
    return result


def _all_sent(scenario: Scenario, log: ClientLog) -> bool:
    return all(not op.key or op.key in log.acked for op in scenario.ops)


def _check_fenced(result: CaseResult, claim: database.Chunks, stored: database.Chunks) -> None:
    result.checked.append("deposed-writes-invisible")
    late = sorted(stored - claim)
    if late:
        result.violate(
            "deposed-writes-invisible",
            f"log pieces (epoch, byte) committed by the deposed owner after the claim: {late}",
        )


def _fork(
    uri: str,
    scenario: Scenario,
    log: ClientLog,
    *,
    resume: bool,
    case: SeamCase | None = None,
    mutant: str | None = None,
    notes: list[str] | None = None,
) -> tuple[int, database.Chunks | None, int]:
    """Fork a worker and be its client; (exit code, chunks at a claim, writes it made)."""
    fault = SeamFault.NONE if case is None else case.fault
    mutant = mutant if case is None else case.mutant
    event_r, event_w = os.pipe()
    go_r, go_w = os.pipe()
    gc.freeze()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            die_with_parent(parent)
            os.close(event_r)
            os.close(go_w)
            sink = os.open(os.devnull, os.O_WRONLY)
            os.dup2(sink, 1)
            os.dup2(sink, 2)
            mutants.apply(mutant)
            events = EventPipe(event_w)
            hook = SeamHook(events, fault, 0 if case is None else case.at, go_r)
            boundaries.set_hook(hook)
            code = _child(uri, scenario, events, frozenset(log.acked), resume=resume)
            events.send({"e": "writes", "n": hook.count})
            events.flush()
        except BaseException:
            traceback.print_exc()  # into the sink: a child's exception reaches no one else
            raise
        finally:
            os._exit(code)
    os.close(event_w)
    os.close(go_r)
    claim: database.Chunks | None = None
    writes = 0
    try:
        with os.fdopen(event_r, "rb") as stream:
            for line in stream:
                event = json.loads(line)
                kind = event["e"]
                if kind == "start":
                    log.start(str(event["key"]))
                elif kind == "ack":
                    log.ack(str(event["key"]), int(event["epoch"]))
                elif kind == "writes":
                    writes = int(event["n"])
                elif kind == "stopped" and notes is not None:
                    notes.append(f"a worker stopped: {event['why']}")
                elif kind == "seam":
                    claim = _act(uri, fault, int(event["pid"]), go_w)
    finally:
        os.close(go_w)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), claim, writes


def _act(uri: str, fault: SeamFault, backend_pid: int, go_w: int) -> database.Chunks | None:
    """Do what ``fault`` asks of the database while the worker waits; then let it go on."""
    if fault is SeamFault.FENCE:
        owner = database.OwnerClaim(uri)
        owner.start()
        os.write(go_w, b"g")
        return owner.wait()
    database.terminate(uri, backend_pid)
    os.write(go_w, b"g")
    return None


def _child(
    uri: str, scenario: Scenario, events: EventPipe, acked: frozenset[str], *, resume: bool
) -> int:
    """The client loop of chaos.run.child.store_child against a PostgresStore."""
    store = PostgresStore(uri)
    session: Session | None = None
    if resume:
        session = Session.open_or_create(store, SESSION, _baseline_for(""), SLOT)
        last = session.records[-1]
        if isinstance(last, EpochEnd):
            session.commit_epoch(RETRY_SUMMARY, _baseline_for(last.summary))
    for index, op in enumerate(scenario.ops):
        if op.key and op.key in acked:
            continue
        events.send({"e": "start", "op": index, "key": op.key})
        try:
            session = apply_op(session, store, op, retry=resume)
        except SessionError as first:
            events.send({"e": "error", "op": index, "why": str(first)})
            try:
                session = apply_op(session, store, op, retry=True)
            except SessionError as second:
                events.send({"e": "stopped", "op": index, "why": str(second)})
                return 0
        events.send({"e": "ack", "op": index, "key": op.key, "epoch": session.epoch})
    if session is not None:
        session.close()
    return 0
