"""``python -m tests.replica_owner_process CONFIG_JSON``: the owner of a replicated session.

A cluster node (registration, keepalive) that creates the session ``SESSION`` with
``replicas`` copies, places its followers and in-sync set in etcd (guarded by its
token), and ships every write to its followers' TLS ports (``worker.replication``,
``supervisor.cluster.follower_link``) before acknowledging it. It prints one JSON line
when ready, then answers one JSON line per line on stdin:

- ``send KEY``: the default app's write; ``{"ok": true}`` only after the owner's
  fdatasync, every in-sync follower's acknowledgement and a proven lease;
  ``before_write`` when it was refused before a byte was written;
- ``compact``: an epoch commit, shipped the same way;
- ``rejoin``: catch the followers out of sync up and add them back;
- ``crash KEY``: the write of KEY, and a SIGKILL of this process after its write and
  before its fdatasync, once every follower's copy holds the group (or 20 s passed).

End of stdin stops it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.follower_link import FollowerLink
from supervisor.cluster.lease import LeaseTiming
from supervisor.cluster.node import ClusterNode
from supervisor.cluster.replica_set import change_in_sync, place_replicas
from supervisor.cluster.transport import TlsFiles
from worker import Session, SessionError
from worker.app import DefaultApp
from worker.catch_up import ShipFailed
from worker.replication import Shipper
from worker.store import durable

SESSION = "r"


def main(config: dict[str, object]) -> int:
    url, name, home = str(config["url"]), str(config["node"]), str(config["home"])
    followers = config["followers"]
    assert isinstance(followers, dict)
    tls = TlsFiles(**config["tls"])  # type: ignore[arg-type]
    replicas = int(str(config["replicas"]))
    app = DefaultApp(budget=1000)
    with EtcdClient(url) as client:
        node = ClusterNode(client, name, home, timing=LeaseTiming(ttl=int(str(config["ttl"]))))
        node.start()
        token = node.create(SESSION, app.initial_baseline(SESSION), slot=7)
        place_replicas(client, SESSION, token, replicas, sorted(followers))

        def change(follower: str, in_sync: bool) -> None:
            if in_sync:
                change_in_sync(client, SESSION, token, add=follower)
            else:
                change_in_sync(client, SESSION, token, remove=follower)

        links = [FollowerLink(f, str(followers[f]), tls) for f in sorted(followers)]
        with Session.open(home, SESSION) as session:
            shipper = Shipper(session, token, replicas, links, sorted(followers), change)
            shipper.start()
            session.on_written = shipper.written  # as the worker: shipped while it syncs
            print(
                json.dumps({"ready": True, "token": token, "lost": list(shipper.lost)}), flush=True
            )
            for line in sys.stdin:
                command, _, key = line.strip().partition(" ")
                if command == "crash":
                    durable.set_hook(_KillBeforeFsync(session.log_path, followers, tls))
                    command = "send"
                reply = _command(node, session, shipper, app, token, command, key)
                print(json.dumps(reply), flush=True)
            shipper.close()
        for link in links:
            link.close()
        node.close()
    return 0


def _command(
    node: ClusterNode, session: Session, shipper: Shipper, app: DefaultApp, token: int,
    command: str, key: str,
) -> dict[str, object]:  # fmt: skip
    if command == "rejoin":
        return {"joined": shipper.rejoin(), "in_sync": sorted(shipper.in_sync)}
    try:
        if not node.can_acknowledge(SESSION, token):
            return {"ok": False, "before_write": True, "error": "not_owner: lease not proven"}
        shipper.check_writable()
    except SessionError as exc:
        return {"ok": False, "before_write": True, "error": str(exc)}
    try:
        if command == "compact":
            session.commit_epoch(f"summary of epoch {session.epoch}", app.initial_baseline(SESSION))
        else:
            app.handle(session, {"text": key, "key": key})
    except SessionError as exc:
        return {"ok": False, "error": str(exc)}
    try:
        lost = shipper.ship()
    except Exception as exc:  # noqa: BLE001 - the etcd change failed: nothing acknowledged
        return {"ok": False, "error": f"in-sync change failed: {exc}"}
    if lost is not None:
        return {"ok": False, "error": str(lost)}
    if not node.can_acknowledge(SESSION, token):
        return {"ok": False, "error": "not_owner: lease lost"}
    # The in-sync set and the latest losses, for a test's message should it fail.
    return {"ok": True, "key": key, "token": token, "epoch": session.epoch,
            "in_sync": sorted(shipper.in_sync), "lost": list(shipper.lost)[-4:]}  # fmt: skip


class _KillBeforeFsync:
    """A boundary hook: at the fdatasync of ``log``, wait until every follower's copy ends
    where the owner's log now does, then SIGKILL this process (the sync never runs)."""

    def __init__(self, log: str, followers: dict[str, str], tls: TlsFiles) -> None:
        self.log = log
        self.followers = followers
        self.tls = tls

    def __call__(self, boundary: durable.Boundary) -> None:
        if boundary.step is not durable.Step.FSYNC or boundary.path != self.log:
            return
        assert boundary.fd is not None
        size = os.fstat(boundary.fd).st_size
        deadline = time.monotonic() + 20
        waiting = sorted(self.followers)
        while waiting and time.monotonic() < deadline:
            # Each follower's copy, asked over a connection of its own (its lane's is busy).
            link = FollowerLink(waiting[0], str(self.followers[waiting[0]]), self.tls)
            try:
                at = link.position(SESSION)
            except ShipFailed:
                at = None
            finally:
                link.close()
            if at is not None and at.size >= size:
                waiting.pop(0)
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
