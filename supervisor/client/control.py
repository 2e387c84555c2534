"""One control request on a home's socket: ``call``, and ``call_with_retry`` by key.

Before sending anything, the socket file and the process behind it are checked to
belong to the caller's own uid: another user cannot stand in for the daemon.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import time
from typing import Final

from supervisor.control_socket import (
    MAX_SOCKET_PATH,
    peer_uid,
    socket_owner_problem,
    socket_path,
)
from supervisor.errors import ControlError
from worker.ipc.wire import FrameReader, Message, WireError, encode

__all__ = [
    "READ_SIZE", "RETRYABLE", "TIMEVAL", "call", "call_with_retry", "open_control", "statuses",
]  # fmt: skip

RETRYABLE: Final = frozenset({"worker_died", "closed", "no_daemon", "busy"})
"""Error codes after which the same request (same key) may simply be sent again."""
READ_SIZE: Final = 1 << 18
_SMALL: Final = 32 << 10
"""Requests up to this many bytes are written with one blocking send (they fit the buffer)."""
TIMEVAL: Final = struct.Struct("ll")
_BACKLOG_FULL: Final = frozenset({errno.EAGAIN})
_FIRST_CONNECT_PAUSE: Final = 0.002
_LAST_CONNECT_PAUSE: Final = 0.05
"""Seconds between connects while the daemon's accept backlog is full: from 2 ms, doubling."""
_CLOSED_ON_US: Final = (BrokenPipeError, ConnectionResetError)
_DRAIN_WAIT: Final = 1.0
"""Seconds at most to read what a peer that closed on us said before it closed."""
STATUS_PAGE: Final = 500
"""Rows asked for per status page (the daemon also stops a page at half a frame)."""


def open_control(home: str, timeout: float) -> socket.socket:
    """Connect to ``<home>/loopd.sock`` after checking that it and its peer are ours."""
    path = socket_path(home)
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ControlError(
            "bad_home",
            f"{shown_path(path)}: the socket path is {len(os.fsencode(path))} bytes, over the "
            f"{MAX_SOCKET_PATH}-byte limit of a Unix socket: no supervisor can listen there; "
            "choose a shorter --home",
        )
    try:
        problem = socket_owner_problem(path)
    except OSError as exc:
        raise ControlError("bad_home", f"{shown_path(path)}: {exc.strerror}") from exc
    if problem is not None:
        raise ControlError("not_ours", f"{problem}: refusing to talk to it")
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        _connect_until(sock, path, deadline)
        uid = peer_uid(sock)
    except TimeoutError as exc:
        sock.close()
        raise ControlError(
            "busy",
            f"the supervisor at {path} did not accept the connection within {timeout:g} s: "
            "its accept backlog stayed full (it is running but overloaded); retry later "
            "or with a longer --timeout",
        ) from exc
    except OSError as exc:
        sock.close()
        raise ControlError(
            "no_daemon",
            f"cannot reach the supervisor at {path}: {exc.strerror or exc} "
            f"(is `loopd serve --home {home}` running?)",
        ) from exc
    if uid != os.getuid():
        sock.close()
        raise ControlError(
            "not_ours", f"{path} is served by uid {uid}, not by you: refusing to talk to it"
        )
    return sock


def _connect_until(sock: socket.socket, path: str, deadline: float) -> None:
    """Connect, waiting out a full accept backlog until ``deadline`` (then TimeoutError).

    A Unix socket's connect fails at once with EAGAIN when the listener's backlog is full,
    even on a socket with a timeout (it is non-blocking inside): the daemon is there but
    busy accepting, which is no reason to say it is not running. ECONNREFUSED (nobody
    listens) and ENOENT are not retried.
    """
    pause = _FIRST_CONNECT_PAUSE
    while True:
        try:
            sock.connect(path)
        except OSError as exc:
            if exc.errno not in _BACKLOG_FULL:
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(exc.errno, exc.strerror) from exc
        else:
            return
        time.sleep(min(pause, left))
        pause = min(pause * 2, _LAST_CONNECT_PAUSE)


