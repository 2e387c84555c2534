"""A fake OpenAI-compatible model server for tests and CI, on the standard library only.

    python -m examples.fake_model --port 0                 # prints the port, then serves
    python -m examples.fake_model --port 8080 --delay 0.5-2 --seed 7 --token-delay 0.02

It serves ``POST /v1/chat/completions`` (one JSON reply, or server-sent events with
``"stream": true``, the usage last with ``stream_options.include_usage``) and
``GET /v1/models``, as llama.cpp's server, vLLM and Ollama do, and answers by the rules
of ``examples.fake_replies``: tool calls decided by the conversation, wording that
varies per call (``--no-vary``: the same conversation gets the same answer; ``--seed``:
a reproducible sequence of variations). ``--delay A-B`` waits a uniformly drawn time
before each answer (``--delay 0`` for the chaos rig).

For tests it also keeps notes (``POST /fake/notes`` with an ``Idempotency-Key`` header:
a repeated key gets the first answer and adds nothing; ``GET /fake/notes`` lists them),
counts what it served (``GET /fake/stats``) and shows the messages of the last
completion (``GET /fake/last``).
"""

from __future__ import annotations

import argparse
import http.server
import json
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from types import FrameType
from typing import Final

from examples.fake_replies import TOOLS_MODES, FakeModel, FakeReply

MAX_BODY: Final = 8 << 20
MODEL_ID: Final = "fake"


@dataclass(slots=True)
class FakeSettings:
    """How the fake behaves: its delays and its reply rules."""

    delay: tuple[float, float] = (0.0, 0.0)
    token_delay: float = 0.0
    model: FakeModel = field(default_factory=FakeModel)


