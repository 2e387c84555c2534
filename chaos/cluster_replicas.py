"""The replication checks of ``loopd chaos cluster``, and the failover times it measures.

- ``acked-by-owner``: every acknowledgement came from the node etcd made the owner at
  its token: an ``Owner{node, token}`` record naming that node with that token is in a
  copy of the session (an owner's log or a follower's copy, on any host); and no
  acknowledgement ended while its node's host was killed or cut off (from a fault's
  start, plus ``IN_FLIGHT`` for a reply already on its way, to its heal).
- ``copies-are-prefixes``: every follower's copy (``<home>/replicas/sessions/<id>`` on
  each host) opens and verifies (``loopd verify``), and its records (``User``,
  ``Owner``, ``Handoff``) are a prefix of the final owner's log: a copy with records
  the owner does not have must have had them moved to quarantine.

``failover_times``: for each ``kill-owner-host`` fault, the seconds from its SIGKILL to
the first acknowledgement of that session by another node (the new owner).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Final

from chaos.cluster_history import History, SessionLog

IN_FLIGHT: Final = 0.25
"""Seconds after a host's loss in which a reply it had sent may still be taken in."""
HOST_LOSS: Final = ("kill-host", "kill-owner-host", "isolate-node", "isolate-owner-host")


def _lost_node(fault: dict[str, object]) -> str | None:
    """The node a host-loss fault took away (None: not one, or it was not applied)."""
    if fault.get("kind") not in HOST_LOSS or fault.get("error"):
        return None
    detail = fault.get("detail")
    if str(fault["kind"]).endswith("-owner-host"):
        node = detail.get("node") if isinstance(detail, dict) else None
        return None if node is None else str(node)
    targets = fault.get("targets")
    return str(targets[0]) if isinstance(targets, list) and targets else None


def acked_by_owner(history: History) -> list[str]:
    found = []
    owners: dict[tuple[str, int], set[str]] = defaultdict(set)
    for log in [*history.logs.values(), *history.copies.values()]:
        for entry in log.entries:
            if entry.kind == "owner" and entry.token is not None and entry.node is not None:
                owners[(log.session, entry.token)].add(entry.node)
    lost = [(node, float(f["applied"]), float(f["healed"]))
            for f in history.faults if (node := _lost_node(f)) is not None]  # fmt: skip
    for request in history.requests:
        if request.outcome != "ack" or request.token is None or request.node is None:
            continue
        named = owners.get((request.session, request.token), set())
        if request.node not in named:
            found.append(f"{request.session}: key {request.key} acknowledged by "
                         f"{request.node} with token {request.token}, which no Owner "
                         f"record of any copy gives it (it names {sorted(named)})")  # fmt: skip
        for node, applied, healed in lost:
            if node == request.node and applied + IN_FLIGHT < request.end < healed:
                found.append(f"{request.session}: key {request.key} acknowledged by "
                             f"{node} at {request.end:.3f}, while its host was lost "
                             f"({applied:.3f} to {healed:.3f})")  # fmt: skip
    return found


def _owner_log(history: History, session: str) -> SessionLog | None:
    node = history.placement.get(session)
    return None if node is None else history.logs.get((node, session))


def copies_are_prefixes(history: History) -> list[str]:
    found = []
    for (node, session), copy in sorted(history.copies.items()):
        if not copy.verified:
            found.append(f"{session}: the follower's copy on {node}: {copy.verdict}")
        final = _owner_log(history, session)
        if final is None or final.node == node:
            continue  # no final owner: logs-verify names it
        size = len(copy.entries)
        if final.entries[:size] != copy.entries:
            at = next((i for i, (a, b) in enumerate(zip(copy.entries, final.entries,
                                                        strict=False)) if a != b),
                      min(size, len(final.entries)))  # fmt: skip
            found.append(f"{session}: the follower's copy on {node} ({size} records) is "
                         f"not a prefix of {final.node}'s log ({len(final.entries)}): "
                         f"they differ at record {at}")  # fmt: skip
    return found


def failover_times(history: History) -> tuple[list[float], list[str]]:
    """Seconds from each owner-host SIGKILL to the first acknowledgement of its session
    by another node; and each kill after which there was none (one line each: no other
    node answered, or no client sent to the session after it, which measures nothing)."""
    times, unserved = [], []
    for fault in history.faults:
        if fault.get("kind") != "kill-owner-host" or (node := _lost_node(fault)) is None:
            continue
        session, applied = str(fault["targets"][0]), float(fault["applied"])
        mine = [r for r in history.requests if r.session == session and r.end > applied]
        ends = [r.end for r in mine if r.outcome == "ack" and r.node not in (None, node)]
        if ends:
            times.append(min(ends) - applied)
        elif not mine:
            unserved.append(f"{session}: its owner {node} killed at {applied:.3f}: not "
                            "measured, no client sent to it afterwards")  # fmt: skip
        else:
            unserved.append(f"{session}: its owner {node} killed at {applied:.3f}: no other "
                            "node acknowledged a write of it afterwards")  # fmt: skip
    return times, unserved


def percentiles(seconds: list[float]) -> dict[str, float | None]:
    """p50 and p99 (nearest rank) of ``seconds``; None when there are none."""
    ordered = sorted(seconds)

    def rank(p: int) -> float | None:
        if not ordered:
            return None
        return round(ordered[max(0, math.ceil(len(ordered) * p / 100) - 1)], 3)

    return {"p50": rank(50), "p99": rank(99)}
