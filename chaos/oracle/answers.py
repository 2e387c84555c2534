"""What a reply says about its request, held against the disk.

``refused-means-not-applied``: a request answered with an error (the client's outcome
``refused``, "not applied") is not in the log when the answer arrives. The rig reads
the logs as soon as it has the error, before it sends anything else. ``not_owner`` is
not such an answer: a cluster worker whose lease lapsed during the group commit says
it for a request that is durable (the client retries it elsewhere, by its key).
"""

from __future__ import annotations

from typing import Final

from chaos.oracle.oracle import ClientLog, snapshot_logs

INVARIANT: Final = "refused-means-not-applied"
OUTCOME_UNKNOWN: Final = frozenset({"not_owner"})


def judge_error_reply(home: str, log: ClientLog, key: str, code: object) -> None:
    """An error reply for ``key`` came: it must not be on disk (unless its code says
    the outcome is unknown)."""
    log.checks.add(INVARIANT)
    if code in OUTCOME_UNKNOWN or not key:
        return
    if key in snapshot_logs(home).applied_keys():
        log.problem(
            INVARIANT, f"request {key!r} was answered {code!r} (not applied) but is on disk"
        )
