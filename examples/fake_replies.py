"""What the fake model answers: tool calls and texts decided from the conversation.

Its rules are simple so that a test can say what a turn does:

- the last user message starting with ``Summarize`` gets a summary of the user
  messages before it;
- otherwise each arithmetic expression in the user's message (``12 * 7``) becomes a
  ``calculate`` call, each ``note: TEXT`` a ``post_note`` call and each ``words: TEXT``
  a ``word_count`` call, one call per reply, in order, when the request offers that tool;
  with ``tools="always"`` a message with none of these gets one ``word_count`` call of
  its whole text, with ``tools="notes"`` one ``post_note`` call of it (``word_count``
  when ``post_note`` is not offered); with ``tools="never"`` no reply calls a tool;
- once every call of the turn has its result, the answer quotes the results.

Which tools a turn calls never varies. With ``vary`` the wording does: each reply has a
nonce of fixed width (from ``seed`` when given, else fresh randomness), so two answers
to the same conversation differ while their token counts stay the same. ``vary_length``
adds up to five words as well. Without ``vary`` the nonce is a hash of the conversation:
the same conversation, the same answer.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from dataclasses import dataclass, field
from typing import Final, Literal

ToolsMode = Literal["auto", "always", "notes", "never"]
TOOLS_MODES: Final[tuple[ToolsMode, ...]] = ("auto", "always", "notes", "never")
_EXPRESSION: Final = re.compile(
    r"\(*-?\d+(?:\.\d+)?\)*(?:\s*(?:\*\*|//|[-+*/%])\s*\(*-?\d+(?:\.\d+)?\)*)+"
)
_NOTE: Final = re.compile(r"note:\s*([^;\n]+)")
_WORDS: Final = re.compile(r"words:\s*([^;\n]+)")
_FILLER: Final = ("indeed", "so", "well", "then", "right")
SUMMARY_TRIGGER: Final = "Summarize"


def tokens(text: str) -> int:
    """The fake's tokenizer: about one token per four characters."""
    return len(text) // 4 + 1


@dataclass(frozen=True, slots=True)
class FakeCall:
    """A tool call of a fake reply."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class FakeReply:
    """One completion: its text or its tool call, and its token counts."""

    content: str
    calls: tuple[FakeCall, ...]
    prompt_tokens: int
    completion_tokens: int
    summary: bool = False


@dataclass(slots=True)
class FakeModel:
    """Answers chat requests by the rules of the module doc (thread-safe)."""

    vary: bool = True
    vary_length: bool = False
    seed: int | None = None
    tools: ToolsMode = "auto"
    _random: random.Random = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.tools not in TOOLS_MODES:
            raise ValueError(f"tools must be one of {', '.join(TOOLS_MODES)}, got {self.tools!r}")
        self._random = random.Random(self.seed)

    def reply(self, messages: list[dict[str, object]], offered: set[str]) -> FakeReply:
        """The answer to ``messages`` when the tools named in ``offered`` may be called."""
        prompt = sum(tokens(_content(m)) for m in messages)
        nonce, extra = self._variation(messages)
        last_user = _last_user(messages)
        if _role(messages[-1]) == "user" and last_user.startswith(SUMMARY_TRIGGER):
            text = f"Summary {nonce}: " + _summary_of(messages[:-1]) + extra
            return FakeReply(text, (), prompt, tokens(text), summary=True)
        wanted = [] if self.tools == "never" else _tool_calls_for(last_user, offered, self.tools)
        done = _results_since_user(messages)
        if len(done) < len(wanted):
            name, arguments = wanted[len(done)]
            call = FakeCall(id=f"call_{nonce}_{len(done) + 1}", name=name, arguments=arguments)
            return FakeReply("", (call,), prompt, tokens(name + arguments))
        if done:
            text = f"Done {nonce}: " + "; ".join(r[:60] for r in done) + extra
        else:
            text = f"Answer {nonce}: you said {last_user[:48]!r}" + extra
        return FakeReply(text, (), prompt, tokens(text))

    def _variation(self, messages: list[dict[str, object]]) -> tuple[str, str]:
        """The reply's nonce (8 hex digits) and its extra words."""
        if not self.vary:
            digest = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()
            return digest[:8], ""
        with self._lock:
            nonce = f"{self._random.getrandbits(32):08x}"
            count = self._random.randrange(6) if self.vary_length else 0
            extra = "".join(f" {self._random.choice(_FILLER)}" for _ in range(count))
        return nonce, extra


def _role(message: dict[str, object]) -> str:
    return str(message.get("role", ""))


def _content(message: dict[str, object]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # the "parts" form: [{"type": "text", "text": ...}]
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return json.dumps(message.get("tool_calls")) if message.get("tool_calls") else ""


def _last_user(messages: list[dict[str, object]]) -> str:
    for message in reversed(messages):
        if _role(message) == "user":
            return _content(message)
    return ""


def _results_since_user(messages: list[dict[str, object]]) -> list[str]:
    """The tool results after the last user message, in order."""
    results: list[str] = []
    for message in reversed(messages):
        if _role(message) == "user":
            break
        if _role(message) == "tool":
            results.insert(0, _content(message))
    return results


def _tool_calls_for(text: str, offered: set[str], mode: ToolsMode) -> list[tuple[str, str]]:
    """The calls a user message asks for, in the order they appear in it."""
    found: list[tuple[int, str, str]] = []
    rules = (
        (_EXPRESSION, "calculate", "expression"),
        (_NOTE, "post_note", "text"),
        (_WORDS, "word_count", "text"),
    )
    for pattern, name, argument in rules:
        if name not in offered:
            continue
        for match in pattern.finditer(text):
            value = match.group(match.lastindex or 0).strip()
            found.append((match.start(), name, json.dumps({argument: value})))
    found.sort()
    calls = [(name, arguments) for _, name, arguments in found]
    if not calls and mode == "notes" and "post_note" in offered:
        calls = [("post_note", json.dumps({"text": text}))]
    if not calls and mode in ("always", "notes") and "word_count" in offered:
        calls = [("word_count", json.dumps({"text": text}))]
    return calls


def _summary_of(messages: list[dict[str, object]]) -> str:
    """A short summary of the user messages: how many, and the start of the last six."""
    users = [_content(m) for m in messages if _role(m) == "user"]
    heads = "; ".join(u[:24] for u in users[-6:])
    return f"{len(users)} user messages; {heads}" if users else "nothing was said yet"