def shown_path(path: str, limit: int = 200) -> str:
    """``path`` for a message: a path of thousands of characters is cut in the middle."""
    if len(path) <= limit:
        return path
    return f"{path[: limit // 2]}...({len(path)} characters)...{path[-limit // 2 :]}"


def timed_out(home: str, timeout: float) -> ControlError:
    return ControlError(
        "timeout",
        f"the supervisor of {home} did not answer within {timeout:g} s; it may be stopped "
        "or overloaded (check its process), or the session waits (`loopd status`: a session "
        "in BACKOFF says what for), or retry with a longer --timeout",
    )


def result_of(reply: Message) -> object:
    if reply.get("ok") is True:
        return reply.get("result")
    failure = reply.get("error")
    if isinstance(failure, dict):
        raise ControlError(str(failure.get("code")), str(failure.get("message")))
    raise ControlError("bad_reply", f"unexpected reply {reply!r}")


def exchange(
    sock: socket.socket,
    frames: bytes,
    wanted: int,
    deadline: float,
    replies: list[Message] | None = None,
) -> tuple[list[Message], list[int]]:
    """Write ``frames`` while reading replies, until ``wanted`` arrived; replies and fds.

    Reading while writing means a long pipeline never deadlocks against a peer that
    stops reading until its replies are taken. Raises ConnectionError at end of stream,
    TimeoutError at the deadline: the replies whole before either are in ``replies``
    when the caller passes that list (it is the list returned, filled as they come).
    A peer that refused the connection and closed it before reading (the daemon's
    ``busy``) is raised as its ControlError, whichever the send or the read meets first.
    """
    replies = [] if replies is None else replies
    if len(frames) <= _SMALL:
        return _exchange_small(sock, frames, wanted, deadline, replies)
    reader = FrameReader()
    fds: list[int] = []
    out = memoryview(frames)
    sock.setblocking(False)
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0))
        while len(replies) < wanted:
            left = deadline - time.monotonic()
            if left <= 0:
                for fd in fds:
                    os.close(fd)
                raise TimeoutError
            for _key, mask in selector.select(left):
                if mask & selectors.EVENT_WRITE and out:
                    try:
                        out = out[sock.send(out) :]
                    except BlockingIOError:
                        continue  # woken early: the buffer filled again meanwhile
                    except _CLOSED_ON_US:
                        _raise_refusal(sock, reader, deadline)
                        raise
                    if not out:
                        selector.modify(sock, selectors.EVENT_READ)
                if mask & selectors.EVENT_READ:
                    data, got = _recv(sock)
                    fds += got
                    if data is None:
                        continue
                    if not data:
                        raise ConnectionResetError("end of stream")
                    try:
                        replies += reader.feed(data)
                    except WireError as exc:
                        raise ControlError("bad_reply", str(exc)) from exc
    return replies, fds


def _exchange_small(
    sock: socket.socket, frames: bytes, wanted: int, deadline: float, replies: list[Message]
) -> tuple[list[Message], list[int]]:
    """``_exchange`` for a few requests: they fit the socket's buffer, so a blocking
    write cannot wait on the peer; no selector is needed (one request, two syscalls)."""
    reader = FrameReader()
    fds: list[int] = []
    sock.settimeout(max(0.001, deadline - time.monotonic()))
    if frames:
        try:
            sock.sendall(frames)
        except _CLOSED_ON_US:
            _raise_refusal(sock, reader, deadline)
            raise
    while len(replies) < wanted:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        data, got, _flags, _addr = socket.recv_fds(sock, READ_SIZE, 4)
        fds += got
        if not data:
            raise ConnectionResetError("end of stream")
        try:
            replies += reader.feed(data)
        except WireError as exc:
            raise ControlError("bad_reply", str(exc)) from exc
    return replies, fds


def _raise_refusal(sock: socket.socket, reader: FrameReader, deadline: float) -> None:
    """The peer closed before reading what was being sent: raise what it said first, a
    refusal of the connection (the daemon's ``busy`` past its limit, written as it
    accepts and closes), as that error; return if it said none. The refusal is read
    from what this end holds, so it is the peer's words, not a guess from EPIPE."""
    said: list[Message] = []
    sock.settimeout(max(0.001, min(_DRAIN_WAIT, deadline - time.monotonic())))
    try:
        while data := sock.recv(READ_SIZE):
            said += reader.feed(data)
    except (OSError, WireError):
        pass  # the end of what can be read (ECONNRESET, a frame cut short): judge what came
    for reply in said:
        failure = reply.get("error")
        if reply.get("id") is None and isinstance(failure, dict):
            raise ControlError(str(failure.get("code")), str(failure.get("message")))


