"""A replicated session's followers rejoin without any write (three real daemons).

Both followers SIGKILLed, the session refuses writes (one copy of three in sync); each
follower started again is caught up and back in etcd's in-sync set while no client
writes at all: the owner's worker probes and rejoins between batches, on a timer of its
loop, not on the write path.
"""

from __future__ import annotations

import pytest

from supervisor.errors import ControlError
from tests.support import poll_until
from tests.test_cluster_replicated_daemons import NAMES, Nodes, nodes  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(100)


def test_an_idle_session_refusing_writes_regains_its_followers_without_a_write(
    nodes: Nodes,  # noqa: F811 - the fixture imported above
) -> None:
    with nodes.client() as client:
        client.create("r")  # 3 copies, loopd.toml's default: 2 must be in sync
        owner = nodes.owner()
        first, second = (n for n in NAMES if n != owner)
        client.send("r", "one", key="k1")
        nodes.kill(first)
        client.send("r", "two", key="k2")  # first is out of the in-sync set now
        nodes.kill(second)
        with pytest.raises(ControlError):
            client.send("r", "three", key="k3")  # second out too: writes refused
        current = nodes.replica_set()
        assert current is not None
        assert current.in_sync == ()

        def in_sync(*names: str) -> bool:
            now = nodes.replica_set()
            return now is not None and set(now.in_sync) == set(names)

        nodes.start(first)  # no write from here until both are back
        poll_until(lambda: in_sync(first), timeout=30, what=f"{first} in sync with no write")
        nodes.start(second)
        poll_until(lambda: in_sync(first, second), timeout=30, what=f"{second} in sync too")
        assert nodes.copy_keys(first) == nodes.copy_keys(second) == ["k1", "k2", "k3"]
        assert client.send("r", "four", key="k4")["duplicate"] is False