@dataclass(slots=True)
class FakeState:
    """What the fake served and the notes it keeps (shared by its handler threads)."""

    completions: int = 0
    summaries: int = 0
    streamed: int = 0
    last: list[object] = field(default_factory=list)  # the messages of the last completion
    notes: list[dict[str, object]] = field(default_factory=list)
    note_keys: dict[str, dict[str, object]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stats(self) -> dict[str, object]:
        with self.lock:
            return {
                "completions": self.completions,
                "summaries": self.summaries,
                "streamed": self.streamed,
                "notes": len(self.notes),
            }

    def keep_note(self, text: str, key: str | None) -> tuple[dict[str, object], bool]:
        """The note for ``key`` (kept once) and whether it is new."""
        with self.lock:
            if key is not None and key in self.note_keys:
                return self.note_keys[key], False
            note: dict[str, object] = {"id": len(self.notes) + 1, "text": text, "key": key}
            self.notes.append(note)
            if key is not None:
                self.note_keys[key] = note
            return note, True


class FakeServer(http.server.ThreadingHTTPServer):
    """The HTTP server: one thread per connection, none of them keeping the process up."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], settings: FakeSettings) -> None:
        super().__init__(address, _Handler)
        self.settings = settings
        self.state = FakeState()
        self.draw = random.Random(settings.model.seed)
        self.draw_lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def delay(self) -> float:
        low, high = self.settings.delay
        with self.draw_lock:
            return self.draw.uniform(low, high) if high > low else low


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeServer
    protocol_version = "HTTP/1.1"
    # Headers, body and events are separate writes: without TCP_NODELAY each one after
    # the first waits for the client's delayed ACK (some 40 ms on Linux).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:
        return None  # quiet: tests and the rig read their own output

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})
        elif self.path == "/fake/stats":
            self._json(200, self.server.state.stats())
        elif self.path == "/fake/notes":
            with self.server.state.lock:
                notes = list(self.server.state.notes)
            self._json(200, {"notes": notes})
        elif self.path == "/fake/last":
            with self.server.state.lock:
                last = list(self.server.state.last)
            self._json(200, {"messages": last})
        else:
            self._json(404, {"error": {"message": f"no such path {self.path}"}})

    def do_POST(self) -> None:
        body = self._body()
        if body is None:
            return
        if self.path == "/fake/notes":
            text = body.get("text")
            if not isinstance(text, str):
                self._json(400, {"error": {"message": "a note needs a string 'text'"}})
                return
            note, new = self.server.state.keep_note(text, self.headers.get("Idempotency-Key"))
            self._json(201 if new else 200, note)
        elif self.path == "/v1/chat/completions":
            self._complete(body)
        else:
            self._json(404, {"error": {"message": f"no such path {self.path}"}})

    def _body(self) -> dict[str, object] | None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._json(413, {"error": {"message": f"body over {MAX_BODY} bytes"}})
            return None
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            self._json(400, {"error": {"message": f"body is not JSON: {exc}"}})
            return None
        if not isinstance(body, dict):
            self._json(400, {"error": {"message": "body is not a JSON object"}})
            return None
        return body

    def _complete(self, body: dict[str, object]) -> None:
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) for m in messages)
        ):
            self._json(400, {"error": {"message": "messages must be a non-empty list of objects"}})
            return
        tools = body.get("tools")
        offered = {
            str(t["function"].get("name"))
            for t in (tools if isinstance(tools, list) else [])
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        }
        reply = self.server.settings.model.reply(messages, offered)
        state = self.server.state
        with state.lock:
            state.completions += 1
            state.summaries += reply.summary
            state.streamed += body.get("stream") is True
            state.last = list(messages)
        time.sleep(self.server.delay())
        if body.get("stream") is True:
            options = body.get("stream_options")
            usage = isinstance(options, dict) and options.get("include_usage") is True
            self._stream(reply, usage)
        else:
            self._json(200, _completion(reply))

    def _stream(self, reply: FakeReply, with_usage: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        for chunk in _chunks(reply, with_usage):
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            if self.server.settings.token_delay:
                time.sleep(self.server.settings.token_delay)
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def _json(self, status: int, document: dict[str, object]) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _usage(reply: FakeReply) -> dict[str, object]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _completion(reply: FakeReply) -> dict[str, object]:
    message: dict[str, object] = {"role": "assistant", "content": reply.content or None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.calls
        ]
    return {
        "id": "fake-completion",
        "object": "chat.completion",
        "model": MODEL_ID,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.calls else "stop",
            }
        ],
        "usage": _usage(reply),
    }


def _chunks(reply: FakeReply, with_usage: bool) -> list[dict[str, object]]:
    """The events of a streamed reply: a word at a time, a tool call's arguments in two."""
    deltas: list[dict[str, object]] = [{"role": "assistant", "content": ""}]
    words = reply.content.split(" ")
    deltas += [{"content": w if i == 0 else " " + w} for i, w in enumerate(words) if reply.content]
    for index, call in enumerate(reply.calls):
        half = len(call.arguments) // 2
        deltas.append(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                ]
            }
        )
        for piece in (call.arguments[:half], call.arguments[half:]):
            deltas.append({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    base = {"id": "fake-completion", "object": "chat.completion.chunk", "model": MODEL_ID}
    chunks: list[dict[str, object]] = [
        {**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas
    ]
    finish = "tool_calls" if reply.calls else "stop"
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    if with_usage:
        chunks.append({**base, "choices": [], "usage": _usage(reply)})
    return chunks


def start_in_thread(settings: FakeSettings, host: str = "127.0.0.1", port: int = 0) -> FakeServer:
    """Serve in a daemon thread of this process; ``server.port`` is where, ``shutdown()`` stops."""
    server = FakeServer((host, port), settings)
    threading.Thread(target=server.serve_forever, name="fake-model", daemon=True).start()
    return server


def parse_delay(text: str) -> tuple[float, float]:
    """``0.5-2`` or ``0``: the range of seconds each answer waits."""
    low, sep, high = text.partition("-")
    try:
        bounds = (float(low), float(high) if sep else float(low))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"delay must be S or A-B seconds, got {text!r}") from exc
    if bounds[0] < 0 or bounds[1] < bounds[0]:
        raise argparse.ArgumentTypeError(f"delay must be 0 <= A <= B, got {text!r}")
    return bounds


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m examples.fake_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    parser.add_argument(
        "--delay",
        type=parse_delay,
        default=(0.5, 2.0),
        help="seconds before each answer, S or A-B (default 0.5-2)",
    )
    parser.add_argument(
        "--token-delay", type=float, default=0.0, help="seconds between streamed events (default 0)"
    )
    parser.add_argument(
        "--no-vary",
        dest="vary",
        action="store_false",
        help="the same conversation gets the same answer",
    )
    parser.add_argument(
        "--vary-length",
        action="store_true",
        help="answers vary in length too (token counts then vary)",
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="a reproducible sequence of variations and delays"
    )
    parser.add_argument(
        "--tools",
        choices=TOOLS_MODES,
        default="auto",
        help="auto: calls asked for by the text; always: at least one per turn; "
        "notes: a post_note of the text when nothing else is asked for",
    )
    return parser


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM or SIGINT; the first line on stdout is the port."""
    args = _parser().parse_args(argv)
    model = FakeModel(
        vary=args.vary, vary_length=args.vary_length, seed=args.seed, tools=args.tools
    )
    settings = FakeSettings(delay=args.delay, token_delay=args.token_delay, model=model)
    try:
        server = FakeServer((args.host, args.port), settings)
    except OSError as exc:
        print(f"fake model: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, _stop)
    print(server.port, flush=True)
    try:
        server.serve_forever()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
