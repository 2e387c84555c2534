"""The reference worker for the supervisord comparison: open a session, answer pings.

    python scripts/supervisor/reference_server.py --home H --session ID --socket PATH

It does the same start-up work as a loopd worker (lock and open the session, reading
every record) and then answers each connection on PATH with its pid, so a kill loop can
tell when a restarted process serves again.
"""

from __future__ import annotations

import argparse
import os
import socket

from worker import Session


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", required=True)
    parser.add_argument("--session", required=True)
    parser.add_argument("--socket", required=True)
    args = parser.parse_args()
    session = Session.open(args.home, args.session)
    if os.path.exists(args.socket):
        os.unlink(args.socket)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(args.socket)
    server.listen(16)
    try:
        while True:
            conn, _ = server.accept()
            with conn:
                conn.sendall(f"{os.getpid()} {len(session.records)}\n".encode())
    finally:
        session.close()


if __name__ == "__main__":
    main()
