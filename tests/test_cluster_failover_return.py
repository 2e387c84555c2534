"""A replicated session's returning old owner keeps what it shares with the new owner.

Three real daemons with TLS ports; every process of the owner's node SIGKILLed, a line
it made durable but never had acknowledged appended to its copy meanwhile (a write in
flight at the kill). Once it is back, its copy is a follower's: the same log file
(never copied again from nothing), cut back to the prefix the new owner's log shares,
the unacknowledged line in quarantine (never deleted), and caught up from there.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from supervisor.cluster.errors import ClusterError
from supervisor.errors import ControlError
from tests.support import poll_until
from tests.test_cluster_replicated_daemons import Nodes, nodes  # noqa: F401 - the fixture
from worker import Session, SessionLocked, User

pytestmark = pytest.mark.timeout(100)
T = "2026-12-01T20:00:00.000000Z"


def test_a_returning_owner_keeps_its_shared_prefix_and_quarantines_its_suffix(
    nodes: Nodes,  # noqa: F811 - the fixture imported above
) -> None:
    with nodes.client() as client:
        client.create("r")  # 3 copies, loopd.toml's default
        owner = nodes.owner()
        for n in range(4):
            client.send("r", f"t{n}", key=f"k{n}")
        nodes.kill(owner)
        home = nodes.root / owner
        old = poll_until(lambda: _opened(home), what="the killed worker's lock released")
        with old:  # durable on the old owner only
            old.append(User(time=T, text="never acknowledged", key="lost"))
            old_log = Path(old.log_path)
        inode = old_log.stat().st_ino

        def served() -> dict[str, object] | None:
            try:
                return client.send("r", "after", key="k4")
            except (ControlError, ClusterError):
                return None

        poll_until(served, timeout=30, what="the session served again")
        nodes.start(owner)

        def rejoined() -> bool:
            now = nodes.replica_set()
            if now is not None and owner in now.in_sync:
                return True
            with contextlib.suppress(ControlError, ClusterError):
                client.send("r", "more", key="k5")  # refused while too few are in sync
            return False

        poll_until(rejoined, timeout=40, what=f"{owner} back in the in-sync set")
    assert not (home / "sessions" / "r").exists()
    assert not list((home / "quarantine").glob("r.*"))  # not set aside whole
    copy_log = home / "replicas" / "sessions" / "r" / old_log.name
    assert copy_log.stat().st_ino == inode  # the old owner's own log, kept and continued
    suffix = list((home / "replicas" / "quarantine" / "r").glob("*.unacknowledged"))
    assert len(suffix) == 1
    assert b'"lost"' in suffix[0].read_bytes()
    keys = nodes.copy_keys(owner)
    assert keys[:6] == ["k0", "k1", "k2", "k3", "k4", "k5"]
    assert "lost" not in keys
    assert len(keys) == len(set(keys))


def _opened(home: Path) -> Session | None:
    try:
        return Session.open(home, "r")
    except SessionLocked:  # the SIGKILLed worker is not reaped yet
        return None
