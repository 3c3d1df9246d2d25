"""Prometheus metrics, in one registry that the HTTP service exposes at ``/metrics``.

Ingestion and consistency checks set these gauges as they run; the service only has to
serve :data:`REGISTRY`.

Example::

    from prometheus_client import generate_latest
    print(generate_latest(REGISTRY).decode())
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["REGISTRY", "INDEX_DRIFT_CHUNKS", "DRIFT_META", "GpuMemoryCollector", "INDEX_LAST_SUCCESS", "REINDEX_RUNS", "DELETIONS_REFUSED", "CHUNKS_EMBEDDED",
           "INJECTION_QUESTIONS", "INJECTION_BLOCKS", "INJECTION_CHUNKS", "INJECTION_RULES",
           "INJECTION_HISTORY_DROPPED", "CACHE_DROPPED", "CACHE_RECHECKS", "CACHE_ERRORS", "RETRIEVAL_LEG_DOWN", "ANSWERS_IN_FLIGHT", "ANSWERS_QUEUED", "ANSWERS_REJECTED",
           "PROFILE_REQUESTS", "PROFILE_TTFT", "PROFILE_TOKENS", "ROUTER_DECISIONS"]

REGISTRY = CollectorRegistry(auto_describe=True)

INDEX_DRIFT_CHUNKS = Gauge(
    "index_drift_chunks",
    "Chunks that differ between the state database and an index at the last verify "
    "(missing plus extra), per index.",
    ["index"],
    registry=REGISTRY,
    multiprocess_mode="mostrecent",
)
DRIFT_META = "index_drift"
"""The state's meta key where verify keeps its last drift per index (``/metrics`` reads it)."""
INDEX_LAST_SUCCESS = Gauge(
    "index_last_success_timestamp",
    "Unix time of the last reindex of a source that completed without errors.",
    ["source"],
    registry=REGISTRY,
    multiprocess_mode="max",
)
REINDEX_RUNS = Counter(
    "reindex_runs",
    "Reindex runs by source, mode and outcome (ok, partial, error).",
    ["source", "mode", "status"],
    registry=REGISTRY,
)
DELETIONS_REFUSED = Counter(
    "reindex_deletions_refused",
    "Documents a reindex would have deleted but kept, because the run would have deleted more than "
    "crawl.max_delete_fraction of its source.",
    ["source"],
    registry=REGISTRY,
)
CRAWL_ERRORS = Counter(
    "crawl_errors",
    "Pages or files a reindex could not read, by source and kind (timeout, slow, connection, http, "
    "too_large, redirects, robots, unreadable, no_text, io). Each counts once per run and URL.",
    ["source", "kind"],
    registry=REGISTRY,
)
CHUNKS_EMBEDDED = Counter(
    "chunks_embedded",
    "Chunks embedded by reindex runs (reused vectors are not counted).",
    ["source"],
    registry=REGISTRY,
)

# Prompt-injection screening (rag/injection.py), counted where the answerer screens.
INJECTION_QUESTIONS = Counter(
    "injection_questions", "Questions screened, by verdict (allowed, suspicious, blocked).",
    ["verdict"], registry=REGISTRY)
INJECTION_BLOCKS = Counter(
    "injection_question_blocks",
    "Blocked questions by rule (a question matching two rules counts under both).",
    ["rule"], registry=REGISTRY)
INJECTION_CHUNKS = Counter(
    "injection_chunks",
    "Retrieved passages that screening excluded from the context, or kept as quoted data.",
    ["action"], registry=REGISTRY)
INJECTION_RULES = Counter(
    "injection_rule_matches", "Injection rule matches by target (question, chunk) and rule.",
    ["target", "rule"], registry=REGISTRY)
INJECTION_HISTORY_DROPPED = Counter(
    "injection_history_turns_dropped",
    "Earlier conversation turns left out of a prompt because a question would be blocked for them.",
    registry=REGISTRY)


class GpuMemoryCollector:
    """``gpu_memory_used_bytes{device}`` and ``gpu_memory_total_bytes{device}`` when a GPU is present.

    Reads NVML (``nvidia-ml-py``) when it is installed, else ``torch.cuda.mem_get_info`` when
    torch is already loaded in this process (it is never imported just for this). Without a
    GPU the families are simply absent, so a CPU deployment exports nothing for them.
    """

    def collect(self):  # prometheus_client's collector interface
        from prometheus_client.core import GaugeMetricFamily

        readings = _gpu_memory()
        if not readings:
            return
        used = GaugeMetricFamily("gpu_memory_used_bytes", "GPU memory in use, per device", labels=["device"])
        total = GaugeMetricFamily("gpu_memory_total_bytes", "GPU memory size, per device", labels=["device"])
        for device, (in_use, size) in readings.items():
            used.add_metric([device], in_use)
            total.add_metric([device], size)
        yield used
        yield total


