"""The settings of one ``loopd serve``, as its flags and ``loopd.toml`` give them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from supervisor.hosting.apps import AppConfig
from supervisor.hosting.settings import HostingSettings
from supervisor.sessions.poison import DEFAULT_POISON_AFTER
from supervisor.sessions.spawn import StartMethod
from supervisor.states import RestartPolicy
from worker.loop.turns import DEFAULT_MAX_BATCH

if TYPE_CHECKING:
    from supervisor.cluster.transport import TlsFiles  # ssl: imported with a TLS option only


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """Settings of one ``loopd serve``."""

    home: str
    app: str | None = None
    budget: int | None = None
    max_restarts: int = 5
    start_retries: int = 5
    start_timeout: float = 60.0
    window: float = 10.0
    backoff_base: float = 0.1
    backoff_cap: float = 5.0
    stable_after: float = 5.0
    hang_timeout: float = 30.0
    request_deadline: float | None = None
    max_batch: int = DEFAULT_MAX_BATCH
    poison_after: int = DEFAULT_POISON_AFTER
    seed: int | None = None
    worker_env: dict[str, str] = field(default_factory=dict)
    start_method: StartMethod = StartMethod.AUTO
    cluster: str | None = None  # etcd URL: serve as a node of a cluster (docs/scaling.md)
    node: str | None = None
    lease_ttl: int | None = None
    listen: str | None = None  # tls://HOST:PORT: the node's TLS port, registered in etcd
    tls: TlsFiles | None = None
    store: str | None = None  # libpq URI: the sessions live in this database (docs/scaling.md)
    require_sync_replication: bool = False  # with store: refuse a server without it
    store_wait: float = 0.0  # with store: seconds to wait at start for one not answering yet
    hosting: HostingSettings = field(default_factory=HostingSettings)
    apps: dict[str, AppConfig] = field(default_factory=dict)
    """The named Apps of loopd.toml's ``[apps]`` (``loopd create ID --app NAME``)."""

    def policy(self) -> RestartPolicy:
        return RestartPolicy(
            max_restarts=self.max_restarts, window=self.window, base=self.backoff_base,
            cap=self.backoff_cap, stable_after=self.stable_after,
            start_retries=self.start_retries, start_timeout=self.start_timeout,
        )  # fmt: skip
