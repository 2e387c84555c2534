"""Run on a host of ``scripts.cluster.bench_cluster_tls``: time round trips, print JSON.

    python -m scripts.cluster.bench_tls_probe PAIR N SESSION ETCD_URL HOME

PAIR ``tls`` (from another host) times two paths, one request of each in turn, so both
meet the same load: ``tls-direct`` (``ClusterClient.send``: the direct path, a TCP
connection handed to the worker, which makes the TLS handshake and answers itself) and
``tls-relay`` (``send`` over one TLS connection that starts TLS at once: the node's TLS
thread relays it to the daemon, which relays it to the worker). PAIR ``unix`` (on the
node's host) times ``unix-relay`` (the same ``send`` on the node's unix socket, one
persistent connection) and ``unix-direct`` (``Client.send``: the worker's own
connection, handed over by the daemon), in turn too. Prints, per path, the seconds of
each of its N round trips after a warm-up.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack

from supervisor.client import Client
from supervisor.client.cluster import ClusterClient
from supervisor.client.control import exchange, open_control
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.routing import route
from supervisor.cluster.transport import tls_files_from_env
from worker.ipc.wire import encode

WARMUP = 50


def main() -> None:
    pair, count, session, url, home = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
    keys = (f"{pair}-{n}" for n in itertools.count())
    with ExitStack() as stack:
        paths: dict[str, Callable[[], object]] = {}
        if pair == "tls":
            cluster = stack.enter_context(ClusterClient(url, timeout=30))
            files = tls_files_from_env()
            assert files is not None, "LOOPD_TLS_CA/CERT/KEY are needed"
            with EtcdClient(url) as etcd:
                found = route(etcd, session)
            link = NodeLink(found.address, found.node, files, timeout=30)
            stack.callback(link.close)
            paths["tls-direct"] = lambda: cluster.send(session, "x", key=next(keys))
            paths["tls-relay"] = lambda: link.call("send", session=session, text="x",
                                                   key=next(keys))  # fmt: skip
        else:
            sock = open_control(home, 30)
            stack.callback(sock.close)
            client = stack.enter_context(Client(home, timeout=30))
            ids = itertools.count()

            def relayed() -> object:
                frame = encode({"id": next(ids), "op": "send", "session": session,
                                "text": "x", "key": next(keys)})  # fmt: skip
                return exchange(sock, frame, 1, time.monotonic() + 30)

            paths["unix-relay"] = relayed
            paths["unix-direct"] = lambda: client.send(session, "x", key=next(keys))
        times: dict[str, list[float]] = {name: [] for name in paths}
        for n in range(WARMUP + count):
            for name, one in paths.items():
                start = time.perf_counter()
                one()
                if n >= WARMUP:
                    times[name].append(time.perf_counter() - start)
    print(json.dumps(times))


if __name__ == "__main__":
    main()
