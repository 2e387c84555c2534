"""The owner's report of its followers (``Shipper.report``), on real files in one process.

The followers are real receivers writing real copies (``test_replication_shipper``'s
``LocalFollower``); one is made to fail its ships. The report's lag is the bytes and
group commits the owner made durable since that follower's last acknowledgement: 0
while it acknowledges, growing once it is out, 0 again once it is caught up; the
in-sync changes and the writes refused below the majority are counted. And the
``lag`` cell ``loopd status --cluster`` shows of such a report.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from supervisor.client.status_table import lag_cell
from tests.support import poll_until
from tests.test_replication_shipper import BASELINE, LocalFollower, _write
from worker import Owner, Session
from worker.catch_up import ShipFailed
from worker.replication import LOST_KEPT, ReplicasMissing, Shipper
from worker.store.replica_types import Position, Step


class Flaky(LocalFollower):
    """A local follower whose ships fail while ``down``."""

    down = False

    def ship(self, step: Step) -> Position:
        if self.down:
            raise ShipFailed(f"{self.node}: no answer")
        return super().ship(step)


def _by_node(shipper: Shipper) -> dict[str, dict[str, object]]:
    report = shipper.report()
    followers = report["followers"]
    assert isinstance(followers, list)
    return {str(f["node"]): f for f in followers}


def test_a_followers_lag_grows_while_it_is_out_and_clears_when_it_rejoins(
    tmp_path: Path,
) -> None:
    b = Flaky("b", tmp_path / "b")
    changes: list[tuple[str, bool]] = []
    with Session.create(tmp_path / "a", "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=3))
        shipper = Shipper(owner, 3, 2, [b], ["b"], lambda n, ok: changes.append((n, ok)))
        shipper.start()
        _write(owner, "k1")
        assert shipper.ship() is None
        seen = _by_node(shipper)["b"]
        assert (seen["in_sync"], seen["lag_bytes"], seen["lag_groups"]) == (True, 0, 0)
        assert isinstance(seen["ack_age_s"], float)
        acked_size = os.stat(owner.log_path).st_size
        b.down = True
        _write(owner, "k2")
        assert isinstance(shipper.ship(), ReplicasMissing)  # 1 of 2 copies: not acknowledged
        with pytest.raises(ReplicasMissing):
            shipper.check_writable()  # the next write is refused before a byte
        seen = _by_node(shipper)["b"]
        assert seen["in_sync"] is False
        assert seen["lag_groups"] == 1
        assert seen["lag_bytes"] == os.stat(owner.log_path).st_size - acked_size
        report = shipper.report()
        assert (report["in_sync_changes"], report["writes_refused"]) == (1, 1)
        b.down = False
        assert shipper.rejoin() == ["b"]
        seen = _by_node(shipper)["b"]
        assert (seen["in_sync"], seen["lag_bytes"], seen["lag_groups"]) == (True, 0, 0)
        report = shipper.report()
        assert (report["in_sync_changes"], report["writes_refused"]) == (2, 1)
        assert changes == [("b", False), ("b", True)]
        shipper.close()
    b.receiver.close()


def test_the_lag_cell_names_each_follower_and_marks_the_unknown() -> None:
    followers: list[object] = [
        {"node": "b", "in_sync": True, "lag_bytes": 0, "lag_groups": 0, "ack_age_s": 0.42},
        {"node": "c", "in_sync": False, "lag_bytes": 4096, "lag_groups": 12, "ack_age_s": 8},
        {"node": "d", "in_sync": False, "lag_bytes": None, "lag_groups": None, "ack_age_s": None},
        {"node": "e", "in_sync": False, "lag_bytes": None, "lag_groups": None, "ack_age_s": None,
         "copy_at": [0, 1048576, 77]},
        "not a follower",
    ]  # fmt: skip
    assert lag_cell(followers) == "b:0B/0g/0.4s,c:4096B/12g/8.0s,d:?,e:catching-up@0:1048576"


class Silent(Flaky):
    """A follower that, while ``silent`` is clear, takes requests and does not answer
    (SIGSTOPped, or cut off without a refusal) until it is set."""

    def __init__(self, node: str, home: Path) -> None:
        super().__init__(node, home)
        self.answering = threading.Event()

    def position(self, session: str) -> Position | None:
        if not self.answering.wait(60):
            raise ShipFailed(f"{self.node}: no answer within 60 s")
        return super().position(session)


def test_a_follower_that_does_not_answer_never_holds_up_the_owner_between_batches(
    tmp_path: Path,
) -> None:
    b, c = Flaky("b", tmp_path / "b"), Silent("c", tmp_path / "c")
    c.answering.set()
    with Session.create(tmp_path / "a", "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=3))
        shipper = Shipper(owner, 3, 3, [b, c], ["b", "c"], lambda n, ok: None)
        shipper.start()
        c.down, c.answering = True, threading.Event()  # c stops answering anything
        _write(owner, "k1")
        assert shipper.ship() is None  # b and the owner: 2 of 3 copies, acknowledged
        assert shipper.in_sync == {"b"}
        c.down = False
        for n in range(3):  # each call returns while c still has not answered
            returned = threading.Event()

            def between_batches(done: threading.Event = returned) -> None:
                shipper.rejoin_answering()
                done.set()

            threading.Thread(target=between_batches).start()
            assert returned.wait(30), "the owner waited on a follower that does not answer"
            _write(owner, f"k{n + 2}")
            assert shipper.ship() is None
        assert shipper.in_sync == {"b"}
        c.answering.set()  # c answers again: a probe finds it, and it catches up
        poll_until(lambda: shipper.rejoin_answering() == ["c"], timeout=30,
                   what="c back in sync")  # fmt: skip
        assert shipper.in_sync == {"b", "c"}
        _write(owner, "k5")
        assert shipper.ship() is None
        assert _by_node(shipper)["c"]["lag_bytes"] == 0
        shipper.close()
    b.receiver.close()
    c.receiver.close()


def test_a_session_refusing_writes_for_long_keeps_only_the_newest_reasons(
    tmp_path: Path,
) -> None:
    """Each write refused while a follower's removal from etcd is unconfirmed notes why
    in ``Shipper.lost``: it keeps the newest ``LOST_KEPT``, not one per refusal forever."""
    b = Flaky("b", tmp_path / "b")

    def etcd_down(_node: str, _in_sync: bool) -> None:
        raise OSError("the daemon's socket: connection refused")

    with Session.create(tmp_path / "a", "s", BASELINE) as owner:
        owner.append(Owner(node="a", token=3))
        shipper = Shipper(owner, 3, 2, [b], ["b"], etcd_down)
        shipper.start()
        b.down = True
        _write(owner, "k1")
        assert isinstance(shipper.ship(), ReplicasMissing)
        for _ in range(3 * LOST_KEPT):
            with pytest.raises(ReplicasMissing, match="etcd could not be told"):
                shipper.check_writable()
        assert len(shipper.lost) == LOST_KEPT
        assert all("connection refused" in why for _node, why in list(shipper.lost)[1:])
        shipper.close()
    b.receiver.close()
