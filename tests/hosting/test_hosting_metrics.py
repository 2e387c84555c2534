"""The Prometheus exposition: valid by the format's rules, and its values as recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from supervisor.hosting.metrics.daemon_metrics import DaemonMetrics
from supervisor.hosting.metrics.exposition import Registry
from supervisor.hosting.metrics.metrics_http import parse_listen, serve_metrics
from tests.harness.promtext import ExpositionError, parse
from worker import Session
from worker.app import DefaultApp
from worker.loop.replies import error_reply
from worker.store.errors import KeyExpired
from worker.store.format.records import Usage
from worker.store.stats import STATS, WorkerStats


def test_an_exposition_of_every_kind_parses_and_reads_back() -> None:
    registry = Registry()
    registry.counter("loopd_restarts_total", "Worker restarts.").inc(3)
    states = registry.gauge("loopd_sessions", "Sessions by state.")
    states.set(2, state="RUNNING")
    states.set(1, state='odd "quoted"\nstate\\')
    latency = registry.histogram("loopd_request_seconds", "Request latency.").histogram()
    for seconds in (0.0001, 0.003, 0.003, 7.0):
        latency.observe(seconds)
    families = parse(registry.render())
    assert families["loopd_restarts_total"].kind == "counter"
    assert families["loopd_restarts_total"].value() == 3
    assert families["loopd_sessions"].value(state='odd "quoted"\nstate\\') == 1
    hist = families["loopd_request_seconds"]
    assert hist.kind == "histogram"
    assert hist.total("_count") == 4
    assert hist.total("_sum") == pytest.approx(7.0061)
    buckets = {s.labels["le"]: s.value for s in hist.samples if s.name.endswith("_bucket")}
    assert buckets["0.0005"] == 1
    assert buckets["0.005"] == 3
    assert buckets["+Inf"] == 4


def test_collectors_refresh_gauges_at_each_render() -> None:
    registry = Registry()
    live = registry.gauge("loopd_live_workers", "Live workers.")
    counter = iter(range(10))
    registry.on_collect(lambda: live.set(next(counter)))
    registry.render()
    assert parse(registry.render())["loopd_live_workers"].value() == 1


@pytest.mark.parametrize(
    ("text", "why"),
    [
        pytest.param("a 1", "newline", id="no-final-newline"),
        pytest.param("1a 1\n", "bad metric name", id="bad-name"),
        pytest.param('a{__x="1"} 1\n', "reserved", id="reserved-label"),
        pytest.param('a{x="\\t"} 1\n', "bad escape", id="bad-escape"),
        pytest.param("a one\n", "not a value", id="bad-value"),
        pytest.param("a 1\nb 1\na 2\n", "one group", id="split-family"),
        pytest.param("a 1\na 2\n", "twice", id="repeated-series"),
        pytest.param("a 1\n# TYPE a counter\n", "after its samples", id="late-type"),
        pytest.param("# TYPE a counter\na -1\n", "negative", id="negative-counter"),
        pytest.param(
            '# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 1\n',
            "cumulative",
            id="histogram-not-cumulative",
        ),
        pytest.param(
            '# TYPE h histogram\nh_bucket{le="1"} 1\nh_sum 1\nh_count 1\n',
            r"\+Inf",
            id="histogram-without-inf",
        ),
    ],
)
def test_the_parser_refuses_what_the_format_forbids(text: str, why: str) -> None:
    with pytest.raises(ExpositionError, match=why):
        parse(text)


async def _scrape(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer


def test_the_http_endpoint_serves_the_exposition_and_refuses_other_paths() -> None:
    registry = Registry()
    registry.counter("loopd_requests_total", "Requests.").inc(5)

    async def scenario() -> tuple[bytes, bytes]:
        server = await serve_metrics(asyncio.get_running_loop(), "127.0.0.1:0", registry.render)
        port = server.sockets[0].getsockname()[1]
        try:
            good = await _scrape(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            missing = await _scrape(port, b"GET /nope HTTP/1.1\r\n\r\n")
        finally:
            server.close()
            await server.wait_closed()
        return good, missing

    good, missing = asyncio.run(scenario())
    head, _, body = good.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"text/plain; version=0.0.4" in head
    assert parse(body.decode())["loopd_requests_total"].value() == 5
    assert missing.startswith(b"HTTP/1.1 404")


@pytest.mark.parametrize("text", ["9464", "host:", "127.0.0.1:70000"])
def test_a_bad_listen_address_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_listen(text)


def test_worker_counters_survive_the_worker_and_add_across_workers() -> None:
    states = ["RUNNING", "IDLE", "IDLE"]
    metrics = DaemonMetrics(lambda: states, lambda: [1000, 2000], ["RUNNING", "IDLE", "FATAL"])
    first = WorkerStats(requests=3, bytes_written=300)
    first.fsync.observe(0.002)
    metrics.on_report("a", first.snapshot())
    metrics.on_worker_gone("a")  # hibernated: its counts are kept
    second = WorkerStats(requests=2, bytes_written=50)
    second.fsync.observe(0.02)
    metrics.on_report("b", second.snapshot())
    metrics.restarts += 1
    families = parse(metrics.render())
    assert families["loopd_requests_total"].value() == 5
    assert families["loopd_appended_bytes_total"].value() == 350
    assert families["loopd_fsync_seconds"].total("_count") == 2
    assert families["loopd_restarts_total"].value() == 1
    assert families["loopd_sessions"].value(state="IDLE") == 2
    assert families["loopd_sessions"].value(state="FATAL") == 0
    assert families["loopd_live_workers"].value() == 2
    assert families["loopd_workers_rss_bytes"].value() == 3000
    assert families["loopd_supervisor_rss_bytes"].value() > 0


def test_requests_tokens_and_latency_are_counted_by_app_and_survive_each_worker() -> None:
    """By App (its target, or "default"), never by session: a hibernated worker's counts
    stay with its App; tokens are the Usage records' as the workers reported them."""
    metrics = DaemonMetrics(lambda: [], lambda: [], ["RUNNING"])
    first = WorkerStats(requests=3, prompt_tokens=100, completion_tokens=10,
                        errors={"NotDue": 2})  # fmt: skip
    first.request_latency.observe(0.01)
    metrics.on_report("a", first.snapshot(), "agents:make")
    metrics.on_worker_gone("a")
    second = WorkerStats(requests=2, prompt_tokens=7, completion_tokens=3,
                         errors={"NotDue": 1, "key_expired": 4})  # fmt: skip
    second.request_latency.observe(0.2)
    metrics.on_report("b", second.snapshot(), "agents:make")
    metrics.on_report("c", WorkerStats(requests=4, prompt_tokens=1).snapshot())
    families = parse(metrics.render())
    assert families["loopd_app_requests_total"].value(app="agents:make") == 5
    assert families["loopd_app_requests_total"].value(app="default") == 4
    tokens = families["loopd_app_tokens_total"]
    assert tokens.value(app="agents:make", kind="prompt") == 107
    assert tokens.value(app="agents:make", kind="completion") == 13
    assert tokens.value(app="default", kind="prompt") == 1
    assert families["loopd_tokens_total"].value(kind="prompt") == 108
    latency = families["loopd_app_request_seconds"]
    counts = {s.labels["app"]: s.value for s in latency.samples if s.name.endswith("_count")}
    assert counts == {"agents:make": 2, "default": 0}
    refused = families["loopd_app_request_errors_total"]
    assert refused.value(app="agents:make", code="NotDue") == 3
    assert refused.value(app="agents:make", code="key_expired") == 4
    assert families["loopd_request_errors_total"].value(code="NotDue") == 3
    assert families["loopd_requests_total"].value() == 9  # the unlabelled totals, as before
    labels = {k for f in families.values() for sample in f.samples for k in sample.labels}
    assert labels <= {"app", "kind", "state", "le", "code"}  # none names a session


def test_a_worker_counts_the_tokens_of_the_usage_records_it_made_durable(tmp_path: Path) -> None:

    app = DefaultApp()
    STATS.reset()
    with Session.create(tmp_path, "s", app.initial_baseline("s")) as session:
        session.append(Usage(prompt_tokens=40, completion_tokens=2, context_tokens=42))
        session.append(Usage(prompt_tokens=5, completion_tokens=1, context_tokens=48))
    assert (STATS.prompt_tokens, STATS.completion_tokens) == (45, 3)
    assert STATS.snapshot()["prompt_tokens"] == 45
    STATS.reset()


def test_a_refused_request_is_counted_by_its_code() -> None:
    STATS.reset()
    reply = error_reply(7, KeyExpired("k1", 3, 5))
    assert reply["error"]["code"] == "key_expired"  # type: ignore[index]
    assert STATS.snapshot()["errors"] == {"key_expired": 1}
    STATS.reset()
