"""A client of an OpenAI-compatible chat endpoint, on the standard library's ``http.client``.

``POST {base}/v1/chat/completions`` is what llama.cpp's ``llama-server``, vLLM, Ollama
and the fake model of ``examples.fake_model`` serve. The client sends the messages and
the tools, reads one reply (or its server-sent events with ``stream``), and returns the
text, the tool calls and the token usage. Every failure (unreachable, a timeout, an HTTP
error, a reply that is not the format) is a ``ChatError`` naming the URL and what was
wrong.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

COMPLETIONS_PATH: Final = "/v1/chat/completions"
ERROR_QUOTE: Final = 300  # characters of a server's error body quoted in a ChatError


class ChatError(Exception):
    """The model server could not be reached or did not answer in the chat format."""

    def __init__(self, url: str, why: str) -> None:
        super().__init__(url, why)
        self.url = url
        self.why = why

    def __str__(self) -> str:
        return f"{self.url}: {self.why}"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model asked for: its id, the tool's name, its JSON arguments."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatUsage:
    """The token counts the server reported for one completion (0 when it gave none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ChatReply:
    """One completion: its text, the tool calls it asks for, and its usage."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: ChatUsage = field(default_factory=ChatUsage)


Messages = Sequence[Mapping[str, object]]
OnToken = Callable[[str], None]


def _ignore(_text: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class ChatClient:
    """The endpoint (``http://host:port`` with an optional path prefix) and how to call it."""

    base_url: str
    model: str
    timeout: float = 120.0
    stream: bool = True
    api_key: str | None = None

    def __post_init__(self) -> None:
        try:
            parts = urllib.parse.urlsplit(self.base_url)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname)
            valid = valid and (parts.port is None or parts.port > 0)
        except ValueError:  # a port that is not a number, a bad IPv6 address
            valid = False
        if not valid:
            raise ValueError(
                f"model endpoint {self.base_url!r} is not an http(s)://host[:port] URL"
            )
        if self.timeout <= 0:
            raise ValueError(f"model timeout must be above 0 s, got {self.timeout}")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + COMPLETIONS_PATH

    def complete(
        self,
        messages: Messages,
        *,
        tools: Sequence[Mapping[str, object]] = (),
        on_token: OnToken = _ignore,
    ) -> ChatReply:
        """Ask for one completion; ``on_token`` gets each piece of text as it streams."""
        body: dict[str, object] = {"model": self.model, "messages": list(messages)}
        if tools:
            body["tools"] = list(tools)
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        response, connection = self._post(json.dumps(body).encode())
        try:
            if self.stream:
                reply = _read_stream(self.url, response, on_token)
            else:
                reply = _one_reply(self.url, _read_json(self.url, response))
                if reply.content:
                    on_token(reply.content)
        except (OSError, http.client.HTTPException) as exc:
            raise ChatError(self.url, f"the reply broke off: {exc}") from exc
        finally:
            connection.close()
        return reply

    def _post(self, data: bytes) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        parts = urllib.parse.urlsplit(self.url)
        kind = (
            http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        )
        connection = kind(parts.hostname or "", parts.port, timeout=self.timeout)
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            connection.request("POST", parts.path, body=data, headers=headers)
            response = connection.getresponse()
        except TimeoutError as exc:
            connection.close()
            raise ChatError(self.url, f"no answer within {self.timeout:g} s") from exc
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise ChatError(self.url, f"cannot reach the model server: {exc}") from exc
        if response.status != http.client.OK:
            text = response.read(ERROR_QUOTE).decode("utf-8", "replace")
            connection.close()
            raise ChatError(self.url, f"HTTP {response.status} {response.reason}: {text}")
        return response, connection


def _read_json(url: str, response: http.client.HTTPResponse) -> dict[str, object]:
    try:
        document = json.loads(response.read())
    except ValueError as exc:
        raise ChatError(url, f"the reply is not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ChatError(url, "the reply is not a JSON object")
    return document


def _one_reply(url: str, document: dict[str, object]) -> ChatReply:
    """The first choice of a non-streamed completion."""
    choices = document.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ChatError(url, "the reply has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise ChatError(url, "the reply's first choice has no message")
    content = message.get("content")
    calls = []
    for number, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ChatError(url, f"tool call {number} has no function name")
        arguments = function.get("arguments")
        calls.append(
            ToolCall(
                id=str(call.get("id") or f"call_{number}"),
                name=function["name"],
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    return ChatReply(
        content=content if isinstance(content, str) else "",
        tool_calls=tuple(calls),
        usage=_usage(document.get("usage")),
    )


def _usage(value: object) -> ChatUsage:
    if not isinstance(value, dict):
        return ChatUsage()
    prompt, completion = value.get("prompt_tokens"), value.get("completion_tokens")
    return ChatUsage(
        prompt_tokens=prompt if type(prompt) is int else 0,
        completion_tokens=completion if type(completion) is int else 0,
    )


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _read_stream(url: str, response: http.client.HTTPResponse, on_token: OnToken) -> ChatReply:
    """Assemble a streamed completion from its ``data:`` events, up to ``[DONE]``."""
    text: list[str] = []
    calls: dict[int, _PartialCall] = {}
    usage = ChatUsage()
    while True:
        raw = response.readline()
        if not raw:
            break  # some servers end the stream without [DONE]
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments (":"), event names
        data = line[len(b"data:") :].strip()
        if data == b"[DONE]":
            break
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise ChatError(url, f"a streamed event is not JSON: {exc}") from exc
        if not isinstance(chunk, dict):
            raise ChatError(url, "a streamed event is not a JSON object")
        if isinstance(chunk.get("usage"), dict):
            usage = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict):
                continue
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                text.append(piece)
                on_token(piece)
            for call in delta.get("tool_calls") or []:
                _add_call_delta(calls, call)
    return ChatReply(
        content="".join(text),
        tool_calls=tuple(
            ToolCall(id=c.id or f"call_{i}", name=c.name, arguments="".join(c.arguments) or "{}")
            for i, c in sorted(calls.items())
        ),
        usage=usage,
    )


def _add_call_delta(calls: dict[int, _PartialCall], delta: object) -> None:
    """A streamed tool call comes in pieces by ``index``: an id and name, then arguments."""
    if not isinstance(delta, dict):
        return
    index = delta.get("index")
    partial = calls.setdefault(index if type(index) is int else len(calls), _PartialCall())
    if isinstance(delta.get("id"), str):
        partial.id = delta["id"]
    function = delta.get("function")
    if isinstance(function, dict):
        if isinstance(function.get("name"), str):
            partial.name += function["name"]
        if isinstance(function.get("arguments"), str):
            partial.arguments.append(function["arguments"])
