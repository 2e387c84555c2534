"""The agent's tools: their specs for the model, and how each one runs.

A tool runs while a turn is being worked out, before anything of the turn is on disk.
If the worker dies then, the client retries the turn with the same request key and the
tool runs again: a tool with an effect outside the session must apply it once per key.
``post_note`` shows how: it sends the service an ``Idempotency-Key`` made of the session,
the request key and the call's place in the turn, and a service that honours it (as
Stripe's API and the fake model's notes endpoint do) answers a repeat with the first
answer instead of a second note.
"""

from __future__ import annotations

import ast
import http.client
import json
import operator
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

MAX_EXPRESSION: Final = 200  # characters of an expression calculate accepts
MAX_POWER: Final = 64  # the largest exponent calculate raises to
MAX_MAGNITUDE: Final = 10**30  # calculate refuses results (and operands) beyond this
NOTES_TIMEOUT: Final = 30.0


class ToolFailed(Exception):
    """The tool could not do what it was asked; its text goes back to the model."""


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Where a tool call stands: its session, its turn's request key, its place in the turn."""

    session: str
    key: str
    ordinal: int  # 1 for the turn's first tool call, 2 for the next, ...
    notes_url: str | None = None

    @property
    def idempotency_key(self) -> str | None:
        """The same for the same call of a retried turn, different for any other call;
        None for a turn sent without a key (no retry of it can be told from a new turn:
        a key shared by every such turn would keep only the first one's note)."""
        if not self.key:
            return None
        return f"{self.session}/{self.key}/{self.ordinal}"


def _function(name: str, description: str, properties: dict[str, object]) -> dict[str, object]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": sorted(properties),
            },
        },
    }


CALCULATE: Final = _function(
    "calculate",
    "Evaluate an arithmetic expression (+ - * / // % ** and parentheses) exactly.",
    {"expression": {"type": "string"}},
)
WORD_COUNT: Final = _function(
    "word_count", "Count the words of a text.", {"text": {"type": "string"}}
)
POST_NOTE: Final = _function(
    "post_note", "Keep a note in the team's notes service.", {"text": {"type": "string"}}
)


def tool_specs(*, notes: bool) -> list[dict[str, object]]:
    """The tools offered to the model (``post_note`` only with a notes service)."""
    return [CALCULATE, WORD_COUNT, *([POST_NOTE] if notes else [])]


def run_tool(name: str, arguments: str, context: ToolContext) -> tuple[str, bool]:
    """Run tool ``name`` with its JSON ``arguments``; return its output and whether it worked."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError as exc:
        return f"arguments are not JSON: {exc}", False
    if not isinstance(parsed, dict):
        return "arguments must be a JSON object", False
    tool = _TOOLS.get(name)
    if tool is None:
        return f"no tool named {name!r}", False
    try:
        return tool(parsed, context), True
    except ToolFailed as exc:
        return str(exc), False


def _text(arguments: dict[str, object], name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str):
        raise ToolFailed(f"argument {name!r} must be a string")
    return value


def calculate(arguments: dict[str, object], _context: ToolContext) -> str:
    """The exact value of an arithmetic expression (no names, no calls: only numbers)."""
    expression = _text(arguments, "expression")
    if len(expression) > MAX_EXPRESSION:
        raise ToolFailed(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise ToolFailed(f"not an arithmetic expression: {exc.msg}") from exc
    value = _evaluate(tree.body)
    return str(int(value) if isinstance(value, float) and value.is_integer() else value)


_BINARY: Final[dict[type[ast.operator], Callable[[float, float], float]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _evaluate(node: ast.expr) -> float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        value: float = node.value
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _evaluate(node.operand)
        value = -operand if isinstance(node.op, ast.USub) else operand
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_POWER:
            raise ToolFailed(f"exponent {right} is above {MAX_POWER}")
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError as exc:
            raise ToolFailed("division by zero") from exc
        except OverflowError as exc:
            raise ToolFailed("the result is too large") from exc
    else:
        raise ToolFailed(f"only numbers and + - * / // % ** are allowed, not {ast.unparse(node)!r}")
    if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
        raise ToolFailed("the result is too large or not a real number")
    return value


def word_count(arguments: dict[str, object], _context: ToolContext) -> str:
    """How many words a text has."""
    return str(len(_text(arguments, "text").split()))


def post_note(arguments: dict[str, object], context: ToolContext) -> str:
    """Send a note to the notes service once per tool call of a turn, however often retried."""
    text = _text(arguments, "text")
    if not context.notes_url:
        raise ToolFailed("no notes service is configured")
    parts = urllib.parse.urlsplit(context.notes_url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname or "", parts.port, timeout=NOTES_TIMEOUT)
    headers = {"Content-Type": "application/json"}
    if context.idempotency_key is not None:
        headers["Idempotency-Key"] = context.idempotency_key
    try:
        connection.request(
            "POST", parts.path or "/", body=json.dumps({"text": text}).encode(), headers=headers
        )
        response = connection.getresponse()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise ToolFailed(f"the notes service at {context.notes_url} did not answer: {exc}") from exc
    finally:
        connection.close()
    if response.status not in (http.client.OK, http.client.CREATED):
        raise ToolFailed(f"the notes service answered HTTP {response.status}")
    try:
        note = json.loads(body)
    except ValueError as exc:
        raise ToolFailed(f"the notes service's answer is not JSON: {exc}") from exc
    number = note.get("id") if isinstance(note, dict) else None
    return f"note {number} kept"


_TOOLS: Final[dict[str, Callable[[dict[str, object], ToolContext], str]]] = {
    "calculate": calculate,
    "word_count": word_count,
    "post_note": post_note,
}
