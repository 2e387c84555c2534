"""The wire protocol: msgpack maps, one per message, over a stream socket, size-limited.

Requests are ``{"id", "op", ...}``; replies ``{"id", "ok": true, "result"}`` or
``{"id", "ok": false, "error": {"code", "message"}}``. A frame over the size limit, one
that does not decode, or one that is not a map with string keys raises ``WireError``;
the reader then replies with an error or closes that one connection.
"""

from __future__ import annotations

import socket
from typing import Final, TypeVar

import msgpack

from worker.errors import SessionError

MAX_FRAME: Final = 1 << 20
_READ_SIZE: Final = 65536
Message = dict[str, object]
_T = TypeVar("_T")


class WireError(SessionError):
    """A frame broke the protocol (too large, undecodable, or not a map of string keys)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why

    def __str__(self) -> str:
        return f"protocol error: {self.why}"


def field(message: Message, name: str, kind: type[_T], *, default: _T | None = None) -> _T:
    """Return ``message[name]`` if it is of ``kind`` (or ``default`` when absent and given).

    Raises WireError naming the field otherwise: an ill-typed frame gets an error reply.
    """
    value = message.get(name, default)
    if value is None and default is None and name not in message:
        raise WireError(f"field {name!r} is missing")
    # bool is an int to isinstance; a count must not be True.
    if type(value) is not kind and not (kind is float and type(value) is int):
        raise WireError(f"field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value  # type: ignore[return-value]


def optional_field(message: Message, name: str, kind: type[_T]) -> _T | None:
    """Return ``message[name]`` if present and not nil, checked as in ``field``; else None."""
    if message.get(name) is None:
        return None
    return field(message, name, kind)


def encode(message: Message) -> bytes:
    """Return the frame of one message."""
    frame: bytes = msgpack.packb(message, use_bin_type=True)
    if len(frame) > MAX_FRAME:
        raise WireError(f"message of {len(frame)} bytes exceeds the {MAX_FRAME}-byte limit")
    return frame


def ok(request_id: object, result: object) -> Message:
    """Return a success reply."""
    return {"id": request_id, "ok": True, "result": result}


def error(request_id: object, code: str, message: str) -> Message:
    """Return an error reply."""
    return {"id": request_id, "ok": False, "error": {"code": code, "message": message}}


class Channel:
    """One end of a stream socket carrying msgpack messages."""

    def __init__(self, sock: socket.socket, max_frame: int = MAX_FRAME) -> None:
        self.sock = sock
        self._max_frame = max_frame
        self._unpacker = msgpack.Unpacker(
            raw=False, max_buffer_size=max_frame, strict_map_key=True, use_list=True
        )
        self._ready: list[Message] = []
        self.closed = False

    def fileno(self) -> int:
        """The socket's fd (so a selector can watch the channel)."""
        return self.sock.fileno()

    def send(self, message: Message) -> None:
        """Send one message whole."""
        self.sock.sendall(encode(message))

    def read_nowait(self) -> list[Message]:
        """Read what the socket has now (call when it is readable); return whole messages.

        Sets ``closed`` at end of stream. Raises WireError on a bad frame.
        """
        data = self._recv_or_reset(0)
        if not data:
            self.closed = True
            return self._take()
        self._feed(data)
        return self._take()

    def drain_nowait(self) -> list[Message]:
        """Read everything the socket holds right now, without blocking; return messages."""
        while not self.closed:
            try:
                data = self._recv_or_reset(socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not data:
                self.closed = True
                break
            self._feed(data)
        return self._take()

    def recv(self) -> Message | None:
        """Block until one whole message arrives; None at end of stream (or a reset)."""
        while not self._ready:
            if self.closed:
                return None
            data = self._recv_or_reset(0)
            if not data:
                self.closed = True
                return None
            self._feed(data)
        return self._ready.pop(0)

    def _recv_or_reset(self, flags: int) -> bytes:
        try:
            return self.sock.recv(_READ_SIZE, flags)
        except ConnectionResetError:
            return b""  # the peer died with data unread: as good as end of stream

    def _feed(self, data: bytes) -> None:
        try:
            self._unpacker.feed(data)
            for message in self._unpacker:
                if type(message) is not dict:
                    raise WireError(f"a frame must be a map, got {type(message).__name__}")
                self._ready.append(message)
        except msgpack.BufferFull as exc:
            raise WireError("frame exceeds the size limit") from exc
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
            # ValueError covers invalid UTF-8 and non-string map keys (strict_map_key).
            raise WireError(f"undecodable frame: {exc}") from exc

    def reset(self) -> None:
        """Drop whatever is buffered after a bad frame, so the next frame starts clean."""
        self._unpacker = msgpack.Unpacker(
            raw=False, max_buffer_size=self._max_frame, strict_map_key=True, use_list=True
        )
        self._ready.clear()

    def _take(self) -> list[Message]:
        ready, self._ready = self._ready, []
        return ready

    def close(self) -> None:
        """Close the socket."""
        self.closed = True
        self.sock.close()
