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

from worker.store.errors import SessionError

MAX_FRAME: Final = 1 << 20
MAX_REQUEST_ID: Final = 256
"""The longest string a request id may be: a reply must never outgrow its request."""
SHORT_FIELD: Final = 256
"""Characters (or bytes) of a reply's field kept when the whole reply is too large."""
_ERROR_TEXT: Final = 2000
_READ_SIZE: Final = 65536
_FEED_SIZE: Final = 1 << 18
_FIRST_BUFFER: Final = 1 << 16
"""A reader's first buffer. msgpack's own default is 1 MiB, and it appends every fed
chunk after the last until that end is reached: a long-lived connection of small
frames wrote its whole megabyte, in every worker and for every link of the daemon. It
grows (doubling, up to the frame limit) only when a frame needs more."""
Message = dict[str, object]
_T = TypeVar("_T")


class WireError(SessionError):
    """A frame broke the protocol (too large, undecodable, or not a map of string keys).

    ``decoded`` holds the whole messages that came before the bad frame in the same
    bytes: they are answered first, then the bad frame.
    """

    def __init__(self, why: str, decoded: list[Message] | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.decoded: list[Message] = decoded if decoded is not None else []

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


def request_id_problem(request_id: object) -> str | None:
    """Why ``request_id`` cannot be a request's id (an int, or a string of at most
    MAX_REQUEST_ID characters), or None if it can."""
    if type(request_id) is int or (type(request_id) is str and len(request_id) <= MAX_REQUEST_ID):
        return None
    return f"field 'id' must be an int or a string of at most {MAX_REQUEST_ID} characters"


def encode(message: Message, max_frame: int = MAX_FRAME) -> bytes:
    """Return the frame of one message (WireError past ``max_frame`` bytes)."""
    frame: bytes = msgpack.packb(message, use_bin_type=True)
    if len(frame) > max_frame:
        raise WireError(_too_large(len(frame), max_frame))
    return frame


def encode_reply(message: Message) -> bytes:
    """Return the frame of a reply to a request that was applied; never raises.

    A reply too large for a frame is sent without its big fields, which ``omitted``
    names: the request was applied, so it must be answered as applied, never as failed
    (a retry without a key would apply it twice).
    """
    try:
        return encode(message)
    except WireError:
        pass
    try:
        return encode(shrunk(message))
    except WireError:
        # Still too large (a result of many small fields): its status alone, and the id.
        result = message.get("result")
        names = [str(name) for name in result] if isinstance(result, dict) else []
        return encode(
            {"id": message.get("id"), "ok": message.get("ok"),
             "result": {"omitted": names[:SHORT_FIELD]}}
        )  # fmt: skip


def shrunk(message: Message) -> Message:
    """The reply without the fields that made it too large, naming what was left out."""
    failure = message.get("error")
    if isinstance(failure, dict):
        text = str(failure.get("message"))
        cut = text if len(text) <= _ERROR_TEXT else text[: _ERROR_TEXT - 3] + "..."
        code = str(failure.get("code"))[:SHORT_FIELD]
        return {"id": message.get("id"), "ok": False, "error": {"code": code, "message": cut}}
    result = message.get("result")
    if not isinstance(result, dict):
        return {"id": message.get("id"), "ok": message.get("ok"), "result": None}
    kept: dict[str, object] = {}
    omitted: list[str] = []
    for name, value in result.items():
        if isinstance(value, str | bytes) and len(value) > SHORT_FIELD:
            omitted.append(str(name))
        else:
            kept[str(name)] = value
    kept["omitted"] = omitted
    return {"id": message.get("id"), "ok": message.get("ok"), "result": kept}


def ok(request_id: object, result: object) -> Message:
    """Return a success reply."""
    return {"id": request_id, "ok": True, "result": result}


def error(request_id: object, code: str, message: str, **more: object) -> Message:
    """Return an error reply; ``more`` adds fields to its ``error`` (after code, message)."""
    return {"id": request_id, "ok": False, "error": {"code": code, "message": message, **more}}


class FrameReader:
    """Turns the bytes of a stream into messages, refusing any frame over ``max_frame``.

    The limit is exact: a frame of ``max_frame`` bytes is admitted, one byte more is
    refused, whether it arrives whole or a byte at a time.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._unpacker = self._new_unpacker()
        self._fed = 0
        self._consumed = 0

    def _new_unpacker(self) -> msgpack.Unpacker:
        # Room for one whole frame plus one fed chunk: the frame limit itself is checked
        # below against the unpacker's offsets, so it is exact.
        limit = self.max_frame + 2 * _FEED_SIZE
        return msgpack.Unpacker(
            raw=False,
            max_buffer_size=limit,
            read_size=min(_FIRST_BUFFER, limit),
            strict_map_key=True,
            use_list=True,
        )

    def feed(self, data: bytes) -> list[Message]:
        """Add bytes; return the messages they complete.

        WireError on a bad frame, carrying in ``decoded`` the messages before it.
        """
        ready: list[Message] = []
        try:
            if len(data) <= _FEED_SIZE:
                self._feed_chunk(data, ready)
            else:
                view = memoryview(data)
                for start in range(0, len(view), _FEED_SIZE):
                    self._feed_chunk(view[start : start + _FEED_SIZE], ready)
        except WireError as exc:
            exc.decoded = ready
            raise
        return ready

    def _feed_chunk(self, chunk: bytes | memoryview, ready: list[Message]) -> None:
        try:
            self._unpacker.feed(chunk)
            self._fed += len(chunk)
            for message in self._unpacker:
                end = self._unpacker.tell()
                if end - self._consumed > self.max_frame:
                    raise WireError(_too_large(end - self._consumed, self.max_frame))
                self._consumed = end
                if type(message) is not dict:
                    raise WireError(f"a frame must be a map, got {type(message).__name__}")
                ready.append(message)
        except msgpack.BufferFull as exc:
            raise WireError(_too_large(None, self.max_frame)) from exc
        except msgpack.StackError as exc:
            raise WireError("undecodable frame: it nests too deeply") from exc
        except (msgpack.ExtraData, msgpack.FormatError, ValueError) as exc:
            # ValueError covers invalid UTF-8 and non-string map keys (strict_map_key).
            raise WireError(f"undecodable frame: {exc or type(exc).__name__}") from exc
        if self._fed - self._consumed > self.max_frame:
            raise WireError(_too_large(None, self.max_frame))

    def reset(self) -> None:
        """Drop whatever is buffered after a bad frame, so the next frame starts clean."""
        self._unpacker = self._new_unpacker()
        self._fed = 0
        self._consumed = 0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole message."""
        return self._fed - self._consumed


def _too_large(size: int | None, limit: int) -> str:
    what = f"a frame of {size} bytes" if size is not None else "a frame"
    return f"{what} exceeds the size limit of {limit} bytes"


class Channel:
    """One end of a stream socket carrying msgpack messages."""

    def __init__(self, sock: socket.socket, max_frame: int = MAX_FRAME) -> None:
        self.sock = sock
        self._reader = FrameReader(max_frame)
        self._ready: list[Message] = []
        self.closed = False

    def fileno(self) -> int:
        """The socket's fd (so a selector can watch the channel)."""
        return self.sock.fileno()

    def send(self, message: Message) -> None:
        """Send one message whole (EPIPE raises BrokenPipeError; never SIGPIPE)."""
        self.sock.sendall(encode(message), socket.MSG_NOSIGNAL)

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
        self._ready.extend(self._reader.feed(data))

    def reset(self) -> None:
        """Drop whatever is buffered after a bad frame, so the next frame starts clean."""
        self._reader.reset()
        self._ready.clear()

    def _take(self) -> list[Message]:
        ready, self._ready = self._ready, []
        return ready

    def close(self) -> None:
        """Close the socket."""
        self.closed = True
        self.sock.close()
