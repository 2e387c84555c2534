"""The HTTP/1.1 API of ``loopd serve --http HOST:PORT`` (docs/http.md).

It runs on its own thread and asyncio loop, and reaches the daemon as any client does:
the control socket and the workers' direct connections (``supervisor.client.Client``).
Modules: ``parser`` (one request off a connection, strictly), ``responses`` (status
lines, JSON bodies, the wire codes' statuses), ``calls`` (blocking client calls on a
pool of threads), ``sse`` (resumable event streams of streaming turns), ``routes`` (the
endpoints) and ``server`` (the listening thread, connections, keep-alive).

Nothing is imported here: ``serve`` reads ``tokens`` at every start and imports
``server`` with ``--http`` only.
"""
