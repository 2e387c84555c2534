"""``python -m tests.programs.cluster_node_process URL NAME HOME TTL``: a node taking keyed writes.

It starts a ``ClusterNode`` (registration, keepalive, claims; a name still held by the
lease of a killed predecessor is waited for), prints its claims as one JSON line, then
answers one JSON line per line on stdin: ``send KEY`` is the default app's write to the
session ``chaos``, acknowledged with the token only if the node can still prove its
lease *after* the write is durable; ``claim`` claims the local sessions again (what a
node does when it learns that a session moved to it). End of stdin stops it.
"""

from __future__ import annotations

import json
import sys

from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.lease import LeaseTiming, NodeNameTaken
from supervisor.node.node import Claims, ClusterNode
from tests.harness.support import poll_until
from worker import Session, SessionError
from worker.app import DefaultApp

SESSION = "chaos"


def main(argv: list[str]) -> int:
    url, name, home, ttl = argv[0], argv[1], argv[2], int(argv[3])
    app = DefaultApp(budget=40)
    with EtcdClient(url) as client:
        node = ClusterNode(client, name, home, timing=LeaseTiming(ttl=ttl))

        def started() -> Claims | None:
            try:
                return node.start()
            except NodeNameTaken:  # the previous holder's lease has not expired yet
                return None

        claims = poll_until(started, timeout=ttl * 5, what=f"the node name {name} to be free")
        print(json.dumps({"served": claims.served, "quarantined": claims.quarantined}), flush=True)
        for line in sys.stdin:
            command, _, key = line.strip().partition(" ")
            if command == "claim":
                claims = node.claim_local_sessions()
                print(json.dumps({"served": claims.served, "quarantined": claims.quarantined}))
                sys.stdout.flush()
                continue
            token = node.token_of(SESSION)
            if token is None or not node.can_acknowledge(SESSION, token):
                reply = {"ok": False, "key": key, "error": "not_owner: lease not proven"}
            else:
                try:
                    with Session.open(home, SESSION) as session:
                        app.handle(session, {"text": key, "key": key})
                except SessionError as exc:
                    reply = {"ok": False, "key": key, "error": str(exc)}
                else:
                    proven = node.can_acknowledge(SESSION, token)
                    reply = (
                        {"ok": True, "key": key, "token": token}
                        if proven
                        else {"ok": False, "key": key, "error": "not_owner: lease lost"}
                    )
            print(json.dumps(reply), flush=True)
        node.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
