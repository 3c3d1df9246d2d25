"""Prometheus metrics, in one registry that the HTTP service exposes at ``/metrics``.

Ingestion and consistency checks set these gauges as they run; the service only has to
serve :data:`REGISTRY`.

Example::

    from prometheus_client import generate_latest
    print(generate_latest(REGISTRY).decode())
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["REGISTRY", "INDEX_DRIFT_CHUNKS", "INDEX_LAST_SUCCESS", "REINDEX_RUNS", "CHUNKS_EMBEDDED",
           "INJECTION_QUESTIONS", "INJECTION_BLOCKS", "INJECTION_CHUNKS", "INJECTION_RULES",
           "INJECTION_HISTORY_DROPPED"]

REGISTRY = CollectorRegistry(auto_describe=True)

INDEX_DRIFT_CHUNKS = Gauge(
    "index_drift_chunks",
    "Chunks that differ between the state database and an index at the last verify "
    "(missing plus extra), per index.",
    ["index"],
    registry=REGISTRY,
)
INDEX_LAST_SUCCESS = Gauge(
    "index_last_success_timestamp",
    "Unix time of the last reindex of a source that completed without errors.",
    ["source"],
    registry=REGISTRY,
)
REINDEX_RUNS = Counter(
    "reindex_runs",
    "Reindex runs by source, mode and outcome (ok, partial, error).",
    ["source", "mode", "status"],
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
