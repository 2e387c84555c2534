"""``loopd takeover ID --from-copy PATH --to NODE``: the lossy, explicit recovery of a lost node.

For a node gone for good: its owner key vanished with its lease, and an operator has a
copy of the session's directory (a backup, a disk pulled from the dead host). Every
write the dead node acknowledged after that copy was made is lost; this is why it is an
operator's action and never automatic (docs/scaling.md section 7).
"""

from __future__ import annotations

import os
import shutil

from supervisor.cluster.errors import MoveFailed
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.etcd_types import Put, absent
from supervisor.cluster.keys import move_key, node_value, owner_key, placement_key
from supervisor.cluster.ownership import owner_of
from supervisor.moves.move import MoveDone, node_home
from supervisor.moves.session_files import copy_session, file_hashes, install_copy
from worker import Owner, Session, SessionError
from worker.store.disk.layout import session_dir


def take_over(client: EtcdClient, session: str, copy: str, target: str) -> MoveDone:
    """Install ``copy`` (a session directory) on ``target`` and make it the owner; lossy."""
    owner = owner_of(client, session)
    if owner is not None:
        raise MoveFailed(
            session,
            "takeover",
            f"{owner.node} owns it (token {owner.token}) and its lease is alive: use "
            "`loopd move` for a live node, or wait for its lease to expire",
        )
    home, lease = node_home(client, target)
    installed = session_dir(home, session)
    if os.path.isdir(installed):
        raise MoveFailed(session, "takeover", f"{installed} exists: the target holds a copy")
    incoming = copy_session(copy, home, session)
    if file_hashes(incoming) != file_hashes(copy):
        shutil.rmtree(incoming)
        raise MoveFailed(session, "takeover", f"the copy of {copy} does not match it")
    install_copy(home, session)
    try:
        Session.open(home, session).close()  # refuse a torn or invalid copy before owning it
    except SessionError as exc:
        shutil.rmtree(installed)
        raise MoveFailed(session, "takeover", f"the copy is refused: {exc}") from exc
    result = client.txn(
        [absent(owner_key(session)), absent(move_key(session))],
        [
            Put(key=owner_key(session), value=node_value(target), lease=lease),
            Put(key=placement_key(session), value=node_value(target)),
        ],
    )
    if not result.succeeded:
        shutil.rmtree(installed)
        raise MoveFailed(session, "takeover", "another owner or a move appeared meanwhile")
    with Session.open(home, session) as opened:
        opened.append(Owner(node=target, token=result.revision))
    return MoveDone(session=session, node=target, token=result.revision)
