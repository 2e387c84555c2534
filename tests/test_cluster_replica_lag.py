"""Each follower's lag as the owner sees it, in ``loopd status --cluster`` and the metrics.

Three real daemons with TLS ports and a real etcd (``test_cluster_replicated_daemons``'s
nodes); a session with ``--replicas 3``. Once a write is acknowledged, both followers
are 0 bytes and 0 group commits behind. A follower whose daemon is SIGSTOPped is
dropped from the in-sync set by the owner at its next write (the change counted), and
its lag grows with each write after; SIGCONTed, it is caught up at a later write and is
back in sync with no lag (the second change counted).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable

import pytest

from supervisor.client.cluster import ClusterClient
from supervisor.client.control import call
from supervisor.cluster.transport import Role
from supervisor.errors import ControlError
from tests.promtext import MetricFamily, parse
from tests.support import log_user_keys, loopd, poll_until, stop, stopped
from tests.test_cluster_replicated_daemons import NAMES, Nodes, nodes  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(110)


def _metrics(cluster: Nodes, name: str) -> dict[str, MetricFamily]:
    text = call(str(cluster.root / name), "metrics", timeout=10)
    assert isinstance(text, str)
    return parse(text)  # strict: HELP and TYPE lines, names, labels, values


def _lag(cluster: Nodes, owner: str) -> dict[str, dict[str, object]]:
    """The owner's daemon's status row of ``r``: each follower's lag, by node."""
    rows = call(str(cluster.root / owner), "status", timeout=10, session="r")
    assert isinstance(rows, list)
    followers = rows[0].get("lag") if rows and isinstance(rows[0], dict) else None
    return {str(f["node"]): f for f in followers or [] if isinstance(f, dict)}


Followers = dict[str, dict[str, object]]


def _reported(cluster: Nodes, owner: str, check: Callable[[Followers], bool]) -> Followers:
    """The owner's status once its worker's latest report passes ``check``."""

    def seen() -> dict[str, dict[str, object]] | None:
        lag = _lag(cluster, owner)
        return lag if lag and check(lag) else None

    return poll_until(seen, timeout=30, what="the owner's report of its followers")


