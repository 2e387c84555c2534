"""The App seam (``handle(session, request) -> reply``) and the deterministic default app;
the App author's public face.

Everything an App uses is imported from here (``__all__``, listed in docs/apps.md), so
that the store's layout can change under it: the names stay, re-exported from where
they live. The old paths of before ``worker/store/`` (``worker.baseline``, ...) import
for one release with a DeprecationWarning (``warn_moved``).

An app is loaded by ``module:attribute``. The default app appends, per request, User,
ToolResult, Assistant and Usage in one group commit, commits an epoch when the context
passes its budget, and answers a request whose key is already in the log from the log.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import TYPE_CHECKING, Final, Protocol

from worker.app.turn import progress, schedule, stream
from worker.ipc.wire import Message, WireError, field, optional_field
from worker.store.baseline import Baseline
from worker.store.errors import KeyExpired, SessionError
from worker.store.format.records import (
    Assistant,
    EpochEnd,
    Record,
    ToolResult,
    Usage,
    User,
    decode_record,
    utc_now,
)
from worker.store.request_records import request_records
from worker.store.session import Session

if TYPE_CHECKING:
    from types import FrameType

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
    with warnings.catch_warnings():
        # An App that still imports a moved path says so in its worker's output: the
        # default filters show a DeprecationWarning only when __main__ triggers it.
        warnings.filterwarnings("default", message=MOVED_WARNING, category=DeprecationWarning)
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

    def answer(self, records: list[Record]) -> Message:
        """The App's answer to a request, built from the records it wrote (User first).

        Used for the first reply and for every duplicate's, so a retry after a lost
        reply gets the same answer. An App that writes other records overrides it.
        """
        answer: Message = {}
        for record in records:
            if isinstance(record, ToolResult) and "call" not in answer:
                answer["call"] = record.call
            elif isinstance(record, Assistant):
                answer["text"] = record.text  # the last one is the turn's answer
            elif isinstance(record, Usage):
                answer["context_tokens"] = record.context_tokens
        return answer

    def handle(self, session: Session, request: Message) -> Message:
        result = self._apply_many(session, [request])[0]
        if isinstance(result, SessionError):
            raise result
        return result

    def handle_many(
        self, session: Session, requests: list[Message]
    ) -> list[Message | SessionError]:
        """Apply requests in order with one group commit; each result or its error."""
        if type(self).handle is not DefaultApp.handle:
            # A subclass that changed handle() keeps its behaviour: one request at a time.
            results: list[Message | SessionError] = []
            for request in requests:
                try:
                    results.append(self.handle(session, request))
                except SessionError as exc:
                    results.append(exc)
            return results
        return self._apply_many(session, requests)

    def _apply_many(
        self, session: Session, requests: list[Message]
    ) -> list[Message | SessionError]:
        batch = _Batch(session)
        for index, request in enumerate(requests):
            try:
                text = field(request, "text", str)
                key = optional_field(request, "key", str)
                untrusted = bool(optional_field(request, "untrusted", bool))
            except WireError as exc:
                batch.results[index] = exc
                continue
            if key is not None and key in batch.keys:
                batch.flush()  # a repeated key is answered from the log, as a retry is
            if key is not None:
                # Found in any epoch of the session (the key index): applied once, ever.
                # A client's "epoch" field, which the retry window of old needed, is
                # ignored. A sealed log that cannot be read to confirm a hit is this
                # request's error: it is not applied.
                try:
                    ref = session.find_key(key)
                except SessionError as exc:
                    batch.results[index] = exc
                    continue
                if ref is not None:
                    # The same answer the first reply carried, rebuilt from the records
                    # the request wrote: a retry after a lost reply loses nothing.
                    duplicate: Message = {
                        "duplicate": True, "key": key, "epoch": ref.epoch, "line": ref.line,
                    }  # fmt: skip
                    try:
                        duplicate.update(self.answer(request_records(session, ref)))
                    except SessionError as exc:
                        # Applied, but its records cannot be read back: say so, apply nothing.
                        duplicate["answer_error"] = str(exc)
                    batch.results[index] = duplicate
                    continue
            call = session.next_call()
            reply = f"echo: {text}"
            prompt, completion = _tokens(text), _tokens(reply)
            batch.context += prompt + completion
            now = utc_now()  # one clock read for the request's four records
            usage = Usage(
                time=now,
                prompt_tokens=prompt,
                completion_tokens=completion,
                context_tokens=batch.context,
            )
            records: list[Record] = [
                User(time=now, text=text, untrusted=untrusted, key=key),
                ToolResult(time=now, call=call, tool="echo", output=text, ok=True),
                Assistant(time=now, text=reply),
                usage,
            ]
            batch.add(
                index,
                key,
                records,
                {
                    "duplicate": False, "key": key, "epoch": session.epoch,
                    **self.answer(records), "committed": False,
                },
            )  # fmt: skip
            if batch.context > self.budget:
                batch.flush()
                result = batch.results[index]
                if isinstance(result, dict):
                    self._commit(session, result)
                batch.context = _context(session)
        batch.flush()
        return [batch.results[index] for index in range(len(requests))]

    def _commit(self, session: Session, result: Message) -> None:
        """Commit an epoch after the request that passed the budget; it stays applied."""
        try:
            summary = self.summarize(session)
            session.commit_epoch(summary, self.next_baseline(session, summary))
        except SessionError as exc:
            # The request is on disk: it is answered as applied, never as failed (a
            # retry without a key would apply it twice). The epoch change is retried
            # later, or completed by the restart if the session is now broken.
            result["commit_error"] = str(exc)
            return
        result["committed"] = True


def _context(session: Session) -> int:
    previous = session.last_usage()
    return previous.context_tokens if previous else 0


class _Batch:
    """Records of several requests waiting for one append_many, and their results."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.context = _context(session)
        self.results: dict[int, Message | SessionError] = {}
        self.keys: set[str] = set()
        self._records: list[Record] = []
        self._waiting: list[int] = []

    def add(self, index: int, key: str | None, records: list[Record], result: Message) -> None:
        self._records += records
        self._waiting.append(index)
        self.results[index] = result
        if key is not None:
            self.keys.add(key)

    def flush(self) -> None:
        """Write what waits with one write and one fdatasync; on failure none is applied."""
        if not self._records:
            return
        try:
            self.session.append_many(self._records)
        except SessionError as exc:
            for index in self._waiting:
                self.results[index] = exc
            self.context = _context(self.session)
        else:
            for index in self._waiting:
                result = self.results[index]
                if isinstance(result, dict):
                    result["group"] = len(self._waiting)  # requests that shared the fsync
        self._records = []
        self._waiting = []
        self.keys.clear()


