"""Run on a host of ``scripts.cluster.bench_cluster_move_hosts``: one step of the benchmark.

    python -m scripts.cluster.bench_hosts_side build HOME SESSION RECORDS
    python -m scripts.cluster.bench_hosts_side receive ADDRESS PORT DIR ROUNDS
    python -m scripts.cluster.bench_hosts_side send ADDRESS PORT DIR
    python -m scripts.cluster.bench_hosts_side move ETCD_URL SESSION TARGET
    python -m scripts.cluster.bench_hosts_side parts HOME SESSION REPEAT

``build`` appends records to a stopped session (requests of four records, one group
commit each). ``receive`` and ``send`` are the reference: a plain TCP copy of a session
directory's files, each fdatasynced by the receiver, then the directory fsynced, then
one byte back; ``send`` prints its seconds, connect to that byte. ``move`` runs
``move_remote`` (certificates from $LOOPD_TLS_*) and prints where its time went:
each step, each request to a node, the TLS connects, etcd's requests. ``parts`` times,
on a scratch copy of a session, what the nodes do inside those requests: the open
(``Session.open``), the manifest's check (``load_session``), one SHA-256 pass.
Each prints one JSON object.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from supervisor.cli.cluster_commands import MOVE_TIMEOUT, RemoteNodes
from supervisor.cluster.etcd import EtcdClient
from supervisor.cluster.peer_link import NodeLink
from supervisor.cluster.routing import node_address
from supervisor.cluster.transport import tls_files_from_env
from supervisor.moves.move import MoveStep
from supervisor.moves.remote_move import move_remote
from supervisor.moves.session_files import file_hashes
from worker import Assistant, Session, ToolResult, Usage, User
from worker.store.loader import load_session

HEADER = struct.Struct("!HQ")
"""A file of the reference copy: its name's length and its size (name length 0: the end)."""


def build(home: str, session_id: str, records: int) -> dict[str, object]:
    with Session.open(home, session_id) as session:
        for n in range((records - 2) // 4):
            session.append_many(
                [
                    User(text=f"request {n} " + "x" * 60, key=f"k{n}"),
                    ToolResult(call=n + 1, tool="echo", output="x" * 60, ok=True),
                    Assistant(text="echo: " + "x" * 60),
                    Usage(prompt_tokens=20, completion_tokens=20, context_tokens=40),
                ]
            )
    directory = os.path.join(home, "sessions", session_id)
    size = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
    return {"bytes": size}


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        got = conn.recv(min(size - len(data), 1 << 20))
        if not got:
            raise SystemExit("receive: the sender closed early")
        data += got
    return bytes(data)


def receive(address: str, port: int, directory: str, rounds: int) -> dict[str, object]:
    """Accept ``rounds`` copies at ``address:port``, one connection each, into
    ``directory/copy-N``."""
    listener = socket.create_server((address, port))
    print("ready", flush=True)
    for n in range(rounds):
        conn, _peer = listener.accept()
        target = os.path.join(directory, f"copy-{n}")
        with conn:
            os.mkdir(target)
            while True:
                length, size = HEADER.unpack(_recv_exactly(conn, HEADER.size))
                if length == 0:
                    break
                name = _recv_exactly(conn, length).decode()
                fd = os.open(os.path.join(target, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                try:
                    left = size
                    while left:
                        chunk = conn.recv(min(left, 1 << 20))
                        if not chunk:
                            raise SystemExit("receive: the sender closed mid-file")
                        os.write(fd, chunk)
                        left -= len(chunk)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(fd)
            os.close(fd)
            conn.sendall(b"k")
        shutil.rmtree(target)
    listener.close()
    return {"copies": rounds}


def send(address: str, port: int, directory: str) -> dict[str, object]:
    names = sorted(n for n in os.listdir(directory) if not n.endswith(".tmp"))
    start = time.perf_counter()
    with socket.create_connection((address, port)) as conn:
        for name in names:
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
            encoded = name.encode()
            conn.sendall(HEADER.pack(len(encoded), len(data)) + encoded)
            conn.sendall(data)
        conn.sendall(HEADER.pack(0, 0))
        if conn.recv(1) != b"k":
            raise SystemExit("send: no acknowledgement from the receiver")
    return {"seconds": time.perf_counter() - start, "files": len(names)}


def _timed(into: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into.setdefault(name, []).append(time.perf_counter() - start)

    return wrapper


def move(url: str, session_id: str, target: str) -> dict[str, object]:
    files = tls_files_from_env()
    if files is None:
        raise SystemExit("move: no $LOOPD_TLS_* certificate")
    etcd_times: dict[str, list[float]] = {}
    calls: dict[str, list[float]] = {}
    marks: list[tuple[str, float]] = []
    with EtcdClient(url, timeout=10) as client:
        client.range("/warm-up")  # the etcd connection is not the move's
        # Every request to etcd passes its one private method: timed there, once each.
        client._call = _timed(etcd_times, "etcd", client._call)  # type: ignore[method-assign]
        nodes = RemoteNodes(client, files)

        def request(node: str, op: str, session: str) -> object:
            if node not in nodes.links:  # the TLS connect and handshake, timed apart
                address = node_address(client, node)
                assert address is not None, node
                link = nodes.links[node] = NodeLink(address, node, files, timeout=MOVE_TIMEOUT)
                _timed(calls, "connect", link.call)("ping")
            return _timed(calls, op, nodes)(node, op, session)

        def hook(step: MoveStep) -> None:
            marks.append((step.value, time.perf_counter()))

        start = time.perf_counter()
        try:
            done = move_remote(client, session_id, target, request, before_step=hook)
        finally:
            nodes.close()
        end = time.perf_counter()
    steps = {
        name: later - began
        for (name, began), later in zip(marks, [t for _n, t in marks[1:]] + [end], strict=True)
    }
    spent = {op: sum(times) for op, times in calls.items()}
    in_etcd = sum(sum(times) for times in etcd_times.values())
    return {
        "seconds": end - start,
        "node": done.node,
        "steps": steps,
        "calls": spent,
        "etcd": in_etcd,
        "etcd_requests": sum(len(times) for times in etcd_times.values()),
        "other": end - start - sum(spent.values()) - in_etcd,
    }


def parts(home: str, session_id: str, repeat: int) -> dict[str, object]:
    """The nodes' own work in a move, each alone, on a scratch copy of the session."""
    source = os.path.join(home, "sessions", session_id)
    scratch = os.path.join(os.path.dirname(home), "bench-scratch")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(os.path.join(scratch, "sessions"))
    copy = os.path.join(scratch, "sessions", session_id)
    shutil.copytree(source, copy)
    times: dict[str, list[float]] = {"open": [], "load_session": [], "sha256": []}
    try:
        for _ in range(repeat):
            start = time.perf_counter()
            Session.open(scratch, session_id).close()
            times["open"].append(time.perf_counter() - start)
            start = time.perf_counter()
            load_session(copy, session_id)
            times["load_session"].append(time.perf_counter() - start)
            start = time.perf_counter()
            file_hashes(copy)
            times["sha256"].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(scratch)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    command, args = sys.argv[1], sys.argv[2:]
    if command == "build":
        result = build(args[0], args[1], int(args[2]))
    elif command == "receive":
        result = receive(args[0], int(args[1]), args[2], int(args[3]))
    elif command == "send":
        result = send(args[0], int(args[1]), args[2])
    elif command == "move":
        result = move(args[0], args[1], args[2])
    elif command == "parts":
        result = parts(args[0], args[1], int(args[2]))
    else:
        raise SystemExit(f"bench_hosts_side: unknown command {command!r}")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
