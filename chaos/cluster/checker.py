"""The checker of ``loopd chaos cluster``: the invariants over a whole run's history.

Each check reads a ``History`` (``chaos/cluster/history.py``) and returns its
violations, each one line with the evidence; an empty list means the invariant held.

- ``acknowledged-once``: every acknowledged key is exactly once in the log of the
  session's final owner (etcd's placement at the end), no key is twice in any final
  log, and no key refused (never sent to a node) is in one.
- ``one-owner-at-a-time``: no two nodes acknowledged writes for one session in
  overlapping ownership. A token is one etcd revision: it names one node in every
  ``Owner`` record and every reply. Every acknowledgement's (node, token) is an
  ``Owner`` of the final log, and its key lies in that owner's stretch of the log (after
  its ``Owner``, before the next ``Owner`` or ``Handoff``; a duplicate's answer from the
  log: before that stretch ends). And in real time: no request begun after a reply with
  a higher token was acknowledged under a lower one.
- ``client-tokens-grow``: no client accepted a reply with a lower token than one it
  had already accepted for that session.
- ``logs-verify``: every final log opens and verifies (``loopd verify``), and every
  session with an acknowledged key has a final owner holding its log.
- ``no-reply-from-a-lost-host``: no acknowledgement names a node whose host could not
  answer the client when it ended: killed, cut off, paused, or partitioned from the
  client (from the fault's start, or the moment the pause took hold, plus ``IN_FLIGHT``
  for a reply already on its way, to the start of its heal: a reply held back by a
  partition is delivered as its routes are removed, before the heal is stamped done).
  One that does was made up by the client or answered by another process than the node
  it names.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Final

from chaos.cluster.history import History, Request, SessionLog

INVARIANTS: Final = (
    "acknowledged-once",
    "one-owner-at-a-time",
    "client-tokens-grow",
    "logs-verify",
    "no-reply-from-a-lost-host",
)
IN_FLIGHT: Final = 0.25
"""Seconds after a host's loss in which a reply it had sent may still be taken in."""
HOST_LOSS: Final = ("kill-host", "isolate-node", "pause-node", "partition-client-node")


def _acks(history: History) -> list[Request]:
    return [r for r in history.requests if r.outcome == "ack"]


def final_log(history: History, session: str) -> SessionLog | None:
    node = history.placement.get(session)
    return None if node is None else history.logs.get((node, session))


def acknowledged_once(history: History) -> list[str]:
    found = []
    counts: dict[str, tuple[str, Counter[str | None]]] = {}
    for session in history.placement:
        final = final_log(history, session)
        if final is not None:
            counts[session] = (final.node, Counter(e.key for e in final.entries
                                                   if e.kind == "user"))  # fmt: skip
    for request in _acks(history):
        if request.session not in counts:
            continue  # logs-verify names a session without a final log
        node, keys = counts[request.session]
        count = keys[request.key]
        if count != 1:
            found.append(f"{request.session}: key {request.key} acknowledged by "
                         f"{request.node} (token {request.token}) is {count} times on "
                         f"{node}, its final owner")  # fmt: skip
    for request in history.requests:
        if request.outcome == "refused" and request.session in counts:
            node, keys = counts[request.session]
            if keys[request.key]:
                found.append(f"{request.session}: key {request.key}, never sent to a node "
                             f"(refused), is on {node}")  # fmt: skip
    for session, (node, keys) in sorted(counts.items()):
        for key, count in sorted((k, n) for k, n in keys.items() if k is not None):
            if count > 1:
                found.append(f"{session}: key {key} is {count} times on {node}")
    return found


def _stretches(log: SessionLog) -> dict[int, tuple[str, int, int]]:
    """token -> (node, first index after its Owner, index where its stretch ends)."""
    stretches: dict[int, tuple[str, int, int]] = {}
    current: tuple[str, int, int] | None = None
    for index, entry in enumerate(log.entries):
        if entry.kind not in ("owner", "handoff"):
            continue
        if current is not None:
            stretches[current[2]] = (current[0], current[1], index)
            current = None
        if entry.kind == "owner" and entry.node is not None and entry.token is not None:
            current = (entry.node, index + 1, entry.token)
    if current is not None:
        stretches[current[2]] = (current[0], current[1], len(log.entries))
    return stretches


def _first_places(log: SessionLog) -> dict[str, int]:
    """key -> the index of its first User record in the log."""
    places: dict[str, int] = {}
    for index, entry in enumerate(log.entries):
        if entry.kind == "user" and entry.key is not None:
            places.setdefault(entry.key, index)
    return places


