"""Where a failover's seconds go, from one ``loopd chaos cluster`` run kept on disk.

    python scripts/failover_breakdown.py KEEP_DIR REPORT.json

``KEEP_DIR`` is the run's ``--keep`` directory (each host's ``serve.log``), ``REPORT.json``
its ``--json-report``. Every time is on the CLOCK_MONOTONIC the whole machine shares:
the fault's SIGKILL and its heal (the host's ``loopd serve`` started again) and each
client's acknowledgement come from the history; the owner key's deletion seen by the
follower that took over, its promotion and each in-sync change come from the nodes'
log lines. For each ``kill-owner-host`` it prints:

- ``expiry``: the SIGKILL to the owner key's deletion seen by the follower's watch (the
  lease running out, etcd revoking it, the watch event);
- ``takeover``: that to the copy promoted (the takeover transaction, the rename);
- ``serve``: that to the first acknowledgement by the new owner (the daemon's claim,
  the worker's start and first catch-up, the client's next attempt);
- ``total``: the SIGKILL to that acknowledgement (what docs/benchmarks.md reports);
- ``resync``: the host's heal to its copy back in the in-sync set (its daemon's start,
  its copy demoted, the new owner's probe, catch-up and etcd change);

and ``none in sync`` for a kill that no follower could take over (the session then
waits for the dead owner's restart).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

TAKEN = re.compile(
    r"cluster: (?P<s>\S+): taken over from (?P<prev>\S+) with token \d+: .*?"
    r"(?:an owner key's deletion seen at (?P<seen>[\d.]+), )?promoted at (?P<at>[\d.]+)"
)
IN_SYNC = re.compile(
    r"(?P<s>\S+): follower (?P<n>\S+) back in the in-sync set \(at (?P<at>[\d.]+), CLOCK"
)


def node_of(path: Path) -> str:
    """The node's name from its log's path (``.../n1/serve.log``)."""
    return next(part for part in reversed(path.parts) if re.fullmatch(r"n\d+", part))


def read_logs(keep: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    taken, joined = [], []
    for log in sorted(keep.rglob("serve.log")):
        node = node_of(log)
        for line in log.read_text(errors="replace").splitlines():
            if found := TAKEN.search(line):
                seen = float(found["seen"]) if found["seen"] else None
                taken.append({"node": node, "s": found["s"], "prev": found["prev"],
                              "seen": seen, "at": float(found["at"])})  # fmt: skip
            elif found := IN_SYNC.search(line):
                joined.append({"s": found["s"], "n": found["n"], "at": float(found["at"])})
    return taken, joined


def rows(report: dict[str, Any], keep: Path) -> list[dict[str, Any]]:
    history = report["history"]
    taken, joined = read_logs(keep)
    acks = [r for r in history["requests"] if r.get("outcome") == "ack"]
    out = []
    faults = [f for f in history["faults"] if f["kind"] == "kill-owner-host"]
    for fault in faults:
        session, node, killed = fault["targets"][0], fault["detail"].get("node"), fault["applied"]
        row: dict[str, Any] = {"s": session, "node": node, "killed": killed}
        ordered = sorted(taken, key=lambda t: t["at"])
        take = next((t for t in ordered if t["s"] == session and t["prev"] == node
                     and t["at"] > killed), None)  # fmt: skip
        first = min((r["end"] for r in acks if r["session"] == session and r["node"] != node
                     and r["end"] > killed), default=None)  # fmt: skip
        if take is not None:
            if take["seen"] is not None:
                row["expiry"] = take["seen"] - killed
                row["takeover"] = take["at"] - take["seen"]
            if first is not None:
                row["serve"] = first - take["at"]
        if first is not None:
            row["total"] = first - killed
        row["none in sync"] = take is None
        back = min((j["at"] for j in joined if j["s"] == session and j["n"] == node
                    and j["at"] > fault["healed"]), default=None)  # fmt: skip
        if back is not None:
            row["resync"] = back - fault["healed"]
        out.append(row)
    return out


def main() -> None:
    keep, report = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    names = ("expiry", "takeover", "serve", "total", "resync")
    print("session node " + " ".join(f"{n:>8}" for n in names) + "  none in sync")
    found = rows(report, keep)
    for row in found:
        cells = " ".join(f"{row[n]:8.2f}" if n in row else f"{'-':>8}" for n in names)
        print(f"{row['s']:7} {row['node']:4} {cells}  {row['none in sync']}")
    for name in names:
        values = sorted(row[name] for row in found if name in row)
        if values:
            mid = values[len(values) // 2]
            print(f"{name}: n={len(values)} median {mid:.2f} s, max {values[-1]:.2f} s")


if __name__ == "__main__":
    main()
