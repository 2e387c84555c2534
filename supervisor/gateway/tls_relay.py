"""The relayed control path of a node's TLS port: an accepted peer's frames to the daemon.

A peer that starts TLS at once (no direct preamble) is served by the TLS thread: each
of its requests is checked against its certificate's role (``transport.ALLOWED``) and
written to the node's own control socket, whose replies go back unchanged. A
``loopd-client``'s requests carry its certificate's tenant, set here over whatever it
sent (docs/operations.md, "Tenants"); a moved session's ``files`` are read here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Final

from supervisor.cluster.transport import ALLOWED, Role, dns_names
from supervisor.moves.move_node import answer_files
from worker.ipc.tls_roles import tenant_of
from worker.ipc.wire import MAX_FRAME, FrameReader, WireError, encode, error

READ_SIZE: Final = 1 << 16


async def relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    role: Role,
    peer: str,
    cert: dict[str, object],
    control_path: str,
    refuse: Callable[[str, str], None],
) -> None:
    """Relay an accepted peer's requests, frame by frame, to the node's control socket at
    ``control_path`` and its replies back, each checked against the peer's ``role``;
    ``refuse(peer, why)`` tells the node's log of a request refused here."""
    try:
        daemon_reader, daemon_writer = await asyncio.open_unix_connection(control_path)
    except OSError as exc:
        writer.write(encode(error(None, "no_daemon", f"the node is not serving: {exc}")))
        await writer.drain()
        return
    back = asyncio.ensure_future(_copy(daemon_reader, writer))
    frames = FrameReader(MAX_FRAME)
    allowed = ALLOWED[role]
    names = dns_names(cert)
    # A client's tenant goes with each of its requests, over whatever it sent: the
    # daemon's one rule (supervisor/sessions/tenants.py) then checks every op.
    tenant = tenant_of(cert) if role is Role.CLIENT else None
    try:
        while not back.done():
            data = await reader.read(READ_SIZE)
            if not data:
                break
            try:
                messages = frames.feed(data)
            except WireError as exc:  # the peer is told why, then the connection ends
                refuse(peer, f"a bad frame: {exc}")
                writer.write(encode(error(None, "bad_frame", f"{exc}: the connection ends")))
                await writer.drain()
                return
            for message in messages:
                op = message.get("op")
                if op not in allowed:
                    refuse(peer, f"op {op!r:.80} is not allowed to a {role.value} "
                                 "certificate")  # fmt: skip
                    answer = error(message.get("id"), "forbidden",
                        f"a {role.value} certificate may not ask {op!r:.80}")  # fmt: skip
                elif op in ("files", "file"):  # a moved session's files, read here
                    home = os.path.dirname(control_path)
                    answer = await asyncio.to_thread(answer_files, home, message, names)
                else:
                    if tenant is not None:
                        message["tenant"] = tenant
                    try:
                        daemon_writer.write(encode(message))
                        continue
                    except WireError as exc:  # a frame the tenant's name made too large
                        answer = error(message.get("id"), "too_large", str(exc))
                # Answered here: written at the pace the peer reads, so a peer that
                # never reads its replies stops being read, never grows the node.
                writer.write(encode(answer))
                await writer.drain()
            await daemon_writer.drain()
    finally:
        back.cancel()
        daemon_writer.transport.abort()


async def _copy(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    while data := await source.read(READ_SIZE):
        target.write(data)
        await target.drain()
    target.transport.abort()  # the daemon closed its end: so does the peer's