def one_owner_at_a_time(history: History) -> list[str]:
    found = []
    named: dict[tuple[str, int], set[str]] = defaultdict(set)
    for log in history.logs.values():
        for entry in log.entries:
            if entry.kind == "owner" and entry.token is not None and entry.node is not None:
                named[(log.session, entry.token)].add(entry.node)
    for request in _acks(history):
        if request.token is not None and request.node is not None:
            named[(request.session, request.token)].add(request.node)
    for (session, token), nodes in sorted(named.items()):
        if len(nodes) > 1:
            found.append(f"{session}: token {token} is named by {sorted(nodes)}")
    read: dict[str, tuple[SessionLog, dict[int, tuple[str, int, int]], dict[str, int]]] = {}
    for session in history.placement:
        final = final_log(history, session)
        if final is not None:
            read[session] = (final, _stretches(final), _first_places(final))
    for request in _acks(history):
        if request.session not in read or request.token is None:
            continue
        log, stretches, places = read[request.session]
        stretch = stretches.get(request.token)
        if stretch is None or stretch[0] != request.node:
            found.append(f"{request.session}: key {request.key} acknowledged by "
                         f"{request.node} with token {request.token}, which no Owner "
                         f"record of {log.node}'s log gives that node")  # fmt: skip
            continue
        _node, begin, end = stretch
        at = places.get(request.key)
        if at is not None and not (at < end and (request.duplicate or at >= begin)):
            found.append(f"{request.session}: key {request.key} acknowledged by "
                         f"{request.node} with token {request.token} lies at record "
                         f"{at}, outside that owner's stretch [{begin}, {end})")  # fmt: skip
    found += _late_lower_tokens(history)
    return found


def _late_lower_tokens(history: History) -> list[str]:
    """A request begun after a reply with a higher token, acknowledged with a lower one."""
    found = []
    by_session: dict[str, list[Request]] = defaultdict(list)
    for request in _acks(history):
        if request.token is not None:
            by_session[request.session].append(request)
    for session, acks in sorted(by_session.items()):
        acks.sort(key=lambda r: r.end)
        highest: Request | None = None
        ends = [(r.end, r) for r in acks]
        position = 0
        for request in sorted(acks, key=lambda r: r.start):
            while position < len(ends) and ends[position][0] < request.start:
                seen = ends[position][1]
                if highest is None or (seen.token or 0) > (highest.token or 0):
                    highest = seen
                position += 1
            if highest is not None and (request.token or 0) < (highest.token or 0):
                found.append(f"{session}: key {request.key} begun at {request.start:.3f} "
                             f"was acknowledged by {request.node} with token "
                             f"{request.token}, after key {highest.key} had been by "
                             f"{highest.node} with token {highest.token} at "
                             f"{highest.end:.3f}")  # fmt: skip
    return found


def client_tokens_grow(history: History) -> list[str]:
    found = []
    seen: dict[tuple[int, str], Request] = {}
    for request in sorted(_acks(history), key=lambda r: (r.process, r.end)):
        if request.token is None:
            found.append(f"{request.session}: key {request.key} acknowledged without a token")
            continue
        before = seen.get((request.process, request.session))
        if before is not None and before.token is not None and request.token < before.token:
            found.append(f"{request.session}: client {request.process} accepted token "
                         f"{request.token} (key {request.key}) after token {before.token} "
                         f"(key {before.key})")  # fmt: skip
            continue
        seen[(request.process, request.session)] = request
    return found


def logs_verify(history: History) -> list[str]:
    found = [f"{log.session} on {log.node}: {log.verdict}"
             for log in history.logs.values() if not log.verified]  # fmt: skip
    acked = sorted({r.session for r in _acks(history)})
    for session in acked:
        node = history.placement.get(session)
        if node is None:
            found.append(f"{session}: acknowledged keys, and no final placement in etcd")
        elif (node, session) not in history.logs:
            found.append(f"{session}: placed on {node}, which holds no copy of it")
    return found


def no_reply_from_a_lost_host(history: History) -> list[str]:
    lost = []
    for fault in history.faults:
        if fault.get("kind") not in HOST_LOSS or fault.get("error") or not fault.get("healed"):
            continue
        detail = fault.get("detail", {})
        took_hold = detail.get("stopped_after_s") or 0.0
        until = detail.get("heal_began", fault["healed"])
        lost.append((str(fault["targets"][0]), float(fault["applied"]) + float(took_hold),
                     float(until), str(fault["kind"])))  # fmt: skip
    found = []
    for request in _acks(history):
        for node, applied, healed, kind in lost:
            if node == request.node and applied + IN_FLIGHT < request.end < healed:
                found.append(f"{request.session}: key {request.key} acknowledged by "
                             f"{node} at {request.end:.3f}, while its host was lost "
                             f"({kind} {applied:.3f} to {healed:.3f})")  # fmt: skip
    return found


CHECKS: Final[dict[str, Callable[[History], list[str]]]] = {
    "acknowledged-once": acknowledged_once,
    "one-owner-at-a-time": one_owner_at_a_time,
    "client-tokens-grow": client_tokens_grow,
    "logs-verify": logs_verify,
    "no-reply-from-a-lost-host": no_reply_from_a_lost_host,
}


def check(history: History) -> dict[str, list[str]]:
    """Every invariant's violations (an empty list: it held)."""
    return {name: CHECKS[name](history) for name in INVARIANTS}
