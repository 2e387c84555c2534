"""The direct data path: a client gets a connection of its own to a session's worker.

The daemon makes a socketpair and passes one end to the worker and the other to the
client, both with SCM_RIGHTS, then closes its copies: requests then go from client to
worker without passing through the daemon's loop. A TCP client of the node's TLS port
gets the same: the TLS thread passes its socket here (``tcp_handover``), and the worker
gets that socket itself.
"""

from __future__ import annotations

import socket

from supervisor.sessions.endpoints import Waiter, WorkerChannel
from worker.ipc.wire import error


def hand_over(
    link: WorkerChannel, waiter: Waiter, session: str, worker_pid: int, epoch: int | None
) -> None:
    """Connect the waiting client to the worker behind ``link``; one reply either way.

    The reply says the session's epoch as the daemon last heard it: the client sends it
    with its keyed requests (the retry window, docs/format.md). A waiter from the TLS port
    brings its TCP socket: that is what the worker gets, to make the TLS handshake itself,
    with the session's tenant (its ``owner``), whose client certificates alone it serves.
    """
    if waiter.sock is not None:
        attach = {"op": "attach", "tls": True, "owner": waiter.owner}  # tenant_refusal's
        if link.send_with_fd(attach, waiter.sock.fileno()):
            result = {"session": session, "worker_pid": worker_pid, "epoch": epoch}
            waiter.client.reply({"id": waiter.request_id, "ok": True, "result": result})
        else:
            waiter.client.reply(
                error(waiter.request_id, "busy", f"the worker of session {session} is busy; retry")
            )
        return
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:  # EMFILE, ENFILE, ENOMEM: out of descriptors for now
        waiter.client.reply(
            error(waiter.request_id, "busy", f"no connection to session {session} can be "
                  f"made now ({exc.strerror}); retry")
        )  # fmt: skip
        return
    try:
        if not link.send_with_fd({"op": "attach"}, ours.fileno()):
            waiter.client.reply(
                error(waiter.request_id, "busy", f"the worker of session {session} is busy; retry")
            )
            return
        result = {"session": session, "worker_pid": worker_pid, "epoch": epoch}
        if not waiter.client.reply_with_fd(
            {"id": waiter.request_id, "ok": True, "result": result}, theirs.fileno()
        ):
            # The worker's end is dropped with ours below: the worker sees it end at once.
            waiter.client.reply(
                error(waiter.request_id, "busy", "read the replies already sent before asking "
                      "for a connection; retry")
            )  # fmt: skip
    finally:
        ours.close()
        theirs.close()
