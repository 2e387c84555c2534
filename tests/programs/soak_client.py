"""One client process of the soak: keyed requests, pipelines, random disconnects.

    python -m tests.programs.soak_client HOME OUT SEED SECONDS SESSION...

Writes ``<session> <key>`` to OUT for every acknowledged request (flushed at once), so
what was acknowledged survives whatever happens to this process. Batches cross epoch
changes; what a batch left unanswered is sent again with its keys, and sometimes the
whole batch is. A refused request is written to stderr (``refused <key>: ...``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import sys
import time
import traceback
from typing import TextIO

import msgpack

from supervisor.client import Client, Request
from supervisor.control_socket import socket_path
from supervisor.errors import ControlError


def _rude_visit(home: str, rng: random.Random) -> None:
    """Connect, send part of (or a whole) large request, and vanish without reading."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(1)
        sock.connect(socket_path(home))
        frame = msgpack.packb({"id": 1, "op": "status"}) * rng.randint(1, 2000)
        sock.sendall(frame[: rng.randint(1, len(frame))])


def _send_with_retries(
    client: Client, session: str, batch: list[Request], acked: TextIO, rng: random.Random
) -> None:
    """Send a batch, then again what was not acknowledged (a partial batch), with its keys.

    Now and then the whole batch is sent again as well: what was applied must come back
    as a duplicate, never be applied a second time.
    """
    rest = batch
    for _attempt in range(4):
        began = time.monotonic()
        try:
            outcomes = client.send_many(session, rest)
        except ControlError as exc:
            # Nothing was sent (the session could not be reached): try it all again.
            print(f"unreachable {[r.key for r in rest]}: {exc}", file=sys.stderr, flush=True)
            continue
        for outcome in outcomes:
            kind = outcome["outcome"]
            if kind in ("applied", "duplicate"):
                acked.write(f"{session} {outcome['key']}\n")
            elif kind == "refused":
                print(f"refused {outcome['key']}: {outcome['error']}", file=sys.stderr, flush=True)
            else:  # why a client took long, should the soak's deadline pass
                took = time.monotonic() - began
                print(f"unanswered {outcome['key']} after {took:.1f} s: {outcome['error']}",
                      file=sys.stderr, flush=True)  # fmt: skip
        acked.flush()
        rest = [r for r, o in zip(rest, outcomes, strict=True) if o["outcome"] == "unanswered"]
        if not rest:
            break
    if rng.random() < 0.15:
        try:
            again = client.send_many(session, batch)
        except ControlError:
            return
        for outcome in again:
            if outcome["outcome"] in ("applied", "duplicate"):
                acked.write(f"{session} {outcome['key']}\n")
        acked.flush()


def say_where_and_end(_signo: int, frame: object) -> None:
    """SIGUSR1 (the soak's deadline passed): print where this client waits, and end."""
    stack = "".join(traceback.format_stack(frame))  # type: ignore[arg-type]
    print(f"stuck at:\n{stack}", file=sys.stderr, flush=True)
    os._exit(3)


def main(argv: list[str]) -> int:
    home, out, seed, seconds, *sessions = argv
    signal.signal(signal.SIGUSR1, say_where_and_end)
    rng = random.Random(int(seed))
    deadline = time.monotonic() + float(seconds)
    client = Client(home, timeout=30, retry_for=30)
    n = 0
    with open(out, "a", encoding="utf-8") as acked:
        while time.monotonic() < deadline:
            session = rng.choice(sessions)
            # A third of the batches have texts that pass the budget every request or
            # two: the session changes epochs inside the batch.
            padding = "x" * 6000 if rng.random() < 0.3 else ""
            batch = [
                Request(text=f"{seed}:{n + i}{padding}", key=f"{seed}-{n + i}")
                for i in range(rng.randint(1, 8))
            ]
            n += len(batch)
            _send_with_retries(client, session, batch, acked, rng)
            roll = rng.random()
            if roll < 0.05:
                client.close()  # a client that goes away and comes back
                client = Client(home, timeout=30, retry_for=30)
            elif roll < 0.08:
                _rude_visit(home, rng)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
