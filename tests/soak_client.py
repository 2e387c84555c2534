"""One client process of the soak: keyed requests, pipelines, random disconnects.

    python -m tests.soak_client HOME OUT SEED SECONDS SESSION...

Writes ``<session> <key>`` to OUT for every acknowledged request (flushed at once), so
what was acknowledged survives whatever happens to this process.
"""

from __future__ import annotations

import contextlib
import random
import socket
import sys
import time

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


def main(argv: list[str]) -> int:
    home, out, seed, seconds, *sessions = argv
    rng = random.Random(int(seed))
    deadline = time.monotonic() + float(seconds)
    client = Client(home, timeout=30, retry_for=30)
    n = 0
    with open(out, "a", encoding="utf-8") as acked:
        while time.monotonic() < deadline:
            session = rng.choice(sessions)
            batch = [
                Request(text=f"{seed}:{n + i}", key=f"{seed}-{n + i}")
                for i in range(rng.randint(1, 8))
            ]
            n += len(batch)
            try:
                replies = client.send_many(session, batch)
            except ControlError as exc:
                print(f"unanswered {[r.key for r in batch]}: {exc}", file=sys.stderr, flush=True)
                continue
            for reply in replies:
                acked.write(f"{session} {reply['key']}\n")
            acked.flush()
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
