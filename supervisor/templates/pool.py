"""The supervisor's templates, one per App identity: opened at serve's start, used by every
worker start of that App, replaced when one ends, stopped when serve ends.

A worker start never waits for an import: while its App's template is importing (or
after it failed to, or refused for a thread), the worker is forked from the supervisor
as with ``--start-method fork`` and imports the App itself, exactly as before templates.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Final

from supervisor.proc_stat import stopped
from supervisor.templates import reaper
from supervisor.templates.order import AppIdentity, ForkOrder, SaidKind
from supervisor.templates.prctl import become_subreaper
from supervisor.templates.template import Template, TemplateGone, TemplateStale, TemplateState

Report = Callable[[str], None]


class Templates:
    """Every template of one supervisor (one per App identity)."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, report: Report) -> None:
        self.loop = loop
        self.report = report
        self.running: dict[AppIdentity, Template] = {}
        self.plain: set[AppIdentity] = set()
        """Apps whose import started threads or left descriptors or processes: forked from
        the supervisor, never templated."""

    def open(self, identity: AppIdentity) -> None:
        """Start ``identity``'s template unless one runs or the App is refused one."""
        if identity in self.plain or identity in self.running:
            return
        template = Template(identity)
        self.running[identity] = template
        if self.loop is not None:
            self.loop.add_reader(template.sock, self._hear, template)
            self.loop.add_reader(template.pidfd, self._ended, template)

    def fork_worker(self, identity: AppIdentity, order: ForkOrder, fds: list[int]) -> int | None:
        """The pid of a worker forked by ``identity``'s template; None: fork it plainly
        (no template ready: one is started if none runs). OSError: the start failed."""
        template = self.running.get(identity)
        if template is not None and template.state is TemplateState.IMPORTING:
            self._hear(template)  # its news may be in the socket, its reader not yet run
        if template is not None and template.state is TemplateState.ENDED:
            self._ended(template)
            template = None
        if template is None:
            self.open(identity)
            return None
        if template.state is not TemplateState.READY:
            return None
        if stopped(template.pid):
            # SIGSTOPped: asked, it would hold serve's loop for its reply timeout and the
            # start would fail. Ended and replaced; this start forks plainly.
            self.report(f"template of App {identity.label()}: stopped (SIGSTOP?); killed, "
                        "a new template imports the App")  # fmt: skip
            self._ended(template)
            self.open(identity)
            return None
        try:
            return template.fork_worker(order, fds)
        except TemplateStale as exc:
            self.report(
                f"template of App {identity.label()}: {exc.strerror} changed since its import;"
                " a new template imports the App as it is now"
            )
            self._ended(template)
            self.open(identity)
            return None
        except TemplateGone:
            self._ended(template)
            self.open(identity)
            return None
        except OSError:
            if not template.ready():  # it died or was killed: reaped now, replaced next start
                self._ended(template)
            raise

    def _hear(self, template: Template) -> None:
        was = template.state
        said = template.hear_nowait()
        if template.state is not TemplateState.IMPORTING and self.loop is not None:
            self.loop.remove_reader(template.sock)  # later answers are read in fork_worker
        label = template.identity.label()
        if said is None:
            if was is TemplateState.IMPORTING and template.state is TemplateState.ENDED:
                self._ended(template, was)  # it ended without a word: os._exit at import?
            return
        if said.kind is SaidKind.READY:
            took = time.monotonic() - template.started
            past = f"; {said.text}" if said.text else ""  # files read at import not watched
            self.report(f"template of App {label}: ready (pid {template.pid}, {took:.2f} s){past}")
        elif said.kind is SaidKind.FAILED:
            self.report(
                f"template of App {label}: the App failed to import ({said.text}); its "
                "workers import it themselves, and the next start tries a template again"
            )
        elif said.kind is SaidKind.THREADS:
            self.plain.add(template.identity)
            self.report(
                f"template of App {label}: refused, its import started threads "
                f"({said.text}); its workers are forked from the supervisor and import it "
                "themselves"
            )
        elif said.kind is SaidKind.HOLDS:
            self.plain.add(template.identity)
            self.report(
                f"template of App {label}: refused, its import left {said.text} (a "
                "template's workers cannot share them); its workers are forked from the "
                "supervisor and import it themselves. Open them on first use to have a "
                "template (docs/templates.md)"
            )

    def _ended(self, template: Template, was: TemplateState | None = None) -> None:
        """The template died or was given up: reap it and forget it (``was``: its state
        before, when it was moved already)."""
        if template.returncode is not None:
            return  # reaped already
        if self.loop is not None:
            self.loop.remove_reader(template.sock)
            self.loop.remove_reader(template.pidfd)
        was = was or template.state
        template.kill()
        code = template.reap()
        template.close()
        if self.running.get(template.identity) is template:
            del self.running[template.identity]
        if was is TemplateState.READY:
            self.report(
                f"template of App {template.identity.label()}: ended ({_describe(code)}); "
                "the next worker start of that App starts another"
            )
        elif was is TemplateState.IMPORTING:
            self.report(
                f"template of App {template.identity.label()}: ended while importing the "
                f"App, before it said whether the App imported ({_describe(code)}: an App "
                "that exits at import?); its workers import it themselves, and the next "
                "start tries a template again"
            )
        reaper.reap_strays()

    def close(self) -> None:
        """Stop and reap every template (serve is ending)."""
        for template in list(self.running.values()):
            template.move(TemplateState.ENDED)
            self._ended(template)


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


_POOL: Final[list[Templates]] = []


def open_templates(
    identities: list[AppIdentity], loop: asyncio.AbstractEventLoop | None, report: Report
) -> Templates:
    """Make this process the subreaper of its workers and start a template per identity
    (serve's start: the imports overlap with the rest of it); ``close_templates`` ends."""
    close_templates()
    become_subreaper()
    pool = Templates(loop, report)
    _POOL[:] = [pool]
    if loop is not None:
        loop.add_signal_handler(signal.SIGCHLD, reaper.reap_strays)
    for identity in dict.fromkeys(identities):
        pool.open(identity)
    return pool


def close_templates() -> None:
    """Stop and reap every template, and be a subreaper no more (serve is ending)."""
    if not _POOL:
        return
    pool = _POOL.pop()
    pool.close()
    if pool.loop is not None and not pool.loop.is_closed():
        pool.loop.remove_signal_handler(signal.SIGCHLD)
    become_subreaper(on=False)


def templates() -> Templates:
    """The process's templates (opened without a loop if serve did not open them)."""
    if not _POOL:
        open_templates([], None, _to_nowhere)
    return _POOL[0]


def _to_nowhere(line: str) -> None:
    """No daemon output to report to (templates used outside serve)."""
