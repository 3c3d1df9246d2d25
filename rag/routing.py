"""Request-level routing: a small or a large generator profile per question, from cheap signals.

Before generation the router reads signals that cost almost nothing, all known once retrieval
and packing are done (:func:`route_signals`):

* ``kind``: the question kind of :func:`rag.sampling.classify_question` (factual, creative, open);
* ``lang`` and ``question_tokens`` (words, each Chinese character counting as one);
* ``top_score`` and ``margin``: the top hit's score and its lead over the next hit's;
* ``agreement``: the overlap of the BM25 and vector legs' top :data:`AGREEMENT_DEPTH` (0..1);
* ``chunks``: how many passages were packed for the answer; ``turn``: the conversation turn.

With ``routing.mode = "rules"`` a question goes to ``routing.small`` only when every rule of
:class:`rag.config.RouterRules` holds, and otherwise to ``routing.large``, the reason naming
the first rule that failed. The defaults, fitted on XQuAD-en, XQuAD-zh and RGB-zh with
``ragqa eval fit-router`` (evals/fit_router.py, evals/RESULTS-profiles.md), send short factual
or open questions on the first turn, whose top hit is first in both retrieval legs and whose
legs agree on two of their top five, answered from one passage, to the small profile; creative
or long questions, weaker or disputed retrievals, answers that need several passages and later
turns of a conversation go to the large one. Held out, they put about a quarter of those
questions on the packaged 0.5B model for 2.4 F1 points below the 1.5B alone: refit them on your
own questions.

``mode = "off"`` always answers with the large profile, and ``"cascade"`` starts every question
on the small one (the answerer escalates an abstaining or uncited answer, or one whose confidence
is below ``routing.min_confidence``, to the large one: :mod:`rag.answer`).

Example::

    signals = route_signals("When was the treaty signed?", lang="en", hits=hits, legs=None,
                            packed_chunks=1, turn=1)
    decision = Router(settings.routing).decide(signals)
    decision.profile, decision.reason    # ("small", "small: every rule holds (factual, 5 tokens, ...)")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import regex

from rag.sampling import classify_question
from rag.text import HAN, HAN_CLASS
from rag.types import Hit

if TYPE_CHECKING:
    from rag.config import RouterRules, RoutingSettings

__all__ = ["AGREEMENT_DEPTH", "Decision", "RouteSignals", "Router", "agreement", "question_tokens",
           "route_signals"]

AGREEMENT_DEPTH = 5
"""How many of each leg's top hits ``agreement`` compares."""

_TOKEN = regex.compile(rf"{HAN_CLASS}|[^\W_]+")


@dataclass(frozen=True)
class RouteSignals:
    """What the router decides from; every field is known before generation starts."""

    kind: str
    lang: str
    question_tokens: int
    top_score: float
    margin: float
    agreement: float
    chunks: int
    turn: int


@dataclass(frozen=True)
class Decision:
    """The profile to answer with and why, in words (logged and returned with the answer)."""

    profile: str
    reason: str
    signals: RouteSignals | None = None


def question_tokens(question: str) -> int:
    """Words in ``question``, each CJK character counting as one (a length signal, not a tokenizer)."""
    count = 0
    for match in _TOKEN.finditer(question):
        token = match.group(0)
        count += len(HAN.findall(token)) or 1
    return count


def agreement(hits: Sequence[Hit], legs: Mapping[str, Sequence[str]] | None = None,
              depth: int = AGREEMENT_DEPTH) -> float:
    """The share of the top ``depth`` that the BM25 and vector legs have in common (0..1).

    ``legs`` maps ``"bm25"`` and ``"vector"`` to each leg's chunk ids, best first. Without it the
    legs are read from the hits' ``explain`` ranks (``bm25_rank``, ``vector_rank``), which the
    ``rrf`` mode records. A mode with one leg (``bm25``, ``vector``) has no agreement: 0.0.
    """
    if legs is not None:
        bm25 = list(legs.get("bm25") or ())[:depth]
        vector = list(legs.get("vector") or ())[:depth]
    else:
        bm25 = [h.chunk_id for h in hits if 0 < h.explain.get("bm25_rank", 0) <= depth]
        vector = [h.chunk_id for h in hits if 0 < h.explain.get("vector_rank", 0) <= depth]
    if not bm25 or not vector:
        return 0.0
    return round(len(set(bm25) & set(vector)) / min(depth, max(len(bm25), len(vector))), 4)


def route_signals(question: str, *, lang: str, hits: Sequence[Hit], legs: Mapping[str, Sequence[str]] | None,
                  packed_chunks: int, turn: int) -> RouteSignals:
    """The router's signals for one question, from its retrieval (best hit first) and packing."""
    top = float(hits[0].score) if hits else 0.0
    second = float(hits[1].score) if len(hits) > 1 else 0.0
    return RouteSignals(
        kind=classify_question(question), lang=lang, question_tokens=question_tokens(question),
        top_score=top, margin=max(0.0, top - second), agreement=agreement(hits, legs),
        chunks=int(packed_chunks), turn=max(1, int(turn)))


def failed_rule(rules: RouterRules, s: RouteSignals) -> str | None:
    """The first rule of ``rules`` that ``s`` breaks, in words; ``None`` when every rule holds."""
    if s.kind not in rules.small_kinds:
        return f"{s.kind} question (small answers {', '.join(rules.small_kinds) or 'none'})"
    if s.question_tokens > rules.max_question_tokens:
        return f"{s.question_tokens} tokens > {rules.max_question_tokens}"
    if s.top_score < rules.min_top_score:
        return f"top score {s.top_score:.4g} < {rules.min_top_score:.4g}"
    if s.margin < rules.min_margin:
        return f"margin {s.margin:.4g} < {rules.min_margin:.4g}"
    if s.agreement < rules.min_agreement:
        return f"leg agreement {s.agreement:.2f} < {rules.min_agreement:.2f}"
    if s.chunks > rules.max_chunks:
        return f"{s.chunks} passages > {rules.max_chunks}"
    if s.turn > rules.max_turn:
        return f"turn {s.turn} > {rules.max_turn}"
    return None


class Router:
    """Chooses a generator profile per question from its :class:`RouteSignals`.

    Example::

        router = Router(RoutingSettings(mode="rules"))
        router.decide(signals).profile       # "small" or "default"
    """

    def __init__(self, settings: RoutingSettings) -> None:
        self.settings = settings

    def decide(self, signals: RouteSignals) -> Decision:
        s = self.settings
        if s.mode == "off":
            return Decision(s.large, "routing off", signals)
        if s.mode == "cascade":
            return Decision(s.small, "cascade: the small profile first", signals)
        broken = failed_rule(s.rules, signals)
        if broken is not None:
            return Decision(s.large, f"large: {broken}", signals)
        return Decision(s.small, f"small: every rule holds ({signals.kind}, {signals.question_tokens} tokens, "
                        f"margin {signals.margin:.4g}, agreement {signals.agreement:.2f}, "
                        f"{signals.chunks} passages, turn {signals.turn})", signals)