def test_lag_is_zero_once_acknowledged_grows_while_stopped_and_clears_on_rejoin(
    nodes: Nodes,  # noqa: F811 - the fixture
) -> None:
    files = nodes.certs.issue("app", Role.CLIENT)
    env = {"LOOPD_TLS_CA": files.ca, "LOOPD_TLS_CERT": files.cert, "LOOPD_TLS_KEY": files.key}
    with nodes.client() as client:
        client.create("r", replicas=3)
        owner = nodes.owner()
        stopped, other = (n for n in NAMES if n != owner)
        client.send("r", "zero", key="k0")

        def caught_up(lag: dict[str, dict[str, object]]) -> bool:
            return all(
                lag.get(n, {}).get("in_sync") is True
                and lag[n]["lag_bytes"] == 0
                and lag[n]["lag_groups"] == 0
                for n in (stopped, other)
            )

        first = _reported(nodes, owner, caught_up)
        assert isinstance(first[stopped]["ack_age_s"], float)
        shown = loopd("status", "--cluster", nodes.etcd.url, "--json", env=env)
        assert shown.returncode == 0, shown.stderr
        (row,) = json.loads(shown.stdout)
        assert row["node"] == owner
        assert {f["node"]: (f["lag_bytes"], f["lag_groups"]) for f in row["lag"]} == {
            stopped: (0, 0),
            other: (0, 0),
        }
        table = loopd("status", "--cluster", nodes.etcd.url, env=env)
        assert table.returncode == 0, table.stderr
        header, line = table.stdout.splitlines()
        assert header.split()[:5] == ["session", "node", "followers", "in_sync", "lag"]
        lag_cell = line.split()[4]
        assert lag_cell.startswith(f"{min(stopped, other)}:0B/0g/"), lag_cell
        families = _metrics(nodes, owner)
        assert families["loopd_replica_lag_bytes"].value(session="r", follower=stopped) == 0
        assert families["loopd_replica_lag_groups"].value(session="r", follower=stopped) == 0
        assert families["loopd_replica_in_sync"].value(session="r", follower=stopped) == 1
        assert families["loopd_replica_in_sync_changes_total"].value(session="r") == 0
        assert families["loopd_replicated_writes_refused_total"].value(session="r") == 0
        assert families["loopd_replica_lag_bytes"].kind == "gauge"
        assert families["loopd_replica_in_sync_changes_total"].kind == "counter"

        daemon = nodes.daemons[stopped]
        stop(daemon.proc)
        try:
            # The owner's ship to it times out: it is dropped, the write acknowledged
            # by the owner and the other follower (2 of 3 copies).
            client.send("r", "one", key="k1")
            after_one = _reported(nodes, owner, lambda lag: lag[stopped]["in_sync"] is False)
            assert after_one[stopped]["lag_groups"] == 1
            one_bytes = after_one[stopped]["lag_bytes"]
            assert isinstance(one_bytes, int)
            assert one_bytes > 0
            assert after_one[other]["lag_bytes"] == 0
            client.send("r", "two", key="k2")
            after_two = _reported(nodes, owner, lambda lag: lag[stopped]["lag_groups"] == 2)
            two_bytes = after_two[stopped]["lag_bytes"]
            assert isinstance(two_bytes, int)
            assert two_bytes > one_bytes
            assert after_two[other]["lag_bytes"] == 0
            families = _metrics(nodes, owner)
            assert families["loopd_replica_in_sync"].value(session="r", follower=stopped) == 0
            assert families["loopd_replica_in_sync"].value(session="r", follower=other) == 1
            lagging = families["loopd_replica_lag_bytes"].value(session="r", follower=stopped)
            assert lagging == two_bytes
            assert families["loopd_replica_in_sync_changes_total"].value(session="r") == 1
            current = nodes.replica_set()
            assert current is not None
            assert stopped not in current.in_sync
        finally:
            daemon.proc.send_signal(signal.SIGCONT)

        rounds = iter(range(10**6))

        def rejoined() -> dict[str, dict[str, object]] | None:
            try:  # each write gives the owner a chance to catch it up (at most once a second)
                client.send("r", "more", key=f"m{next(rounds)}")
            except ControlError:
                return None
            lag = _lag(nodes, owner)
            return lag if caught_up(lag) else None

        poll_until(rejoined, timeout=40, what=f"{stopped} back in sync with no lag")
        families = _metrics(nodes, owner)
        assert families["loopd_replica_in_sync"].value(session="r", follower=stopped) == 1
        assert families["loopd_replica_lag_bytes"].value(session="r", follower=stopped) == 0
        assert families["loopd_replica_in_sync_changes_total"].value(session="r") == 2
        current = nodes.replica_set()
        assert current is not None
        assert stopped in current.in_sync


def test_a_write_left_unacknowledged_says_so_though_its_retries_were_refused(
    nodes: Nodes,  # noqa: F811 - the fixture
) -> None:
    """Both followers stopped: the owner writes the request and cannot have it
    acknowledged; the client's retries are refused before a write (too few copies in
    sync). The error the caller gets says the outcome is unknown, not that nothing was
    written, and the same key sent once the followers answer is applied once."""
    with nodes.client() as client:
        client.create("r", replicas=3)
        client.send("r", "zero", key="k0")
        followers = [nodes.daemons[n].proc for n in NAMES if n != nodes.owner()]
        with stopped(*followers), pytest.raises(ControlError) as raised:
            client.send("r", "one", key="k1")
        said = str(raised.value)
        assert "writes are refused until they catch up" in said, said  # the last answer
        assert "an earlier attempt of key k1 was written on the owner and not acknowledged" in said
        assert "send it again with the same key" in said, said
        again = poll_until(lambda: _sent(client, "k1"), timeout=40, what="k1 acknowledged")
        assert again["duplicate"] is True  # the first attempt's write, answered from the log
    assert log_user_keys(nodes.root / nodes.owner(), "r") == ["k0", "k1"]


def _sent(client: ClusterClient, key: str) -> dict[str, object] | None:
    try:
        return client.send("r", "one", key=key)
    except ControlError:
        return None  # still catching up: refused before a write
