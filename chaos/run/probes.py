"""Checks made once a case's resume finished: the session as a client meets it later.

``retry``: every key of the session is sent again from fresh workers through the real
client (chaos.run.node), as a user's CLI retries after it lost an answer: keys of every
epoch, the first and the last of each, and one key never sent before.
``retry-answered-from-log``: each applied key is answered ``duplicate`` with the answer
the log holds (and the one its first reply gave), none is applied twice, the key never
sent is applied, and answered as a duplicate by the next fresh worker.

``cluster``: the fencing tokens in the log (``fencing-tokens-in-order``); then a worker
started with a token below the log's must refuse and change nothing; the owner seals
the log with a ``Handoff``; the same owner started again must refuse and change
nothing; the next owner (a higher token) serves, answering a retry from the log
(``stale-owner-refused-unchanged``).
"""

from __future__ import annotations

from typing import Final

from chaos.cases import CaseResult
from chaos.oracle.oracle import ClientLog, LogsView, file_digests, snapshot_logs
from chaos.run.cluster_node import NODE, fencing_records, newest_token, node_argv
from chaos.run.node import Node
from chaos.run.slow_probe import poison_probe
from chaos.scenarios.scenarios import SESSION, Scenario
from supervisor.client.direct import Request
from supervisor.errors import ControlError
from worker.store.format.records import Handoff, Owner
from worker.store.session import Session

RETRY: Final = "retry-answered-from-log"
FENCING: Final = "fencing-tokens-in-order"
STALE: Final = "stale-owner-refused-unchanged"
LEASE: Final = "no-ack-without-lease"
NEVER_SENT: Final = "never-sent-before"


def run_probes(
    result: CaseResult, scenario: Scenario, home: str, log: ClientLog, mutant: str | None
) -> None:
    """The scenario's probes, after the oracle passed the resumed session."""
    if result.violations:
        return  # the session is wrong already; a probe would only repeat it
    if "retry" in scenario.probes:
        retry_probe(result, scenario, home, log, mutant)
    if "cluster" in scenario.probes:
        result.checked.append(LEASE)
        cluster_probe(result, scenario, home, mutant)
    if "poison" in scenario.probes:
        poison_probe(result, scenario, home, mutant)


_ENDS_A_REQUEST: Final = ("User", "SessionStart", "EpochEnd", "Owner", "Handoff")
"""What ends a request's records (the store's rule: worker.store.request_records)."""


def requests_by_key(view: LogsView) -> dict[str, tuple[int, list[dict[str, object]]]]:
    """Each applied key's epoch and the records its request wrote (its User first)."""
    found: dict[str, tuple[int, list[dict[str, object]]]] = {}
    for epoch in sorted(view.epochs):
        records = view.epochs[epoch]
        for index, record in enumerate(records):
            key = record.get("key")
            if record.get("type") != "User" or not isinstance(key, str):
                continue
            wrote = [record]
            for after in records[index + 1 :]:
                if after.get("type") in _ENDS_A_REQUEST:
                    break
                wrote.append(after)
            found[key] = (epoch, wrote)
    return found


def _answers(view: LogsView) -> dict[str, dict[str, object]]:
    """Each applied key's answer as the log holds it: its tool call and its text."""
    found: dict[str, dict[str, object]] = {}
    for key, (_epoch, wrote) in requests_by_key(view).items():
        answer: dict[str, object] = {}
        for after in wrote[1:]:
            if after.get("type") == "ToolResult":
                answer.setdefault("call", after.get("call"))
            elif after.get("type") == "Assistant":
                answer["text"] = after.get("text")
        found[key] = answer
    return found


def _same(answer: dict[str, object], reply: dict[str, object]) -> bool:
    return all(reply.get(name) == value for name, value in answer.items())