def _gpu_memory() -> dict[str, tuple[float, float]]:
    import sys

    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        out = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i))
            out[str(i)] = (float(info.used), float(info.total))
        return out
    except Exception:  # noqa: BLE001 - no NVML, no driver or no GPU: try torch
        pass
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            out = {}
            for i in range(torch.cuda.device_count()):
                free, size = torch.cuda.mem_get_info(i)
                out[str(i)] = (float(size - free), float(size))
            return out
    except Exception:  # noqa: BLE001 - a broken CUDA setup must not break /metrics
        return {}
    return {}


REGISTRY.register(GpuMemoryCollector())

RETRIEVAL_LEG_DOWN = Counter(
    "retrieval_leg_down",
    "Queries answered without one retrieval leg (lexical, vector, rerank) because its backend failed or "
    "was skipped after failing; the answers were flagged degraded.",
    ["leg"],
    registry=REGISTRY,
)
for _leg in ("lexical", "vector", "rerank"):  # exported at 0 from the start, so rate() sees the first one
    RETRIEVAL_LEG_DOWN.labels(_leg)

# Admission control (rag/admission.py)
# With several workers a scrape sums the live processes' values (serve/metrics_scrape.py).
ANSWERS_IN_FLIGHT = Gauge("answers_in_flight", "Answers being retrieved and generated now.",
                          registry=REGISTRY, multiprocess_mode="livesum")
ANSWERS_QUEUED = Gauge("answers_queued", "Questions waiting for an answer slot.", registry=REGISTRY,
                       multiprocess_mode="livesum")
ANSWERS_REJECTED = Counter(
    "answers_rejected",
    "Questions refused with 503 because every answer slot was taken and the queue was full.",
    registry=REGISTRY,
)
ANSWERS_REJECTED_GLOBAL = Counter(
    "answers_rejected_global",
    "Questions refused with 503 because serve.max_in_flight_global answers were being generated across "
    "every worker and instance.",
    registry=REGISTRY,
)
ADMISSION_GLOBAL_SKIPPED = Counter(
    "admission_global_skipped",
    "Answers admitted without the global bound because its Redis was unreachable (each worker's own bound "
    "still held).",
    registry=REGISTRY,
)

# The answer cache's stores (rag/cache_stores.py); lookups by result are counted by the service.
CONVERSATION_STORE_FALLBACKS = Counter(
    "conversation_store_fallbacks",
    "Conversation reads or writes served from the worker's own copy because Redis was unavailable.",
    ["op"], registry=REGISTRY)
STREAM_STORE_FALLBACKS = Counter(
    "stream_store_fallbacks",
    "Streams kept in a worker's memory because the stream store (Redis) was unavailable, by when: at the "
    "start (resumable on that worker only) or mid-stream (the rest of the events on that worker).",
    ["when"], registry=REGISTRY)
CACHE_DROPPED = Counter(
    "answer_cache_dropped",
    "Cached answers dropped because a reindex changed or removed text they were built from, or a purge.",
    registry=REGISTRY,
)
CACHE_RECHECKS = Counter(
    "answer_cache_rechecks",
    "Cached answers checked again after their sources gained documents, by result: kept (the same "
    "context is retrieved), stale (answered afresh).",
    ["result"],
    registry=REGISTRY,
)
for _result in ("kept", "stale"):
    CACHE_RECHECKS.labels(_result)
CACHE_ERRORS = Counter(
    "answer_cache_errors",
    "Answer cache operations that failed because its store was unreachable, by operation; the "
    "answer went on without the cache.",
    ["op"],
    registry=REGISTRY,
)

# Generator profiles and the router (rag/answer.py, rag/routing.py; docs/profiles.md)
_PROFILE_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
PROFILE_REQUESTS = Counter(
    "profile_requests",
    "Answers by the generator profile that wrote them (extractive: the last fallback) and outcome: ok, "
    "error, cached (replayed from the answer cache).",
    ["profile", "outcome"], registry=REGISTRY)
PROFILE_TTFT = Histogram(
    "profile_ttft_seconds", "Time from the question to the first answer token, per generator profile.",
    ["profile"], buckets=_PROFILE_LATENCY, registry=REGISTRY)
PROFILE_TOKENS = Counter(
    "profile_tokens", "Tokens read (prompt) and written (completion) per generator profile.",
    ["profile", "kind"], registry=REGISTRY)
ROUTER_DECISIONS = Counter(
    "router_decisions",
    "Profiles chosen per request and why: the router's rule (numbers left out), forced (the request named "
    "it), experiment, routing off, cascade (first try), or cascade escalation (abstained, uncited).",
    ["profile", "reason"], registry=REGISTRY)
