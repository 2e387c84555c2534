"""The ``poison`` probe: a request that hangs past its deadline, again and again.

Once a ``slow`` case resumed and the oracle held, the rig plays the daemon of the
session's next workers as ``supervisor/sessions/hosted.py`` does: each worker gets a real
heartbeat cell and the ``--poison`` list of a real ``PoisonLedger``; when one dies, the
ledger is charged with the requests the cell names as in flight. The client pipelines a
bystander, a request whose turn hangs (chaos/scenarios/slow_app.py) and a second bystander, and
sends again, to each next worker, what got no answer.

``overdue-turn-ended``: each worker handed the hanging request is ended by SIGALRM
before it answers it, and it is never in the log. ``poison-refused-after-deaths``: it is
refused ``poison_request`` by the first worker after exactly ``POISON_AFTER`` deaths,
not before, and the bystanders, in flight at deaths they did not cause, are applied and
never refused. The whole probe runs in a forked child, where a mutant is applied (the
ledger is the daemon's, so its mutants apply there too).
"""

from __future__ import annotations

import os
import signal
import socket
from typing import Final

from chaos.cases import CaseResult
from chaos.lifeline import die_with_parent
from chaos.oracle.oracle import snapshot_logs
from chaos.run.child import in_child
from chaos.scenarios.scenarios import SESSION, Scenario
from supervisor.sessions.poison import PoisonLedger
from worker.ipc.heartbeat import HeartbeatCell, key_digest
from worker.ipc.wire import Channel, Message, encode
from worker.store.disk import durable

OVERDUE: Final = "overdue-turn-ended"
POISON: Final = "poison-refused-after-deaths"
POISON_AFTER: Final = 2
DEADLINE: Final = 0.1
HANGING: Final = "probe-hang"
REQUESTS: Final = (("probe-b1", "a bystander before it"), (HANGING, "hang on the model"),
                   ("probe-b2", "a bystander after it"))  # fmt: skip
_WAIT: Final = 20.0  # seconds a reply may take before the probe gives up on the worker


def poison_probe(result: CaseResult, scenario: Scenario, home: str, mutant: str | None) -> None:
    """Run the probe in a forked child (with ``mutant``); record what it found. Its
    workers' output goes to ``poison-probe.out`` beside the home."""
    result.checked += [OVERDUE, POISON]
    output = os.path.join(os.path.dirname(os.path.abspath(home)), "poison-probe.out")

    def probe() -> list[tuple[str, str]]:
        durable.set_hook(None)
        return _play_daemon(os.path.abspath(home), scenario.app or "")

    found = in_child(probe, mutant, output)
    if not isinstance(found, list):
        result.violate(POISON, f"the probe itself failed (its output: {output})")
        return
    for invariant, detail in found:
        result.violate(invariant, detail)


def _play_daemon(home: str, app: str) -> list[tuple[str, str]]:
    """Serve the probe's requests through workers until all are answered; judge it."""
    ledger = PoisonLedger(after=POISON_AFTER)
    found: list[tuple[str, str]] = []
    answers: dict[str, list[str]] = {key: [] for key, _ in REQUESTS}
    deaths = 0  # of workers the hanging request was handed to
    for incarnation in range(POISON_AFTER + 2):
        unanswered = [(k, t) for k, t in REQUESTS if not answers[k]]
        if not unanswered:
            break
        argv = ["--home", home, "--session", SESSION, "--app", app,
                "--request-deadline", repr(DEADLINE)]  # fmt: skip
        for digest, count in ledger.poisoned():
            argv += ["--poison", f"{digest.hex()}:{count}"]
        code, replies, keys = _one_worker(argv, unanswered)
        for key, outcome in replies.items():
            answers[key].append(outcome)
        if code != 0 and keys:
            ledger.charged(keys, None)  # as the daemon charges a death mid-turn
        hanging = replies.get(HANGING)
        if hanging is None and key_digest(HANGING) in keys:
            deaths += 1
            if code != -signal.SIGALRM:
                found.append((OVERDUE, f"worker {incarnation + 1}, handed the request that "
                              f"hangs, ended with {code}, not by SIGALRM"))  # fmt: skip
        elif hanging == "applied":
            found.append((OVERDUE, f"the request that hangs past its {DEADLINE} s deadline "
                          f"was answered as applied by worker {incarnation + 1}"))  # fmt: skip
        elif hanging == "poison_request" and deaths != POISON_AFTER:
            found.append((POISON, f"the request that hangs was refused as poison after "
                          f"{deaths} deaths, not {POISON_AFTER}"))  # fmt: skip
    if HANGING in snapshot_logs(home).applied_keys():
        found.append((OVERDUE, "the request that hangs past its deadline is in the log"))
    if deaths >= POISON_AFTER and "poison_request" not in answers[HANGING]:
        found.append((POISON, f"the request that hangs was not refused as poison after "
                      f"{deaths} deaths: {answers[HANGING]}"))  # fmt: skip
    for key, outcomes in answers.items():
        if key != HANGING and outcomes != ["applied"]:
            found.append((POISON, f"bystander {key!r}, in flight at deaths it did not cause, "
                          f"was answered {outcomes}, not applied once"))  # fmt: skip
    return found


def _one_worker(
    argv: list[str], requests: list[tuple[str, str]]
) -> tuple[int, dict[str, str], list[bytes]]:
    """Fork a worker with a heartbeat cell; pipeline ``requests``; return its exit code,
    each answered key's outcome (``applied`` or the error code) and the key digests its
    cell named in flight when it ended."""
    cell, cell_fd = HeartbeatCell.create()
    ours, theirs = socket.socketpair()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        code = 1
        try:
            die_with_parent(parent)
            ours.close()
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # as serve's workers have it
            from worker.process import main  # noqa: PLC0415 - only the worker needs it

            code = main([*argv, "--channel-fd", str(theirs.fileno()),
                         "--heartbeat-fd", str(cell_fd)])  # fmt: skip
        finally:
            os._exit(code)
    theirs.close()
    os.close(cell_fd)
    replies: dict[str, str] = {}
    try:
        ours.settimeout(_WAIT)
        channel = Channel(ours)
        if _serve(channel, requests, replies):
            channel.send({"id": 0, "op": "stop"})
            while channel.recv() is not None:
                pass
    except (OSError, TimeoutError):
        pass  # the worker died (its code says how) or hung: judged below
    finally:
        ours.close()
        _pid, status = os.waitpid(pid, 0)
    _started, keys = cell.turn()
    cell.close()
    return os.waitstatus_to_exitcode(status), replies, keys


def _serve(channel: Channel, requests: list[tuple[str, str]], replies: dict[str, str]) -> bool:
    """Wait for ready, send the requests in one write, read their replies; whether all
    were answered (False: the worker ended first)."""
    ready = channel.recv()
    if ready is None or ready.get("op") != "ready":
        return False
    messages: list[Message] = [
        {"id": n, "op": "request", "request": {"text": text, "key": key}}
        for n, (key, text) in enumerate(requests, start=1)
    ]
    channel.sock.sendall(b"".join(encode(m) for m in messages), socket.MSG_NOSIGNAL)
    while len(replies) < len(requests):
        message = channel.recv()
        if message is None:
            return False
        request_id = message.get("id")
        if not isinstance(request_id, int) or not 1 <= request_id <= len(requests):
            continue
        error = message.get("error")
        code = error.get("code") if isinstance(error, dict) else error
        replies[requests[request_id - 1][0]] = "applied" if message.get("ok") else str(code)
    return True
