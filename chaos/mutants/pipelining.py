"""Mutants of pipelined batches: a key carried twice in one batch."""

from __future__ import annotations

from worker.ipc.wire import Message
from worker.store.format.records import Record


def repeated_key_not_flushed() -> None:
    from worker import app  # noqa: PLC0415 - only worker-level children load it

    original = app._Batch.add

    def add(
        self: app._Batch, index: int, key: str | None, records: list[Record], result: Message
    ) -> None:
        original(self, index, key, records, result)
        # The bug: the batch does not remember its keys, so a key it carries again is
        # looked up before its first records are written (no flush before it), found
        # nowhere, and applied again in the same group.
        if key is not None:
            self.keys.discard(key)

    app._Batch.add = add  # type: ignore[method-assign]