MOVED_WARNING: Final = r"worker\.\w+ is deprecated and goes in the next release"


def warn_moved(old: str) -> None:
    """Warn that module ``old`` is deprecated, at the line of the App that imported it."""
    # stacklevel 1 is this function, 2 the deprecated module, 3 its importer: warnings
    # skips the frames of importlib in between (the default filters would hide those).
    # A loader of its own on sys.meta_path (pytest's assertion rewriter marks every
    # module of an installed plugin's distribution, loopd's too) runs the module from its
    # own exec_module, one frame more between the module and its importer: skipped too.
    stacklevel = 3
    frame = sys._getframe(2)  # the frame above the deprecated module
    while frame.f_back is not None and (
        _import_machinery(frame) or frame.f_code.co_name == "exec_module"
    ):
        stacklevel += 0 if _import_machinery(frame) else 1
        frame = frame.f_back
    warnings.warn(
        f"{old} is deprecated and goes in the next release: import from worker.app "
        "(docs/apps.md lists its names)",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


def _import_machinery(frame: FrameType) -> bool:
    """Whether ``frame`` is importlib's own: warnings skips such frames in its stacklevel."""
    name = frame.f_code.co_filename
    return "importlib" in name and "_bootstrap" in name


__all__ = [  # the App author's imports: docs/apps.md lists exactly these
    "App",
    "AppFactory",
    "Assistant",
    "Baseline",
    "DefaultApp",
    "EpochEnd",
    "KeyExpired",
    "Message",
    "Record",
    "Session",
    "SessionError",
    "ToolResult",
    "Usage",
    "User",
    "WireError",
    "decode_record",
    "field",
    "optional_field",
    "progress",
    "schedule",
    "stream",
    "utc_now",
]
