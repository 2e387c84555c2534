"""How a session's worker is started: serve's settings, under its named App's own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from supervisor.daemon.config import ServeConfig
from supervisor.hosting.apps import app_import_dirs
from supervisor.sessions.spawn import StartMethod, WorkerSpec, app_identity, prepare_forks
from supervisor.templates.pool import open_templates
from supervisor.templates.spare import open_spares

if TYPE_CHECKING:
    from supervisor.node.serving import WorkerCluster


class UnknownApp(Exception):
    """A session names an App that loopd.toml's ``[apps]`` does not (any more)."""

    def __init__(self, session_id: str, app: str, known: list[str]) -> None:
        super().__init__(session_id, app, known)
        self.session_id = session_id
        self.app = app
        self.known = known

    def __str__(self) -> str:
        known = ", ".join(self.known) if self.known else "none"
        return (
            f"session {self.session_id} runs App {self.app!r}, which loopd.toml's [apps] does "
            f"not name (configured: {known}); add [apps.{self.app}] back rather than run the "
            "session with another App"
        )


def worker_spec(
    config: ServeConfig,
    session_id: str,
    *,
    app: str | None = None,
    create: bool = False,
    slot: int = 0,
    cluster: WorkerCluster | None = None,
) -> WorkerSpec:
    """The spec of ``session_id``'s worker; UnknownApp if its named App is not configured.

    Its import path starts with ``app_import_dirs``: the worker imports its App from the
    directory serve was started in (and a named App's own) however serve was started.
    """
    named = None
    if app is not None:
        named = config.apps.get(app)
        if named is None:
            raise UnknownApp(session_id, app, sorted(config.apps))
    hang_timeout = config.hang_timeout
    request_deadline = config.request_deadline
    budget = config.budget
    env = dict(config.worker_env)
    if named is not None:
        hang_timeout = named.hang_timeout or hang_timeout
        request_deadline = named.request_deadline or request_deadline
        budget = named.budget or budget
        env.update(named.env)
    return WorkerSpec(
        home=config.home, session=session_id, create=create, slot=slot,
        app=named.target if named is not None else config.app, budget=budget, extra_env=env,
        cwd=named.work_dir() if named is not None and named.cwd else None,
        path=app_import_dirs(named),
        start_method=config.start_method, heartbeat=hang_timeout / 4,
        request_deadline=request_deadline, capture_output=True, hang_timeout=hang_timeout,
        max_batch=config.max_batch, cluster=cluster, store=config.store,
    )  # fmt: skip


def prepare_workers(
    config: ServeConfig, loop: asyncio.AbstractEventLoop, report: Callable[[str], None]
) -> None:
    """Before the first worker: warm the supervisor up for forks (``prepare_forks``; if it
    was skipped, ``report`` says why) and start a template for each App serve hosts
    (``--app`` and each of ``[apps]``) whose workers the start method forks from one, so
    that their imports overlap with serve's start. None (only the default App under
    ``auto``, or ``fork``, ``exec``): no template, and the supervisor is no subreaper."""
    skipped = prepare_forks(config.start_method)
    if skipped is not None:
        report(skipped)
    specs = [
        worker_spec(config, "template"),
        *(worker_spec(config, "template", app=name) for name in config.apps),
    ]
    if any(config.start_method.for_app(spec.app) is StartMethod.FORK for spec in specs):
        open_spares(loop, report)  # after the warm-up: the spare shares its pages
    templated = [
        app_identity(spec)
        for spec in specs
        if config.start_method.for_app(spec.app) is StartMethod.TEMPLATE
    ]
    if templated:
        open_templates(templated, loop, report)
