"""``python -m tests.programs.echo_process FD``: a thread echoing each byte read on the socket FD
back at once, while the main thread waits for a signal."""

from __future__ import annotations

import signal
import socket
import sys
import threading


def main(fd: int) -> int:
    sock = socket.socket(fileno=fd)

    def echo() -> None:
        while data := sock.recv(1):
            sock.sendall(data)

    threading.Thread(target=echo, daemon=True).start()
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
