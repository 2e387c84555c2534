"""Run on the client host of ``scripts.bench_replication --netns``: time round trips.

    python -m scripts.bench_replication_probe N ROUNDS ETCD_URL

Creates ``one`` (``--replicas 1``) and ``three`` (``--replicas 3``) through one
``ClusterClient`` over mutual TLS (the certificate named by ``LOOPD_TLS_*``), warms
both up, then times N keyed requests to each in each of ROUNDS rounds, one request of
each in turn so both meet the same load. Prints JSON: per session, its owner node and
the seconds of each round trip, round by round.
"""

from __future__ import annotations

import json
import sys
import time

from supervisor.client.cluster import ClusterClient
from supervisor.cluster.ownership import owner_of
from supervisor.cluster.transport import tls_files_from_env

SESSIONS = {"one": 1, "three": 3}
WARMUP = 30


def main() -> None:
    count, rounds, url = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    files = tls_files_from_env()
    assert files is not None, "LOOPD_TLS_CA/CERT/KEY are needed"
    out: dict[str, object] = {}
    with ClusterClient(url, timeout=30, tls=files) as client:
        for session, replicas in SESSIONS.items():
            client.create(session, replicas=replicas)
        times: dict[str, list[list[float]]] = {session: [] for session in SESSIONS}
        for round_number in range(-1, rounds):  # round -1: the warm-up, not kept
            kept: dict[str, list[float]] = {session: [] for session in SESSIONS}
            for n in range(WARMUP if round_number < 0 else count):
                for session in SESSIONS:
                    started = time.perf_counter()
                    client.send(session, "x", key=f"r{round_number}-{n}")
                    kept[session].append(time.perf_counter() - started)
            if round_number >= 0:
                for session, values in kept.items():
                    times[session].append(values)
        for session in SESSIONS:
            owner = owner_of(client.etcd, session)
            out[session] = {"owner": owner.node if owner else None, "rounds": times[session]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
