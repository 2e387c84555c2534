"""Fork a worker for one run of a scenario, with its hook armed, and be its client.

The child is forked from the warm rig (no interpreter start-up); the rig reads its
trace, records what was acknowledged, and while a resumed worker holds the session it
checks that no second writer can get in.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import signal
import socket
from dataclasses import dataclass, field
from typing import Final

from chaos import mutants
from chaos.faults.hook import ChaosHook, EventPipe, FaultKind
from chaos.lifeline import die_with_parent
from chaos.oracle.answers import judge_error_reply
from chaos.oracle.api_state import implied_state
from chaos.oracle.calls import highest_call_on_disk, judge_calls, watch_next_call
from chaos.oracle.effects import EFFECTS_URL_ENV
from chaos.oracle.oracle import ClientLog, session_path, snapshot_logs
from chaos.oracle.slow_checks import judge_exit
from chaos.run.child import second_open_gets_in, store_child, worker_child
from chaos.run.effects_service import EffectsService
from chaos.run.requests_client import RequestsClient
from chaos.run.slow_client import PipelinedClient
from chaos.scenarios.scenario_types import VERSION_ENV
from chaos.scenarios.scenarios import Scenario
from worker.ipc.wire import Channel
from worker.store.disk import durable


@dataclass(slots=True)
class ChildRun:
    """What the rig saw of one child: its boundaries, a refusal, how it ended."""

    steps: list[dict[str, object]] = field(default_factory=list)
    code: int = 0
    refused: dict[str, object] | None = None
    intruders: list[str] = field(default_factory=list)  # second writers that got in
    reported: dict[str, object] | None = None  # the state the resumed worker reported
    implied: dict[str, object] = field(default_factory=dict)  # ... and what the disk says
    calls: list[int] = field(default_factory=list)  # the call numbers it handed out

    @property
    def killed(self) -> bool:
        return self.code == -signal.SIGKILL


def fork_child(
    home: str,
    scenario: Scenario,
    log: ClientLog,
    *,
    resume: bool,
    fault: FaultKind = FaultKind.NONE,
    variant: str = "-",
    at: int = 0,
    mutant: str | None = None,
    output: str = os.devnull,
    trace: bool = True,
    resend: bool = False,
) -> ChildRun:
    """Fork a worker for ``scenario`` with its hook armed; act as its client until it ends.

    With ``resend`` the client sends every request of the scenario again, answered or not
    (the App contract's retry check). The worker of a user's App (``scenario.contract``)
    runs with its working directory and ``$HOME`` in ``outside/`` beside the home, so
    that what the App writes there is seen (``chaos.run.app_contract``).
    """
    scratch = outside_dir(home) if scenario.contract else None
    log.checks.add(STORE_ERRORS)
    # Forked first, so that it holds none of this worker's pipes: their ends must close
    # when the worker dies.
    effects = EffectsService.start(home) if scenario.contract else None
    event_r, event_w = os.pipe()
    go_r, go_w = os.pipe()
    ours, theirs = socket.socketpair() if scenario.worker_level else (None, None)
    # Objects that exist now are never collected by the cyclic GC of this process or its
    # children: a collection would touch (and so copy) every page the child shares.
    floor = highest_call_on_disk(home)
    gc.freeze()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        gc.disable()  # a short-lived child: no collection, fewer copied pages
        try:
            die_with_parent(parent)  # a kill of the rig ends it too
            os.close(event_r)
            os.close(go_w)
            sink = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(sink, 1)
            os.dup2(sink, 2)
            if ours is not None:
                ours.close()
            mutants.apply(mutant)
            events = EventPipe(event_w)
            watch_next_call(events)
            durable.set_hook(ChaosHook(events, fault, variant, at, trace=trace))
            if scratch is not None:
                os.chdir(scratch)
                os.environ["HOME"] = scratch
            if effects is not None:
                effects.close_in_worker()
                os.environ[EFFECTS_URL_ENV] = effects.url
            if scenario.versions is not None:  # the first worker's, then the next one's
                os.environ[VERSION_ENV] = scenario.versions[1 if resume else 0]
            if theirs is not None:
                code = worker_child(os.path.abspath(home), scenario, theirs.fileno(),
                                    create=not log.started)  # fmt: skip
            else:
                code = store_child(home, scenario, resume=resume, events=events, go_fd=go_r,
                                   acknowledged=frozenset(log.acked),
                                   probe_open=mutant is not None)  # fmt: skip
            events.flush()
        except Exception as exc:  # noqa: BLE001 - reported, with the acknowledgements made
            # A store-level child runs the store's functions as a tool does: an exception
            # other than SessionError is a traceback for the operator. (A worker-level
            # child's last words go to a file the short fault limits too, unlike serve's
            # pipe: its exit is judged by the worker's own checks.)
            crash: dict[str, object] = {"e": "crash", "why": f"{type(exc).__name__}: {exc}"}
            events.send(crash if theirs is None else {"e": "flush"}, flush=True)
        finally:
            os._exit(code)
    os.close(event_w)
    os.close(go_r)
    run = ChildRun()
    try:
        if theirs is not None and ours is not None:
            theirs.close()
            (PipelinedClient if scenario.burst else RequestsClient)(
                scenario=scenario,
                log=log,
                channel=Channel(ours),
                on_event=lambda event: _on_event(home, log, run, event, None, mutant),
                on_ready=lambda message: _on_ready(run, home, mutant, message),
                on_refused=lambda event: _refused(run, event),
                resend=resend,
                on_error=lambda key, code: judge_error_reply(home, log, key, code),
                on_send=effects.sent if effects is not None else None,
            ).run(event_r)
        else:
            _read_events(home, log, run, event_r, go_w, mutant)
    finally:
        os.close(event_r)
        os.close(go_w)
        if ours is not None:
            ours.close()
        _pid, status = os.waitpid(pid, 0)
        run.code = os.waitstatus_to_exitcode(status)
        if effects is not None:
            effects.stop()  # the worker is gone: what it sent is answered, then it ends
    judge_calls(log, floor, run.calls, "a worker" if scenario.worker_level else "a store client")
    judge_exit(log, scenario, run.code)
    return run


def outside_dir(home: str) -> str:
    """The working directory and ``$HOME`` of a user's App's worker: ``outside/`` beside
    the home (made on first use)."""
    path = os.path.join(os.path.dirname(os.path.abspath(home)), "outside")
    os.makedirs(path, exist_ok=True)
    return path


def _on_event(
    home: str,
    log: ClientLog,
    run: ChildRun,
    event: dict[str, object],
    go_w: int | None,
    mutant: str | None,
) -> None:
    kind = event.get("e")
    if kind == "step":
        run.steps.append(event)
    elif kind == "call":
        run.calls.append(int(str(event.get("n"))))
    elif kind == "start":
        log.start(str(event.get("key") or ""))
    elif kind == "ack":
        log.ack(str(event.get("key") or ""), int(str(event.get("epoch", 0))))
    elif kind == "refused":
        run.refused = event
    elif kind == "crash":
        log.problem(
            STORE_ERRORS,
            f"the store raised {event.get('why')}, not a SessionError: a tool would end in a "
            "traceback instead of one line naming what failed",
        )
    elif kind == "opened" and go_w is not None:
        run.intruders = _second_writers_getting_in(home)
        if event.get("second_open") or (mutant is None and second_open_gets_in(home)):
            run.intruders.append("a second Session.open")
        state = event.get("state")
        run.reported = state if isinstance(state, dict) else None
        run.implied = implied_state(snapshot_logs(home))
        os.write(go_w, b"g")


def _on_ready(run: ChildRun, home: str, mutant: str | None, message: dict[str, object]) -> None:
    run.intruders = _second_writers_getting_in(home)
    if _second_open_gets_in(home, mutant):
        run.intruders.append("a second Session.open")
    run.reported = {name: message.get(name) for name in _READY_STATE}
    run.implied = implied_state(snapshot_logs(home))


def _refused(run: ChildRun, event: dict[str, object]) -> None:
    run.refused = event


# Every failure of a store operation is a SessionError (the CLI's one line), never
# another exception escaping from the store.
STORE_ERRORS: Final = "store-errors-are-session-errors"
_READY_STATE: Final = ("epoch", "records", "slot")  # what a worker's ready message reports
_PROBE_LOCKS: Final = ((fcntl.LOCK_EX, "an exclusive flock"), (fcntl.LOCK_SH, "a shared flock"))


def _second_writers_getting_in(home: str) -> list[str]:
    """While the resumed worker holds the session, no other lock on it may be granted.

    The probes are the kernel locks a second writer (exclusive) or a reader (shared)
    would take on the session directory; a writer holding anything less than an
    exclusive lock lets one of them in.
    """
    got_in = []
    for mode, what in _PROBE_LOCKS:
        fd = os.open(session_path(home), os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            continue
        finally:
            os.close(fd)
        got_in.append(what)
    return got_in


def _second_open_gets_in(home: str, mutant: str | None) -> bool:
    """Whether a real ``Session.open`` of the (possibly mutated) store gets the session.

    With a mutant it runs in a forked process with the mutant applied, as a second
    worker would (a store-level child makes the same probe itself, ``chaos.run.child``);
    the real store is the rig's own, so the rig's warm process probes it at once.
    """
    if mutant is None:
        return second_open_gets_in(home)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the probe: never returns
        code = 2
        try:
            die_with_parent(parent)  # a kill of the rig ends it too
            mutants.apply(mutant)
            code = 1 if second_open_gets_in(home) else 0
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 1


def _read_events(
    home: str, log: ClientLog, run: ChildRun, fd: int, go_w: int, mutant: str | None
) -> None:
    buffer = b""
    while True:
        data = os.read(fd, 65536)
        if not data:
            return
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        if lines:
            # One JSON document for the batch: a single parse instead of one per line.
            for event in json.loads(b"[" + b",".join(lines) + b"]"):
                _on_event(home, log, run, event, go_w, mutant)
