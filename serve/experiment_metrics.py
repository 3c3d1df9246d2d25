"""Per-arm metrics of an online experiment, so an operator can compare the arms live.

All labelled ``experiment`` and ``arm`` (answers outside any experiment are not counted here;
feedback on them is, under ``none``):

- ``experiment_answers_total{experiment,arm,cache}``: answers, by answer cache result;
- ``experiment_answer_seconds``, ``experiment_ttft_seconds`` and
  ``experiment_tokens_per_second``: whole-answer time, time to the first token and generation
  speed, of generated answers (a cache hit says nothing about its arm's generator);
- ``experiment_abstentions_total``: answers that said they do not know;
- ``experiment_cited_answers_total``: answers citing at least one passage. Citation compliance
  is ``sum by (arm) (rate(experiment_cited_answers_total[1h])) /
  sum by (arm) (rate(experiment_answers_total[1h]))``;
- ``experiment_feedback_total{experiment,arm,rating}``: thumbs up and down (``POST /v1/feedback``).

Example::

    record = answer_record("ask", done_event, text, assignment_fields, answer_id)
    observe_record(record)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Histogram

from rag.answer import AnswerEvent, abstained
from rag.metrics import REGISTRY

__all__ = ["answer_record", "observe_record", "observe_feedback"]

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_LABELS = ["experiment", "arm"]

ANSWERS = Counter("experiment_answers", "Answers per experiment arm, by answer cache result (hit, semantic, miss).",
                  [*_LABELS, "cache"], registry=REGISTRY)
SECONDS = Histogram("experiment_answer_seconds", "Whole-answer time of generated answers, per experiment arm.",
                    _LABELS, buckets=_LATENCY, registry=REGISTRY)
TTFT = Histogram("experiment_ttft_seconds", "Time to the first token of generated answers, per experiment arm.",
                 _LABELS, buckets=_LATENCY, registry=REGISTRY)
TOKENS_PER_SECOND = Histogram("experiment_tokens_per_second", "Generation speed (completion tokens/s), per arm.",
                              _LABELS, buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000), registry=REGISTRY)
ABSTENTIONS = Counter("experiment_abstentions", "Answers that said the documents do not say, per experiment arm.",
                      _LABELS, registry=REGISTRY)
CITED = Counter("experiment_cited_answers", "Answers citing at least one passage, per experiment arm.",
                _LABELS, registry=REGISTRY)
FEEDBACK = Counter("experiment_feedback", "User feedback (up, down) per experiment arm; 'none' outside experiments.",
                   [*_LABELS, "rating"], registry=REGISTRY)

def answer_record(route: str, done: AnswerEvent, text: str, assignment: Mapping[str, Any],
                  answer_id: str) -> dict[str, Any]:
    """The record of one finished answer (see :mod:`rag.feedback`): versions, arm, the figures arms
    are compared on."""
    tokens, gen_s = done.usage.get("completion_tokens", 0), done.timings.get("generate_ms", 0) / 1000
    versions = done.versions
    return {"answer_id": answer_id, "time": time.time(), "route": route,
            "experiment": assignment.get("experiment"), "arm": assignment.get("arm"),
            "pinned": bool(assignment.get("pinned")), "caller": assignment.get("caller"), "versions": dict(versions) if versions else None,
            "cache": done.cache or "miss", "degraded": done.degraded, "total_ms": done.timings.get("total_ms"),
            "ttft_ms": done.timings.get("ttft_ms"),
            "tokens_per_s": round(tokens / gen_s, 2) if tokens and gen_s > 0 else None,
            "abstained": abstained(text), "cited": bool(done.citations)}


def observe_record(record: Mapping[str, Any]) -> None:
    """Count an answer's record in its arm's metrics (nothing outside an experiment)."""
    if not record.get("experiment"):
        return
    labels = (record["experiment"], record["arm"] or "none")
    ANSWERS.labels(*labels, record["cache"]).inc()
    if record["abstained"]:
        ABSTENTIONS.labels(*labels).inc()
    if record["cited"]:
        CITED.labels(*labels).inc()
    if record["cache"] != "miss":
        return
    if record["total_ms"] is not None:
        SECONDS.labels(*labels).observe(record["total_ms"] / 1000)
    if record["ttft_ms"] is not None:
        TTFT.labels(*labels).observe(record["ttft_ms"] / 1000)
    if record["tokens_per_s"] is not None:
        TOKENS_PER_SECOND.labels(*labels).observe(record["tokens_per_s"])


def observe_feedback(feedback: Mapping[str, Any]) -> None:
    FEEDBACK.labels(feedback.get("experiment") or "none", feedback.get("arm") or "none", feedback["rating"]).inc()
