"""Effects outside the session: the journal of the rig's effects service, and its invariant.

An App whose requests change something outside its session (a webhook, a note in a
team's service, a payment) must apply each once per request key, however often a crash
makes the client retry: the effect carries the request's key and the service applies a
key once. The rig runs an effects service for each worker of a user's App
(``chaos.run.effects_service``) and hands its URL to the App's worker in
``LOOPD_CHAOS_EFFECTS_URL``; each effect the App sends there is journaled beside the
store's home with the request the rig had in flight at that worker when it arrived.

``app-effects-once-per-key``: no request has more of its effects of a kind applied than
one attempt of it sends. An attempt is one sending of the request to one worker; an
effect is applied unless its ``Idempotency-Key`` was applied before (an effect without
one is applied every time). A webhook sent without the key is applied again by every
retry after a crash; one sent with the key is answered with the first answer.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Final

from chaos.cases import CaseResult

INVARIANT: Final = "app-effects-once-per-key"
EFFECTS_URL_ENV: Final = "LOOPD_CHAOS_EFFECTS_URL"
KEY_HEADER: Final = "Idempotency-Key"
JOURNAL: Final = "effects.jsonl"
BODY_KEPT: Final = 80  # characters of an effect's body the journal keeps, for a report


@dataclass(frozen=True, slots=True, kw_only=True)
class Effect:
    """One effect the service received: who sent it, for which request, and its fate."""

    worker: int  # the worker's number in the case, from 1 (one service per worker)
    attempt: int  # which sending of a request to that worker it came under, from 1; 0: none
    request: str | None  # the key the rig had in flight at that worker; None: none was
    kind: str  # the path it was sent to, below the service's URL (``notes``, ``webhook``)
    key: str | None  # its Idempotency-Key; None: it had none
    applied: bool  # False: its key was applied before, and it got that first answer
    number: int  # the number of the applied effect of its kind it is (or repeats)
    body: str = ""

    def to_line(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> Effect:
        fields = json.loads(line)
        if not isinstance(fields, dict):
            raise TypeError(f"an effect is a JSON object, not {line[:80]!r}")
        request, key = fields.get("request"), fields.get("key")
        return cls(
            worker=int(fields["worker"]),
            attempt=int(fields["attempt"]),
            request=None if request is None else str(request),
            kind=str(fields["kind"]),
            key=None if key is None else str(key),
            applied=bool(fields["applied"]),
            number=int(fields["number"]),
            body=str(fields.get("body", "")),
        )


def journal_path(home: str) -> str:
    """The journal of a case: beside its home, outside what the App may write or the
    oracle reads (``app-writes-only-its-session`` looks at the home and ``outside/``)."""
    return os.path.join(os.path.dirname(os.path.abspath(home)), JOURNAL)


def read_journal(path: str) -> list[Effect]:
    """Every effect journaled at ``path`` (none when no effect was ever sent)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    # The service writes each line whole before it answers and is reaped before this
    # read; a line without its newline is one it was killed in the middle of writing.
    return [Effect.from_line(line) for line in data.split(b"\n")[:-1]]


def check_effects_once_per_key(result: CaseResult, home: str) -> None:
    """``app-effects-once-per-key`` on the case's journal (module doc)."""
    result.checked.append(INVARIANT)
    effects = read_journal(journal_path(home))
    applied: dict[tuple[str, str], list[Effect]] = defaultdict(list)
    per_attempt: dict[tuple[str, str], dict[tuple[int, int], int]] = defaultdict(dict)
    for effect in effects:
        if effect.request is None:
            continue  # sent with no request in flight (a worker's start): no key to judge
        group = (effect.request, effect.kind)
        attempt = (effect.worker, effect.attempt)
        per_attempt[group][attempt] = per_attempt[group].get(attempt, 0) + 1
        if effect.applied:
            applied[group].append(effect)
    for (request, kind), done in sorted(applied.items()):
        attempts = per_attempt[(request, kind)]
        most = max(attempts.values())
        if len(done) <= most:
            continue
        unkeyed = sum(1 for e in done if e.key is None)
        how = (
            f"{unkeyed} without an {KEY_HEADER}"
            if unkeyed
            else f"under {len({e.key for e in done})} different keys"
        )
        result.violate(
            INVARIANT,
            f"request {request!r}: {len(done)} {kind!r} effects applied where one attempt "
            f"sends {most} ({how}, over {len(attempts)} attempts): a retry applied it again",
        )
