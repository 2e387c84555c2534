"""The App seam (``handle(session, request) -> reply``) and the deterministic default app.

An app is loaded by ``module:attribute``. The default app appends, per request, User,
ToolResult, Assistant and Usage in one group commit, commits an epoch when the context
passes its budget, and answers a request whose key is already in the log from the log.
"""

from __future__ import annotations

import importlib
from typing import Final, Protocol

from worker.baseline import Baseline
from worker.records import Assistant, ToolResult, Usage, User
from worker.session import Session
from worker.wire import Message, WireError, field, optional_field

DEFAULT_APP: Final = "worker.app:DefaultApp"
DEFAULT_BUDGET: Final = 4000


class App(Protocol):
    """What a worker hosts: it turns requests into records of the session."""

    def initial_baseline(self, session_id: str) -> Baseline:
        """Return the baseline of a new session's epoch 0."""
        ...

    def next_baseline(self, session: Session, summary: str) -> Baseline:
        """Return the baseline of the epoch that follows, given the closing summary.

        Must be deterministic: resume after a crash calls it again for the same change.
        """
        ...

    def summarize(self, session: Session) -> str:
        """Return the summary that closes the current epoch."""
        ...

    def handle(self, session: Session, request: Message) -> Message:
        """Apply one request to the session and return the reply's result."""
        ...


class AppFactory(Protocol):
    """What ``module:attribute`` names: a callable that takes the budget and returns an App."""

    def __call__(self, budget: int) -> App: ...


def load_app(spec: str, budget: int = DEFAULT_BUDGET) -> App:
    """Import ``module:attribute``, call it with the context budget, and return the App."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"app must be given as module:attribute, got {spec!r}")
    target: object = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is not callable: it must take the budget and return an App")
    factory: AppFactory = target
    return factory(budget)


def _tokens(text: str) -> int:
    # Deterministic stand-in for a tokenizer: about one token per four characters.
    return len(text) // 4 + 1


class DefaultApp:
    """Echo app with deterministic records, so tests and the chaos rig can predict the log."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget

    def initial_baseline(self, session_id: str) -> Baseline:
        return Baseline(
            system=f"loopd echo session {session_id}",
            memory="",
            tools=[{"name": "echo", "description": "repeat the text"}],
        )

    def next_baseline(self, session: Session, summary: str) -> Baseline:
        current = session.baseline
        return Baseline(system=current.system, memory=summary, tools=list(current.tools))

    def summarize(self, session: Session) -> str:
        users = [r for r in session.records if isinstance(r, User)]
        last = users[-1].text[:60] if users else ""
        return f"epoch {session.epoch}: {len(users)} requests, last {last!r}"

    def handle(self, session: Session, request: Message) -> Message:
        text = field(request, "text", str)
        key = optional_field(request, "key", str)
        untrusted = bool(optional_field(request, "untrusted", bool))
        if key is not None:
            ref = session.find_key(key)
            if ref is not None:
                return {"duplicate": True, "key": key, "epoch": ref.epoch, "line": ref.line}
        call = session.next_call()
        reply = f"echo: {text}"
        previous = session.last_usage()
        prompt, completion = _tokens(text), _tokens(reply)
        context = (previous.context_tokens if previous else 0) + prompt + completion
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, context_tokens=context)
        session.append_many(
            [
                User(text=text, untrusted=untrusted, key=key),
                ToolResult(call=call, tool="echo", output=text, ok=True),
                Assistant(text=reply),
                usage,
            ]
        )
        result: Message = {
            "duplicate": False,
            "key": key,
            "epoch": session.epoch,
            "call": call,
            "text": reply,
            "context_tokens": context,
            "committed": False,
        }
        if context > self.budget:
            summary = self.summarize(session)
            session.commit_epoch(summary, self.next_baseline(session, summary))
            result["committed"] = True
        return result


__all__ = ["DEFAULT_APP", "App", "AppFactory", "DefaultApp", "WireError", "load_app"]
