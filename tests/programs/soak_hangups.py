"""A soak client that hangs up before its replies, then retries each request by key.

    python -m tests.programs.soak_hangups HOME OUT SEED SECONDS SESSION...

Each request goes out on the worker's direct connection, and the connection is closed
at once, before the reply (as a ^C'd ``loopd send`` or a client giving up does). Every
so often the client then sends the same requests again, with their keys, through a
``Client`` and waits: each must be answered (applied now, or a duplicate of the first
send), and is written to OUT as acknowledged. A hang-up must never kill the worker or
apply a request twice.
"""

from __future__ import annotations

import contextlib
import random
import signal
import sys
import time

from supervisor.client import Client, Request
from supervisor.errors import ControlError
from tests.programs.soak_client import say_where_and_end
from worker.ipc.wire import encode


def _hang_up(home: str, session: str, key: str) -> None:
    """Send one keyed request straight to the worker and close before its reply."""
    client = Client(home, timeout=5, retry_for=5)
    try:
        sock = client.link(session, time.monotonic() + 5)
        payload = {"text": f"hang-up {key}", "key": key}
        sock.sendall(encode({"id": 1, "op": "request", "request": payload}))
    except (ControlError, OSError):
        pass  # the worker was being restarted: the retry below sends it anyway
    finally:
        client.close()  # before the reply: the worker must survive it


def main(argv: list[str]) -> int:
    home, out, seed, seconds, *sessions = argv
    signal.signal(signal.SIGUSR1, say_where_and_end)
    rng = random.Random(int(seed))
    deadline = time.monotonic() + float(seconds)
    n = 0
    with (
        open(out, "a", encoding="utf-8") as acked,
        Client(home, timeout=30, retry_for=30) as retrier,
    ):
        while time.monotonic() < deadline:
            session = rng.choice(sessions)
            keys = [f"h{seed}-{n + i}" for i in range(rng.randint(1, 4))]
            n += len(keys)
            for key in keys:
                _hang_up(home, session, key)
            with contextlib.suppress(ControlError):
                replies = retrier.send_many(
                    session, [Request(text=f"hang-up {k}", key=k) for k in keys]
                )
                for key, reply in zip(keys, replies, strict=True):
                    if reply["outcome"] in ("applied", "duplicate") and reply["key"] == key:
                        acked.write(f"{session} {key}\n")
                acked.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
