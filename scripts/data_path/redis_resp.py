"""A redis-server of the benchmark's own and a RESP client on the standard library.

Used by scripts/data_path/bench_redis.py: the server listens only on a unix socket in a private
directory (no TCP port), keeps no snapshots and appends every write to its AOF with an
fdatasync before the reply (``appendonly yes``, ``appendfsync always``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time

SOCKET = "redis.sock"


class RespError(Exception):
    """An error reply of the server (``-ERR ...``) or a reply this client cannot read."""


class Resp:
    """One connection to a Redis server's unix socket; one command at a time."""

    def __init__(self, path: str, timeout: float = 60.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(path)
        except BaseException:
            self.sock.close()
            raise
        self.reader = self.sock.makefile("rb")

    def __enter__(self) -> Resp:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def command(self, *args: str | bytes) -> object:
        """Send one command as a RESP array of bulk strings; return its reply."""
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg.encode() if isinstance(arg, str) else arg
            parts += [b"$%d\r\n" % len(data), data, b"\r\n"]
        self.sock.sendall(b"".join(parts))
        return self._read()

    def _read(self) -> object:
        line = self.reader.readline()
        if not line.endswith(b"\r\n"):
            raise ConnectionError("redis-server closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self.reader.read(size + 2)[:-2]
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._read() for _ in range(size)]
        raise RespError(f"unreadable reply line {line[:40]!r}")


def start_redis(binary: str, directory: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start redis-server in ``directory`` (made here); return it and its socket path."""
    os.makedirs(directory, mode=0o700)
    path = os.path.join(directory, SOCKET)
    log = os.path.join(directory, "redis.log")
    proc = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", path, "--unixsocketperm", "700",
         "--dir", directory, "--save", "", "--appendonly", "yes", "--appendfsync", "always",
         "--auto-aof-rewrite-percentage", "0", "--daemonize", "no", "--logfile", log],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # a ^C reaches the script, which stops the server itself
    )  # fmt: skip
    try:
        _wait_ready(proc, path, log)
    except BaseException:
        stop_redis(proc)
        raise
    return proc, path


def _wait_ready(proc: subprocess.Popen[bytes], path: str, log: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with Resp(path, timeout=5) as conn:
                if conn.command("PING") == "PONG":
                    found = conn.command("CONFIG", "GET", "append*")
                    break
        except (OSError, RespError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = ""
            if os.path.exists(log):
                with open(log, encoding="utf-8", errors="replace") as file:
                    tail = file.read()[-400:]
            raise RuntimeError(f"redis-server did not start: {tail.strip()}")
        time.sleep(0.01)
    assert isinstance(found, list)
    settings = dict(zip(found[::2], found[1::2], strict=True))
    if settings.get(b"appendonly") != b"yes" or settings.get(b"appendfsync") != b"always":
        raise RuntimeError(f"redis-server is not durable per write: {settings}")


def stop_redis(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (Redis flushes its AOF and exits), SIGKILL after 30 s; always reaped."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