def retry_probe(
    result: CaseResult, scenario: Scenario, home: str, log: ClientLog, mutant: str | None
) -> None:
    result.checked.append(RETRY)
    on_disk = _answers(snapshot_logs(home))
    keys = [key for key in on_disk if key != NEVER_SENT]
    texts = dict(scenario.requests)
    with Node(home, scenario, mutant) as node:
        # One fresh client per key, one request each: as `loopd send --key` retries.
        for key in keys:
            try:
                reply = node.client().send(SESSION, texts.get(key, key), key=key)
            except ControlError as exc:
                result.violate(RETRY, f"the retry of {key!r} was refused: {exc}")
                return
            _judge_duplicate(result, log, key, on_disk[key], reply)
        try:
            fresh = node.client().send(SESSION, "a request never sent before", key=NEVER_SENT)
        except ControlError as exc:
            result.violate(RETRY, f"a key never sent was refused: {exc}")
            return
        if fresh.get("duplicate") is not False:
            result.violate(RETRY, f"a key never sent was not applied: {fresh}")
    # The next fresh worker: everything again in one pipelined batch, the new key too.
    with Node(home, scenario, mutant) as node:
        outcomes = node.client().send_many(
            SESSION, [Request(text=texts.get(k, k), key=k) for k in [*keys, NEVER_SENT]]
        )
    for outcome in outcomes:
        key = str(outcome.get("key"))
        if outcome.get("outcome") != "duplicate":
            result.violate(RETRY, f"the second retry of {key!r} was {outcome.get('outcome')}")
            return
    applied = snapshot_logs(home).applied_keys()
    twice = sorted({k for k in applied if applied.count(k) > 1})
    if twice:
        result.violate(RETRY, f"retried keys applied twice: {twice}")


def _judge_duplicate(
    result: CaseResult,
    log: ClientLog,
    key: str,
    on_disk: dict[str, object],
    reply: dict[str, object],
) -> None:
    if reply.get("duplicate") is not True:
        result.violate(RETRY, f"the retry of {key!r}, applied before, was applied again")
    elif not _same(on_disk, reply):
        result.violate(RETRY, f"the retry of {key!r} was answered {reply}, the log holds {on_disk}")
    elif key in log.answers and not _same({n: log.answers[key].get(n) for n in on_disk}, reply):
        result.violate(
            RETRY, f"the retry of {key!r} was answered {reply}; its first reply was "
            f"{log.answers[key]}",
        )  # fmt: skip


def _fencing_in_order(result: CaseResult, home: str) -> None:
    """Tokens never go back; a Handoff carries the owner's token; after it, only a higher
    Owner (read from the raw lines)."""
    result.checked.append(FENCING)
    token, sealed = 0, None
    for epoch, line, record in fencing_records(home):
        value = record.get("token")
        where = f"epoch {epoch} line {line}"
        if type(value) is not int:
            result.violate(FENCING, f"{where}: {record.get('type')} without a token")
            return
        if record.get("type") == "Owner":
            if value < token or (sealed is not None and value <= sealed):
                result.violate(FENCING, f"{where}: Owner token {value} after token {token}")
            token, sealed = value, None
        elif value != token or sealed is not None:
            result.violate(FENCING, f"{where}: Handoff token {value}; the owner's is {token}")
        else:
            sealed = value


def cluster_probe(result: CaseResult, scenario: Scenario, home: str, mutant: str | None) -> None:
    _fencing_in_order(result, home)
    result.checked.append(STALE)
    token = newest_token(home)
    if token < 1:
        result.violate(FENCING, "the cluster workers wrote no Owner")
        return
    # The owner starts again first (as its node restarts it): its token is then the
    # newest epoch's, carried by the commit or written by its Owner.
    with Node(home, scenario, mutant, flags=node_argv(home, token=token)) as node:
        if node.ready is None:
            result.violate(STALE, f"the owner (token {token}) was refused: {node.exiting}")
            return
    if token > 1:
        _refused_unchanged(result, scenario, home, mutant, token - 1, "a stale owner")
    with Session.open(home, SESSION) as session:  # the owner seals the log for a move,
        if session.fence.token < token:  # its Owner first when this epoch has none (a
            session.append(Owner(node=NODE, token=token))  # move's seal does the same)
        session.append(Handoff(to="node-b", token=token))
    _refused_unchanged(result, scenario, home, mutant, token, "the owner after its Handoff")
    flags = node_argv(home, node="node-b", token=token + 1)
    with Node(home, scenario, mutant, flags=flags) as node:
        if node.ready is None:
            result.violate(STALE, f"the new owner (token {token + 1}) was refused: {node.exiting}")
            return
        key = scenario.requests[0][0]
        reply = node.client().send(SESSION, scenario.requests[0][1], key=key)
        if reply.get("duplicate") is not True or reply.get("token") != token + 1:
            result.violate(STALE, f"the new owner answered a retry of {key!r} with {reply}")
    _fencing_in_order(result, home)


def _refused_unchanged(
    result: CaseResult, scenario: Scenario, home: str, mutant: str | None, token: int, who: str
) -> None:
    before = file_digests(home)
    flags = node_argv(home, node=NODE, token=token)
    with Node(home, scenario, mutant, flags=flags) as node:
        served = node.ready is not None
    if served:
        result.violate(STALE, f"{who} (token {token}) was let serve the session")
    if file_digests(home) != before:
        result.violate(STALE, f"{who} (token {token}) changed the session's files")
