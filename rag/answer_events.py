"""The events a streamed answer is made of (:class:`AnswerEvent`), and the small functions
that build and judge them: a cached answer replayed as events, timings, confidence, the
model's and the inferred citations, whether an answer abstained or may be cached.

Example::

    done = AnswerEvent("done", finish_reason="stop", usage={"completion_tokens": 12})
    assert not abstained("Paris [1].") and abstained("I don't know.")
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rag import metrics as M
from rag.attribution import Attributor
from rag.cache import Lookup
from rag.injection import Screening
from rag.packing import PackedContext
from rag.prompts import UNKNOWN
from rag.types import Citation

_ABSTAIN = re.compile(r"\bi (?:do not|don't|cannot|can't) (?:know|answer)\b|\bthe (?:documents|context|passages) "
                      r"(?:do|does) not (?:say|contain|mention)|我不知道|无法回答|没有相关信息|文档中没有")

__all__ = ["AnswerEvent", "abstained", "confident", "replay", "with_lookup", "cacheable", "finish_timings",
           "with_inferred", "confidence_of", "attribution_counts", "observe_profile", "reason_label",
           "shown_confidence", "answer_id", "prepend"]


@dataclass(slots=True)
class AnswerEvent:
    """One step of a streamed answer (see :mod:`rag.answer` for their order)."""

    kind: Literal["sources", "delta", "done", "error"]
    text: str = ""
    citations: tuple[Citation, ...] = ()
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    degraded: bool = False  # a retrieval leg or the generator was down: see ``warnings``
    warnings: tuple[str, ...] = ()  # on sources/done/error: what was missing, in words
    fallback: bool = False  # the generator was down and the answer is extractive
    error: str | None = None
    cache: str | None = None  # on sources/done: hit | semantic | miss; None when not looked up
    screening: Screening | None = None  # on ``done``: the question's verdict, passages excluded or quoted
    attribution: dict[str, int] = field(default_factory=dict)  # on ``done``: sentences labelled by inference, unsupported
    versions: dict[str, Any] | None = None  # on sources/done: profile, model, quantization, prompt_version, route, arm
    answer_id: str | None = None  # on ``done``: this response's answer (feedback names it); new on every answer
    confidence: dict[str, float] = field(default_factory=dict)  # on ``done``: logprob, min_logprob (generator's)


def confident(confidence: Mapping[str, float], threshold: float | None) -> bool:
    """Whether an answer's ``confidence`` (its ``done`` event's) reaches ``routing.min_confidence``:
    always without a threshold, and when the generator reports no log-probability (the
    extractive answerer: only abstaining and citing are checked)."""
    value = confidence.get("logprob")
    return threshold is None or value is None or value >= threshold


def abstained(text: str) -> bool:
    """Whether an answer says it does not know: the template's sentence in either language, or
    any common wording of it ("I cannot answer", "the context does not say", "无法回答").

    The one test for the cascade, the experiments' metrics and the evaluation's abstention rate.
    """
    folded = " ".join(text.split()).casefold().replace("’", "'")
    return any(u.casefold() in folded for u in UNKNOWN.values()) or bool(_ABSTAIN.search(folded))


_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def reason_label(reason: str) -> str:
    """A router reason as a metric label: its words before any parenthesis, numbers as N (bounded)."""
    return _NUMBER.sub("N", reason.split(" (")[0])[:80]


def observe_profile(profile: str, timings: Mapping[str, float], usage: Mapping[str, int]) -> None:
    M.PROFILE_REQUESTS.labels(profile, "ok").inc()
    if "ttft_ms" in timings:
        M.PROFILE_TTFT.labels(profile).observe(timings["ttft_ms"] / 1000)
    for kind in ("prompt", "completion"):
        if usage.get(f"{kind}_tokens"):
            M.PROFILE_TOKENS.labels(profile, kind).inc(usage[f"{kind}_tokens"])


def with_inferred(cited: Sequence[Citation], infer: Attributor | None,
                   packed: PackedContext) -> tuple[Citation, ...]:
    """The model's citations, then those only inferred (``inferred=True``), each label once."""
    out = list(cited)
    if infer is not None:
        have = {c.label for c in out}
        out += [replace(packed.citations[n], inferred=True) for n in infer.inferred
                if n not in have and n in packed.citations]
    return tuple(out)


def shown_confidence(event: AnswerEvent | None) -> str:
    value = (event.confidence if event is not None else {}).get("logprob")
    return "unknown" if value is None else f"{value:.3f}"


def confidence_of(final: Any) -> dict[str, float]:
    """The final delta's log-probabilities, those it has."""
    if final is None:
        return {}
    return {k: v for k in ("logprob", "min_logprob") if (v := getattr(final, k, None)) is not None}


def attribution_counts(infer: Attributor | None) -> dict[str, int]:
    if infer is None:
        return {}
    return {"inferred": infer.attributed, "unsupported": infer.unsupported}


async def prepend(first: AnswerEvent, rest: AsyncIterator[AnswerEvent]) -> AsyncIterator[AnswerEvent]:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


def replay(lookup: Lookup, started: float) -> list[AnswerEvent]:
    """A cached answer as the events of a generated one, with the versions it was made with."""
    answer = lookup.answer
    assert answer is not None
    timings = {**lookup.timings, "total_ms": (time.perf_counter() - started) * 1000}
    versions = dict(answer.versions) or None
    M.PROFILE_REQUESTS.labels(str((versions or {}).get("profile")), "cached").inc()
    return [AnswerEvent("sources", citations=answer.sources, cache=lookup.kind, versions=versions),
            AnswerEvent("delta", text=answer.text),
            AnswerEvent("done", citations=answer.citations, finish_reason=answer.finish_reason,
                        usage=dict(answer.usage), timings={k: round(v, 2) for k, v in timings.items()},
                        cache=lookup.kind, versions=versions, answer_id=answer_id())]


def answer_id() -> str:
    return f"ans-{uuid.uuid4().hex}"


def with_lookup(timings: dict[str, float], lookup: Lookup) -> dict[str, float]:
    """A generated answer's timings, counting the cache lookup before it."""
    spent = lookup.timings.get("cache_ms", 0.0)
    out = {**timings, "cache_ms": spent}
    for key in ("ttft_ms", "total_ms"):
        if key in out:
            out[key] += spent
    return {k: round(v, 2) for k, v in out.items()}


def cacheable(done: AnswerEvent, parts: list[str]) -> bool:
    """Only complete answers are cached: not cut short, not degraded, not refused, not empty."""
    screening = getattr(done, "screening", None)
    blocked = screening is not None and getattr(getattr(screening, "question", None), "blocked", False)
    return done.finish_reason == "stop" and not done.degraded and not blocked and bool("".join(parts).strip())


def finish_timings(timings: dict[str, float], started: float, gen_started: float) -> dict[str, float]:
    now = time.perf_counter()
    out = {**timings, "generate_ms": (now - gen_started) * 1000, "total_ms": (now - started) * 1000}
    return {k: round(v, 2) for k, v in out.items()}
