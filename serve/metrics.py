"""The service's Prometheus metrics, in :data:`rag.metrics.REGISTRY` beside the ingest gauges.

- ``http_requests_total{route,method,status}`` and ``http_request_seconds{route}``: every
  request, labelled by its route template (``/v1/documents/{doc_id}``), not its path.
- ``answer_stage_seconds{stage}``: embed, retrieve, rerank, generate and total, per answer.
- ``answer_ttft_seconds``, ``answer_tokens_per_second``, ``answers_total{route,outcome}``,
  ``answers_degraded_total`` and ``streams_running``.
- ``answer_cache_lookups_total{result}``: answer cache lookups by result, ``hit`` (the same
  question), ``semantic`` (a near-identical one) or ``miss``; none when the cache is off or skipped.
- The answer cache's freshness and health (counted by :mod:`rag.cache_stores`, defined in
  :mod:`rag.metrics`): ``answer_cache_dropped_total`` (answers built from passages a reindex
  changed or removed, and purges), ``answer_cache_rechecks_total{result}`` (``kept``,
  ``stale``: answers checked again after their sources gained documents) and
  ``answer_cache_errors_total{op}`` (its Redis unreachable: the answer went on without it).
- Prompt-injection screening (counted by :mod:`rag.injection`, defined in :mod:`rag.metrics`):
  ``injection_questions_total{verdict}``, ``injection_question_blocks_total{rule}``,
  ``injection_chunks_total{action}`` (excluded, quoted), ``injection_rule_matches_total{target,rule}``
  and ``injection_history_turns_dropped_total``.

P99 comes from the histograms, e.g.
``histogram_quantile(0.99, sum by (le) (rate(answer_stage_seconds_bucket{stage="total"}[5m])))``.
With ``ragqa serve --workers N`` a scrape of any worker sums every worker's metrics
(:mod:`serve.metrics_scrape`), which also adds ``freshness_lag_seconds{source}`` and
``index_drift_chunks{index}`` read from the state database.

Example::

    app.add_middleware(RequestMetrics)
    observe_answer("chat", done_event)
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.answer import AnswerEvent
from rag.metrics import REGISTRY

__all__ = ["RequestMetrics", "observe_answer", "STREAMS_RUNNING", "ANSWERS"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

HTTP_REQUESTS = Counter("http_requests", "HTTP requests by route template, method and status.",
                        ["route", "method", "status"], registry=REGISTRY)
HTTP_SECONDS = Histogram("http_request_seconds", "Time to answer a request (a stream: until it ends), by route.",
                         ["route"], buckets=_LATENCY, registry=REGISTRY)
STAGE_SECONDS = Histogram("answer_stage_seconds", "Time spent per answer stage: embed, retrieve, rerank, "
                          "generate, total.", ["stage"], buckets=_LATENCY, registry=REGISTRY)
TTFT_SECONDS = Histogram("answer_ttft_seconds", "Time from the question to the first answer token.",
                         buckets=_LATENCY, registry=REGISTRY)
TOKENS_PER_SECOND = Histogram("answer_tokens_per_second", "Generation speed of an answer, in completion tokens/s.",
                              buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000), registry=REGISTRY)
ANSWERS = Counter("answers", "Answers by route and outcome (ok, error).", ["route", "outcome"], registry=REGISTRY)
DEGRADED = Counter("answers_degraded", "Answers flagged degraded: a retrieval leg or the generator was down.",
                   registry=REGISTRY)
CACHE_LOOKUPS = Counter("answer_cache_lookups", "Answer cache lookups by result: hit, semantic, miss.",
                        ["result"], registry=REGISTRY)
for _result in ("hit", "semantic", "miss"):  # exported at 0 from the start, also with several workers
    CACHE_LOOKUPS.labels(_result)
STREAMS_RUNNING = Gauge("streams_running", "Streamed generations running now.", registry=REGISTRY,
                        multiprocess_mode="livesum")

# Answer timings keys (milliseconds) -> stage label.
STAGES = {"embed_ms": "embed", "retrieve_ms": "retrieve", "rerank_ms": "rerank", "generate_ms": "generate",
          "total_ms": "total"}


def observe_answer(route: str, event: AnswerEvent) -> None:
    """Record a finished answer (its ``done`` or ``error`` event)."""
    if event.kind == "error":
        ANSWERS.labels(route, "error").inc()
        return
    ANSWERS.labels(route, "ok").inc()
    if event.cache is not None:
        CACHE_LOOKUPS.labels(event.cache).inc()
    for key, stage in STAGES.items():
        if key in event.timings:
            STAGE_SECONDS.labels(stage).observe(event.timings[key] / 1000)
    if "ttft_ms" in event.timings:
        TTFT_SECONDS.observe(event.timings["ttft_ms"] / 1000)
    tokens, gen_s = event.usage.get("completion_tokens", 0), event.timings.get("generate_ms", 0) / 1000
    if tokens and gen_s > 0:
        TOKENS_PER_SECOND.observe(tokens / gen_s)
    if event.degraded:
        DEGRADED.inc()


class RequestMetrics:
    """ASGI middleware counting requests per route template and status, and timing them."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute] = ()) -> None:
        self.app = app
        self.routes = routes  # to label requests refused before routing (a 413)

    def _route(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is None:
            route = next((r for r in self.routes if r.matches(scope)[0] != Match.NONE), None)
        return getattr(route, "path", None) or "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = self._route(scope)
            HTTP_REQUESTS.labels(route, scope["method"], str(status)).inc()
            HTTP_SECONDS.labels(route).observe(time.perf_counter() - started)
