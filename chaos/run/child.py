"""What runs inside a case's child process: the store-level client loop or the real worker;
and a probe run in a child of its own with the case's mutant (``in_child``).

The child is a real process forked from the warm rig; the rig kills it with SIGKILL at
the chosen boundary. It reports to the rig over the event pipe: each boundary (through
the hook), each operation started and acknowledged, and a refusal to open.
"""

from __future__ import annotations

import json
import os
import signal
import traceback
from collections.abc import Callable

from chaos import mutants
from chaos.faults.hook import EventPipe
from chaos.lifeline import die_with_parent
from chaos.run.cluster_node import node_argv
from chaos.scenarios.scenarios import RETRY_SUMMARY, SESSION, SLOT, Scenario, apply_op, baseline_for
from worker.store.disk import durable
from worker.store.errors import (
    BaselineError,
    InvalidLog,
    LogError,
    SessionError,
    SessionLocked,
    SessionNotFound,
    TornLog,
)
from worker.store.format.records import EpochEnd
from worker.store.session import Session


def store_child(
    home: str,
    scenario: Scenario,
    *,
    resume: bool,
    events: EventPipe,
    go_fd: int,
    acknowledged: frozenset[str] = frozenset(),
    probe_open: bool = False,
) -> int:
    """Run the scenario's operations against the store, reporting each acknowledgement.

    Requests already ``acknowledged`` are not sent again: a client retries only what it
    got no answer for (the store recognizes a key only within its retry window of two
    epochs). With ``probe_open`` a resumed child also tries a second ``Session.open`` of its own
    (the rig makes that probe itself when the child's store is the rig's).
    """
    session: Session | None = None
    if resume:
        try:
            session = open_for_resume(home, scenario)
        except (TornLog, InvalidLog, BaselineError, SessionNotFound) as exc:
            events.send(refusal(exc))
            return 0
        events.send(
            {
                "e": "opened",
                "second_open": probe_open and second_open_gets_in(home),
                "state": report(session),
            },
            flush=True,
        )
        os.read(go_fd, 1)  # the rig checks that it cannot open the session meanwhile
    for index, op in enumerate(scenario.ops):
        if op.key and op.key in acknowledged:
            continue  # a client never sends again what it was told is done
        events.send({"e": "start", "op": index, "key": op.key})
        try:
            session = apply_op(session, home, op, retry=resume)
        except SessionError as first:
            # The client retries once, in the same worker; a broken session refuses.
            events.send({"e": "error", "op": index, "why": str(first)})
            try:
                session = apply_op(session, home, op, retry=True)
            except SessionError as second:
                events.send({"e": "stopped", "op": index, "why": str(second)})
                return 0
        events.send({"e": "ack", "op": index, "key": op.key, "epoch": session.epoch})
    if session is not None:
        session.close()
    return 0


def open_for_resume(home: str, scenario: Scenario) -> Session:
    """Open (or finish creating) the session and complete an interrupted epoch change."""
    if scenario.ops and scenario.ops[0].kind == "create":
        session = Session.open_or_create(home, SESSION, baseline_for(""), SLOT)
    else:
        session = Session.open(home, SESSION)
    last = session.records[-1]
    if isinstance(last, EpochEnd):
        session.commit_epoch(RETRY_SUMMARY, baseline_for(last.summary))
    return session


def second_open_gets_in(home: str) -> bool:
    """Whether a second ``Session.open`` gets the session a worker of ours holds.

    The boundary hook is off meanwhile: the probe is not a step of the scenario.
    """
    hook = durable.set_hook(None)
    try:
        Session.open(home, SESSION).close()
    except SessionLocked:
        return False
    finally:
        durable.set_hook(hook)
    return True


def report(session: Session) -> dict[str, object]:
    """The state the store's API reports (``next_call`` hands out a number: a gap follows)."""
    return {
        "epoch": session.epoch,
        "slot": session.slot,
        "records": len(session.records),
        "carry": session.carry,
        "prior_users": session.prior_users,
        "prior_untrusted": session.prior_untrusted,
        "next_call": session.next_call(),
    }


def refusal(exc: SessionError) -> dict[str, object]:
    """The event that reports a refusal to open, with its place when it has one."""
    event: dict[str, object] = {"e": "refused", "error": type(exc).__name__, "why": str(exc)}
    if isinstance(exc, LogError):
        event["path"] = exc.path
        event["line"] = exc.line
    return event


def worker_child(
    home: str, scenario: Scenario, channel_fd: int, *, create: bool, node: list[str] | None = None
) -> int:
    """Run the real worker process code on the inherited channel, started as the
    supervisor starts it: with ``--create`` only until a worker of the session was ready.
    A ``cluster`` scenario's worker starts as a cluster node's (``node``: its flags, by
    default a token above the log's, chaos.run.cluster_node).
    """
    from worker.process import main  # noqa: PLC0415 - only a worker-level child needs it

    argv = ["--home", home, "--session", SESSION, "--channel-fd", str(channel_fd),
            "--budget", str(scenario.budget)]  # fmt: skip
    if create:
        argv += ["--create", "--slot", str(SLOT)]
    if scenario.app is not None:
        argv += ["--app", scenario.app]
    argv += scenario.worker_args
    # SIGALRM's default action, as a worker of serve has it: the request deadline's
    # signal must end the worker (a handler the rig inherited, pytest-timeout's, would not).
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    if "cluster" in scenario.probes:
        argv += node_argv(home) if node is None else node
    return main(argv)


def in_child(work: Callable[[], object], mutant: str | None, output: str = os.devnull) -> object:
    """What ``work`` returned in a forked child with ``mutant`` applied (decoded from JSON);
    None if the child failed (its traceback, if any, is in ``output``)."""
    read_end, write_end = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 2
        try:
            die_with_parent(parent)
            os.close(read_end)
            sink = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(sink, 1)
            os.dup2(sink, 2)
            mutants.apply(mutant)
            found = work()
            with os.fdopen(write_end, "w", encoding="utf-8") as report:
                json.dump(found, report)
            code = 0
        except BaseException:
            traceback.print_exc()  # into ``output``: nobody else hears the child
            raise
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as report:
        text = report.read()
    _pid, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or not text:
        return None
    said: object = json.loads(text)
    return said
