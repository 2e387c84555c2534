"""Run on a host of ``scripts.bench_cluster_tls``: time N round trips, print JSON.

    python -m scripts.bench_tls_probe MODE N SESSION ETCD_URL HOME

MODE: ``tls-direct`` (``ClusterClient.send`` from another host: the direct path, a TCP
connection handed to the worker, which makes the TLS handshake and answers itself),
``tls-relay`` (``send`` over one TLS connection that starts TLS at once: the node's TLS
thread relays it to the daemon, which relays it to the worker), ``unix-relay`` (the
same ``send`` on the node's unix socket, one persistent connection), ``unix-direct``
(``Client.send``: the worker's own connection, handed over by the daemon). Prints the
seconds of each round trip after a warm-up.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

from supervisor.client import Client
from supervisor.client.cluster import ClusterClient
from supervisor.client.control import exchange, open_control
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.routing import route
from supervisor.cluster.transport import tls_files_from_env
from worker.wire import encode

WARMUP = 50


def main() -> None:
    mode, count, session, url, home = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
    keys = (f"{mode}-{n}" for n in itertools.count())
    times: list[float] = []
    if mode == "tls-direct":
        with ClusterClient(url, timeout=30) as cluster:
            for n in range(WARMUP + count):
                start = time.perf_counter()
                cluster.send(session, "x", key=next(keys))
                if n >= WARMUP:
                    times.append(time.perf_counter() - start)
    elif mode == "tls-relay":
        files = tls_files_from_env()
        assert files is not None, "LOOPD_TLS_CA/CERT/KEY are needed"
        with EtcdClient(url) as etcd:
            found = route(etcd, session)
        link = NodeLink(found.address, found.node, files, timeout=30)
        try:
            for n in range(WARMUP + count):
                start = time.perf_counter()
                link.call("send", session=session, text="x", key=next(keys))
                if n >= WARMUP:
                    times.append(time.perf_counter() - start)
        finally:
            link.close()
    elif mode == "unix-relay":
        sock = open_control(home, 30)
        try:
            for n in range(WARMUP + count):
                frame = encode({"id": n, "op": "send", "session": session, "text": "x",
                                "key": next(keys)})  # fmt: skip
                start = time.perf_counter()
                exchange(sock, frame, 1, time.monotonic() + 30)
                if n >= WARMUP:
                    times.append(time.perf_counter() - start)
        finally:
            sock.close()
    else:
        with Client(home, timeout=30) as client:
            for n in range(WARMUP + count):
                start = time.perf_counter()
                client.send(session, "x", key=next(keys))
                if n >= WARMUP:
                    times.append(time.perf_counter() - start)
    print(json.dumps(times))


if __name__ == "__main__":
    main()
