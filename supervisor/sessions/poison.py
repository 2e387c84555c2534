"""Poison requests: a request in flight at too many deaths of its worker is refused.

The worker names the requests it is handling in its heartbeat cell (their keys'
digests). When a worker dies mid-turn (a crash, a hang kill, a deadline, an
out-of-memory kill), each of them is charged one death; a key charged ``after`` deaths
is passed to every later worker of the session, which refuses it (``poison_request``)
unless the log already holds it. A hang kill is charged only when the worker showed no
progress between the verdict and its death: time the daemon itself did not run is
never a verdict (supervisor/sessions/hang.py). The ledger lives in the supervisor's
memory: a supervisor restart forgives every key.
"""

from __future__ import annotations

from typing import Final

DEFAULT_POISON_AFTER: Final = 3
MAX_TRACKED: Final = 1024
"""Keys whose deaths are remembered per session (the oldest are forgotten first)."""
MAX_POISONED: Final = 256
"""Poisoned keys passed to a worker (the most recent)."""


class PoisonLedger:
    """Deaths of one session's workers, by the request keys in flight at each."""

    def __init__(self, after: int = DEFAULT_POISON_AFTER) -> None:
        self.after = after
        self._deaths: dict[bytes, int] = {}

    def charge(self, digests: list[bytes]) -> list[bytes]:
        """One death while ``digests`` were in flight; the keys poisoned by it."""
        newly = []
        for digest in dict.fromkeys(digests):
            deaths = self._deaths.pop(digest, 0) + 1
            self._deaths[digest] = deaths  # re-inserted: the newest are kept longest
            if deaths == self.after:
                newly.append(digest)
        while len(self._deaths) > MAX_TRACKED:
            del self._deaths[next(iter(self._deaths))]
        return newly

    def charged(
        self, in_flight: list[bytes], running: float | None, *, progressing: bool = False
    ) -> str:
        """Charge a death to the requests in flight; what to add to the session's last_error.

        ``progressing``: the death was the supervisor's own hang kill of a worker that had
        stamped progress since the verdict (it ran, the verdict raced it): not charged.
        """
        text = f"; {len(in_flight)} request(s) in flight" + (
            f", the running one for {running:.1f} s" if running is not None else ""
        )
        if progressing:
            return f"{text}, making progress when killed as hung: not charged with this death"
        newly = self.charge(in_flight)
        if newly:
            digests = ", ".join(digest.hex()[:12] for digest in newly)
            text += (
                f"; {len(newly)} of them reached {self.after} deaths and will be refused "
                f"as poison requests (key digest {digests})"
            )
        return text

    def poisoned(self) -> tuple[tuple[bytes, int], ...]:
        """The poisoned keys with their deaths, the most recent MAX_POISONED."""
        found = [(d, n) for d, n in self._deaths.items() if n >= self.after]
        return tuple(found[-MAX_POISONED:])
