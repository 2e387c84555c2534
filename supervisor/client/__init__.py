"""The Python clients: ``Client`` (direct connections to workers) and ``ClusterClient``.

``from supervisor.client import Client`` is the public path; the modules are
``control`` (one call on the daemon's control socket), ``direct`` (the data path),
``handoff`` (a direct connection as the daemon hands it over), ``cluster`` (routing
through etcd) and ``status_table`` (how status rows are shown).
"""

from __future__ import annotations

from supervisor.client.control import RETRYABLE, call, call_with_retry, open_control
from supervisor.client.direct import Client, Request

__all__ = ["RETRYABLE", "Client", "Request", "call", "call_with_retry", "open_control"]
