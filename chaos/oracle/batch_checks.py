"""What a pipelining, streaming client must see, judged as each answer arrives.

``partials-own-request-in-order`` (scenario ``streaming``): the partial frames a request
gets on its connection are exactly what the App streamed for it (``chaos.scenarios.stream_app``),
in order, none of another request, none after its reply: all its pieces before a reply
that applied it, none before a reply from the log, and a prefix of them when its worker
died or the request was refused (partials are not durable: the resent request's new
partials start again from the first piece). Every reply's text, fresh or from the log,
is the streamed pieces joined.

``repeated-key-applied-once`` (scenario ``pipelined``): in a batch that carries a key
more than once, at most one occurrence is applied, every occurrence after one that was
answered is answered from the log (``duplicate``), and none is refused by the store as
a key already written (the worker must answer a repeated key from the log, as a retry,
and never hand the store a group with a key twice); and every answer a key ever gets,
in any batch, before or after a death, carries the first answer's tool call and text.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Final

from chaos.oracle.oracle import ClientLog
from chaos.scenarios.stream_app import pieces

STREAM: Final = "partials-own-request-in-order"
REPEATED: Final = "repeated-key-applied-once"
# The store's refusal of a group that carries a key already written: never a fault's.
KEY_REFUSED: Final = frozenset({"InvalidRecord"})
_SAME: Final = ("call", "text")  # what every answer of a key must repeat


@dataclass(slots=True)
class Attempt:
    """One request sent on a connection: its key, its partials, and how it ended."""

    key: str
    text: str
    partials: list[str] = field(default_factory=list)
    result: dict[str, object] | None = None  # the reply's result, if it applied or found it
    code: object = None  # the error code, if it was refused
    answered: bool = False


def judge_partial(log: ClientLog, attempt: Attempt | None, request_id: object) -> None:
    """A partial came for ``request_id``: it must be of a request still waiting."""
    if attempt is None:
        log.problem(STREAM, f"a partial came for request id {request_id!r}, never sent")
    elif attempt.answered:
        log.problem(STREAM, f"a partial of {attempt.key!r} came after its reply")


def judge_stream(log: ClientLog, attempt: Attempt, *, died: bool = False) -> None:
    """The request's attempt ended (a reply, or ``died``): were its partials its own?"""
    wanted = pieces(attempt.text)
    got = attempt.partials
    result = attempt.result
    if result is not None and result.get("duplicate") is False:
        if got != wanted:
            log.problem(STREAM, f"{attempt.key!r} was applied after partials {got}, not {wanted}")
    elif result is not None:
        if got:
            log.problem(STREAM, f"{attempt.key!r} was answered from the log after partials {got}")
    elif got != wanted[: len(got)]:
        how = "its worker died" if died else f"it was refused ({attempt.code})"
        log.problem(STREAM, f"{attempt.key!r} got partials {got} before {how}, not of {wanted}")
    text = None if result is None else result.get("text")
    if text is not None and text != "".join(wanted):
        log.problem(STREAM, f"{attempt.key!r} was answered {text!r}, not its streamed reply")


def judge_batch(log: ClientLog, batch: list[Attempt]) -> None:
    """Every answer of a batch is in: its repeated keys, and each answer against the first."""
    counts = Counter(a.key for a in batch)
    before = set(log.answers)  # keys answered before this batch
    for key in (k for k, n in counts.items() if n > 1):
        seen = [a for a in batch if a.key == key]
        refused = [a.code for a in seen if a.code in KEY_REFUSED]
        if refused:
            log.problem(
                REPEATED, f"{key!r}, {len(seen)} times in one batch, was refused as {refused}"
            )
        for earlier, later in itertools.pairwise(seen):
            # A refusal says "not applied": the same batch cannot then find it applied
            # (after a refusal only a fresh application may come; its error stays true).
            found = later.result is not None and later.result.get("duplicate") is True
            if earlier.result is None and found and key not in before:
                log.problem(REPEATED, f"{key!r} was refused, then found applied, in one batch")
        answered = [i for i, a in enumerate(seen) if a.result is not None]
        for later in seen[answered[0] + 1 :] if answered else []:
            if later.result is None or later.result.get("duplicate") is not True:
                how = "refused" if later.result is None else "applied again"
                log.problem(REPEATED, f"{key!r} was {how} in the batch that answered it")
    for attempt in batch:
        if attempt.result is None:
            continue
        first = log.answers.setdefault(attempt.key, attempt.result)
        differ = {
            name: (first.get(name), attempt.result.get(name))
            for name in _SAME
            if name in first and name in attempt.result
            and first.get(name) != attempt.result.get(name)
        }  # fmt: skip
        if differ:
            log.problem(REPEATED, f"{attempt.key!r} was answered unlike its first answer: {differ}")
