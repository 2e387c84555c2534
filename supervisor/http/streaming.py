"""A streamed send: start its turn or join it, write its events (or its final one as JSON)."""

from __future__ import annotations

import asyncio
import json
from typing import Final

from supervisor.client import Client
from supervisor.errors import ControlError
from supervisor.http.calls import ClientPool
from supervisor.http.responses import EVENT_STREAM_HEAD, Writer, response, status_of
from supervisor.http.sse import Turn, Turns

IDLE_COMMENT: Final = 15.0
"""Seconds without an event after which a comment line is sent (proxies close silent
connections, and a write is how a client gone away is noticed)."""


def produce(
    client: Client, turn: Turn, session: str, text: str, key: str, untrusted: bool, partials: bool
) -> None:
    """On a pool thread: the turn's partials (if ``partials``), a ``restart`` after each
    worker death, then its ``reply`` (or its ``error``)."""
    restarts = 0
    try:
        stream = client.stream(session, text, key=key, untrusted=untrusted)
        for partial in stream:
            if not partials:
                continue
            if stream.restarts != restarts:
                restarts = stream.restarts
                turn.append("restart", {"restarts": restarts, "why": "the worker died"})
            turn.append("partial", {"text": partial})
        if partials and stream.restarts != restarts:
            turn.append("restart", {"restarts": stream.restarts, "why": "the worker died"})
        turn.append("reply", stream.reply)
    except ControlError as exc:
        turn.append("error", {"error": {"code": exc.code, "message": exc.message}})


async def start_or_join(
    pool: ClientPool,
    turns: Turns,
    session: str,
    text: str,
    key: str,
    untrusted: bool,
    last_id: int,
    tenant: str | None = None,
) -> Turn:
    """The registered turn of (session, key), or a new one started on the pool.

    A new turn for a reconnect (``last_id`` > 0: the first one is gone, finished long
    ago or served by a serve since restarted) numbers its events after ``last_id`` and
    sends only the final one: its request is a retry by key, answered from the log if it
    was applied, and the App may stream again before that answer (what the client has
    seen already).
    """
    turn = turns.get(session, key)
    if turn is not None:
        return turn
    turn = Turn(asyncio.get_running_loop(), first_id=last_id + 1)
    turns.add(session, key, turn)
    task = asyncio.ensure_future(
        pool.run(
            lambda client: produce(client, turn, session, text, key, untrusted, last_id == 0),
            tenant,
        )
    )
    task.add_done_callback(lambda t: _failed(t, turn))
    return turn


def _failed(task: asyncio.Future[None], turn: Turn) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, ControlError):  # refused before it ran: the pool is full
        turn.append("error", {"error": {"code": exc.code, "message": exc.message}})
    elif exc is not None:
        turn.append("error", {"error": {"code": "internal", "message": str(exc)}})


async def write_events(turn: Turn, writer: Writer, last_id: int) -> None:
    """Write the turn's events after ``last_id`` as they come, until its final one."""
    writer.write(EVENT_STREAM_HEAD)
    while True:
        try:
            dropped, events = await asyncio.wait_for(turn.follow(last_id), IDLE_COMMENT)
        except TimeoutError:
            writer.write(b": waiting\n\n")
            await writer.drain()
            continue
        if dropped:
            note = f'{{"dropped": {dropped}}}'
            writer.write(f"event: gap\ndata: {note}\n\n".encode())
        for event in events:
            writer.write(event.encode())
            last_id = event.id
            # Drained event by event: a reconnect that asks for a whole turn's events
            # from a slow reader holds the transport's 64 KiB, not the turn's 1 MiB.
            await writer.drain()
        if turn.finished and not turn.after(last_id)[1]:
            return


async def write_final_as_json(turn: Turn, writer: Writer, keep: bool) -> None:
    """The final event of a registered turn, as a plain JSON answer."""
    last = 0
    while True:
        _dropped, events = await turn.follow(last)
        for event in events:
            last = event.id
            if event.kind == "reply":
                writer.write(response(200, event.data.encode(), keep_alive=keep))
                return
            if event.kind == "error":
                error = json.loads(event.data)["error"]
                status = status_of(str(error["code"]))
                writer.write(response(status, event.data.encode(), keep_alive=keep))
                return
