"""What the store's API must report after a resume, as the files on disk imply it.

After every resume the worker's reported state (epoch, slot, records, carry, prior
counts, next call number) is compared with what the raw logs say; a store that reads
its files wrongly reports a state the disk does not hold.
"""

from __future__ import annotations

from chaos.cases import CaseResult
from chaos.oracle.oracle import LogsView


def implied_state(view: LogsView) -> dict[str, object]:
    """The state an open of these logs must report (after any epoch change it finished)."""
    if not view.epochs:
        return {}
    newest = max(view.epochs)
    records = view.epochs[newest]
    older = [r for n, rs in view.epochs.items() if n < newest for r in rs]
    users = [r for r in older if r.get("type") == "User"]
    calls = [
        int(str(r.get("call")))
        for rs in view.epochs.values()
        for r in rs
        if r.get("type") == "ToolResult"
    ]
    # A SessionStart may carry the next call number: numbers handed out and never used
    # (a failed append) leave a gap, never a reuse.
    carried = records[0].get("next_call") if records else None
    next_call = max(calls, default=0) + 1
    if isinstance(carried, int):
        next_call = max(next_call, carried)
    return {
        "epoch": newest,
        "slot": records[0].get("slot") if records else None,
        "records": len(records),
        "carry": view.closing_summary(newest - 1) if newest else None,
        "prior_users": len(users),
        "prior_untrusted": sum(1 for r in users if r.get("untrusted") is True),
        "next_call": next_call,
    }


def check_api_state(
    result: CaseResult, reported: dict[str, object] | None, implied: dict[str, object]
) -> None:
    """Every field the worker reported must be the one the disk implies."""
    if reported is None:
        return
    result.checked.append("api-state-matches-disk")
    wrong = {
        name: (value, implied.get(name))
        for name, value in reported.items()
        if name in implied and implied[name] != value
    }
    if wrong:
        result.violate(
            "api-state-matches-disk",
            "the resumed worker reports "
            + ", ".join(f"{n}={v!r} where the disk says {d!r}" for n, (v, d) in wrong.items()),
        )
