"""Mutants of slow turns: the request deadline, progress, chunks, the poison ledger."""

from __future__ import annotations

import signal


def progress_keeps_deadline() -> None:
    from worker.loop import turns  # noqa: PLC0415 - only worker-level children load it

    def progress(self: turns.TurnRunner) -> None:
        self._check_thread("progress")
        if self.cell is not None:
            self.cell.beat()  # the bug: the request's deadline is not restarted

    turns.TurnRunner.progress = progress  # type: ignore[method-assign]


def deadline_never_armed() -> None:
    from worker.loop import turns  # noqa: PLC0415 - only worker-level children load it

    def begin(self: turns.TurnRunner, payloads: list[dict[str, object]], requests: int) -> None:
        if self.cell is not None:
            keys = [k for k in (p.get("key") for p in payloads) if type(k) is str]
            self.cell.begin_turn(keys)
        # The bug: ITIMER_REAL is never armed; a turn may run past its deadline.
        signal.setitimer(signal.ITIMER_REAL, 0)

    turns.TurnRunner._begin = begin  # type: ignore[method-assign]


def chunk_drops_last_request() -> None:
    from worker.loop import server  # noqa: PLC0415 - only worker-level children load it

    def apply(self: server.Server, batch: list[tuple[object, object, dict[str, object]]]) -> None:
        if not batch:
            return
        done = 0
        while done < len(batch):
            size = self.runner.chunk_size()
            chunk = batch[done : done + size]
            # The bug: a chunk of several ends one early (an off-by-one in its slice).
            self._apply_chunk(chunk[:-1] if len(chunk) > 1 else chunk)  # type: ignore[arg-type]
            done += size
            for peer in list(self.peers.values()):
                peer.flush()

    server.Server._apply = apply  # type: ignore[method-assign,assignment]


def poison_death_counted_twice() -> None:
    from supervisor.sessions import poison  # noqa: PLC0415 - only the poison probe needs it

    original = poison.PoisonLedger.charge

    def charge(self: poison.PoisonLedger, digests: list[bytes]) -> list[bytes]:
        return original(self, digests) + original(self, digests)  # the bug: one death, two

    poison.PoisonLedger.charge = charge  # type: ignore[method-assign]