def _recv(sock: socket.socket) -> tuple[bytes | None, list[int]]:
    """Bytes and descriptors the socket holds; None when there was nothing after all."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, READ_SIZE, 4)
    except BlockingIOError:
        return None, []
    return data, list(fds)


def not_utf8(text: str) -> str | None:
    """Why ``text`` cannot travel as UTF-8 (a lone surrogate, as undecodable bytes of a
    command line become), or None if it can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"character {exc.start + 1} ({text[exc.start]!r}) is a lone surrogate, "
                "not UTF-8 text (bytes that are not UTF-8 arrive as these)")  # fmt: skip
    return None


def encode_request(request: Message) -> bytes:
    """The request's frame; ControlError (nothing sent) if a field is not UTF-8 text or
    the request is over the frame limit."""
    for name, value in request.items():
        problem = not_utf8(value) if isinstance(value, str) else None
        if problem is not None:
            raise ControlError("bad_request", f"field {name!r}: {problem}")
    try:
        return encode(request)
    except WireError as exc:
        raise ControlError("too_large", str(exc)) from exc


def call(home: str, op: str, *, timeout: float = 60.0, **fields: object) -> object:
    """Send ``{"id", "op", **fields}`` and return the result; ControlError on an error reply."""
    request: Message = {"id": 1, "op": op, **{k: v for k, v in fields.items() if v is not None}}
    frame = encode_request(request)
    deadline = time.monotonic() + timeout
    sock = open_control(home, timeout)
    try:
        try:
            replies, fds = exchange(sock, frame, 1, deadline)
        except TimeoutError as exc:
            raise timed_out(home, timeout) from exc
        except OSError as exc:
            raise ControlError("closed", f"the supervisor closed the connection: {exc}") from exc
    finally:
        sock.close()
    for fd in fds:
        os.close(fd)
    return result_of(replies[0])


def call_with_retry(home: str, op: str, *, deadline: float, **fields: object) -> object:
    """``call``, sent again unchanged after a retryable error until ``deadline`` (monotonic).

    With a request key, a request that was applied before its worker died is answered
    from the log the second time, so retrying never doubles its effect.
    """
    while True:
        try:
            return call(home, op, timeout=max(1.0, deadline - time.monotonic()), **fields)
        except ControlError as exc:
            if exc.code not in RETRYABLE or time.monotonic() > deadline:
                raise


def statuses(home: str, *, timeout: float = 60.0) -> list[Message]:
    """Every session's status row, in id order, fetched page by page (one request each), so
    that any number of sessions can be listed; ``timeout`` bounds the whole listing."""
    deadline = time.monotonic() + timeout
    rows: list[Message] = []
    after = ""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise timed_out(home, timeout)
        try:
            page = call(home, "status", timeout=left, after=after, limit=STATUS_PAGE)
        except ControlError as exc:
            if exc.code == "timeout":
                raise timed_out(home, timeout) from exc  # the whole listing's timeout
            raise
        if isinstance(page, list):  # a daemon without pages answers with every row at once
            return [row for row in page if isinstance(row, dict)]
        if not isinstance(page, dict) or not isinstance(page.get("sessions"), list):
            raise ControlError("bad_reply", f"unexpected status page {page!r:.200}")
        rows += [row for row in page["sessions"] if isinstance(row, dict)]
        following = page.get("next")
        if not isinstance(following, str) or following <= after:
            return rows
        after = following


def daemon_answers(home: str, timeout: float) -> bool:
    """Whether a daemon serves ``home`` (it answers a ping); ControlError for any other
    failure than no daemon at all."""
    try:
        call(home, "ping", timeout=timeout)
    except ControlError as exc:
        if exc.code == "no_daemon":
            return False
        raise
    return True
