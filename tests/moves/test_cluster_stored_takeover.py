"""Taking over a lost node's sessions kept in a database (``supervisor.node.stored``),
against a real etcd: one round trip each with the placement read by ``orphans``, never
over a placement that changed since, and in an order of each node's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cluster.errors import NotOwner
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.keys import node_value, placement_key
from supervisor.cluster.ownership import owner_of, place_new
from supervisor.node.stored import orphans, take_over_stored, takeover_order
from tests.harness.cluster_support import register
from tests.harness.etcd_server import EtcdServer


def test_a_lost_nodes_sessions_are_taken_over_with_the_placement_read_and_not_after_it_changed(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    with EtcdClient(etcd.url) as client:
        a = register(client, "a", tmp_path / "a")
        b = register(client, "b", tmp_path / "b")
        c = register(client, "c", tmp_path / "c")
        for session in ("s0", "s1", "s2"):
            place_new(client, session, "a", a.lease_id)
        assert orphans(client, "b") == {}  # a is registered
        client.lease_revoke(a.lease_id)  # a's lease gone: its node and owner keys with it
        gone = orphans(client, "b")
        assert gone == dict.fromkeys(("s0", "s1", "s2"), node_value("a"))
        taken = take_over_stored(client, "s0", "b", b.lease_id, gone["s0"])
        assert taken.previous == "a"
        owner = owner_of(client, "s0")
        assert owner is not None
        assert (owner.node, owner.token) == ("b", taken.token)
        # s1 placed again elsewhere since it was read: the value read no longer holds.
        client.put(placement_key("s1"), node_value("c"))
        with pytest.raises(NotOwner):
            take_over_stored(client, "s1", "b", b.lease_id, gone["s1"])
        assert owner_of(client, "s1") is None
        # Another node's takeover of one already taken over is refused, not repeated.
        with pytest.raises(NotOwner, match="owned by b"):
            take_over_stored(client, "s0", "c", c.lease_id, gone["s0"])
        # Without the value read, it is read first, as before.
        assert take_over_stored(client, "s2", "c", c.lease_id).previous == "a"


def test_each_node_takes_a_lost_nodes_sessions_in_an_order_of_its_own() -> None:
    sessions = [f"s{n}" for n in range(40)]
    mine, theirs = takeover_order(sessions, "b"), takeover_order(sessions, "c")
    assert sorted(mine) == sorted(theirs) == sorted(sessions)
    assert mine == takeover_order(reversed(sessions), "b")  # the node's, not the input's
    assert mine[:5] != theirs[:5]  # they start apart instead of racing for s0, s1, ...
