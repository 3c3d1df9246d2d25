"""Per-query fusion weights from the shape of each leg's scores.

No single fusion wins everywhere: BM25 alone is best on some corpora (XQuAD, Chinese news),
equal-weight RRF on others (Cranfield), and the vector leg alone when the question is in
another language than the documents (BM25 then matches almost nothing). Each leg's scores
say which case a query is in: a BM25 leg whose top hit stands far above its tenth matched
the query's rare words; a flat one matched common words. A logistic regression on six such
features, fitted on the dev sets by ``evals/fit_fusion.py`` (the figures, held out per
corpus, are in ``evals/RESULTS-retrieval.md``), gives the probability ``p`` that the vector
leg ranks this query better, and RRF weighs the legs ``(1 - p, p)``.

It costs a few microseconds: the features read the top ten scores of each leg, which
retrieval has anyway.

Example::

    w = adaptive_weights(Leg(["d1", "d2"], [12.0, 3.1]), Leg(["d2", "d7"], [0.61, 0.55]),
                         "what is the boiling point of water")   # (bm25, vector), summing to 1
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rag.lang import CJK

__all__ = ["COEF", "FEATURES", "INTERCEPT", "Leg", "adaptive_weights", "features", "query_terms", "vector_share"]

TOP = 10
HITS = 100
CJK_CHARS_PER_TERM = 2.0
"""Chinese has no spaces: a query's CJK characters count as this many per term."""

FEATURES = ("bm25_gap", "bm25_lead", "bm25_top", "bm25_top_per_term", "bm25_hits", "vector_gap",
            "vector_top", "overlap")
"""``bm25_gap``: (s1 - s10) / s1 of the BM25 scores; ``bm25_lead``: (s1 - s2) / s1;
``bm25_top``: log(1 + s1); ``bm25_top_per_term``: that less log(query terms), since a long
query scores high everywhere; ``bm25_hits``: how many chunks BM25 matched, as a share of
:data:`HITS` (few matches: the query's words are rare in the corpus, or in another language);
``vector_gap``: c1 - c10 of the cosines; ``vector_top``: c1; ``overlap``: the
share of the two top-ten lists' documents that both hold."""

# Fitted by ``python evals/fit_fusion.py LEGS --fit`` on the dev sets' 7,462 queries (Cranfield,
# RGB-zh, XQuAD en/zh and zh→en; MiniLM and USE); see evals/RESULTS-retrieval.md.
COEF = np.array([-0.696, -2.652, -1.190, -1.123, -0.716, 1.720, 2.105, 0.147])
INTERCEPT = 3.360


@dataclass(frozen=True, slots=True)
class Leg:
    """One leg's ranked documents (or chunks) and their scores, best first."""

    ids: Sequence[str]
    scores: Sequence[float]


def query_terms(query: str) -> float:
    """Roughly how many terms BM25 sees in ``query``: its Latin words and numbers, and its
    Chinese characters over :data:`CJK_CHARS_PER_TERM`; at least 1."""
    return max(1.0, len(_WORD.findall(query)) + len(CJK.findall(query)) / CJK_CHARS_PER_TERM)


def features(bm25: Leg, vector: Leg, query: str) -> np.ndarray:
    """The :data:`FEATURES` of one query's two legs (missing hits count as score 0)."""
    b = _top(bm25.scores)
    v = _top(vector.scores)
    b1 = b[0]
    top_b = set(list(dict.fromkeys(bm25.ids))[:TOP])
    top_v = set(list(dict.fromkeys(vector.ids))[:TOP])
    top = math.log1p(max(b1, 0.0))
    return np.array([
        (b1 - b[-1]) / b1 if b1 > 0 else 0.0,
        (b1 - b[1]) / b1 if b1 > 0 else 0.0,
        top,
        top - math.log(query_terms(query)),
        min(len(bm25.ids), HITS) / HITS,
        v[0] - v[-1],
        v[0],
        len(top_b & top_v) / TOP,
    ])


def vector_share(bm25: Leg, vector: Leg, query: str, coef: np.ndarray | None = None,
                 intercept: float | None = None) -> float:
    """The probability that the vector leg ranks this query better than BM25."""
    coef = COEF if coef is None else coef
    intercept = INTERCEPT if intercept is None else intercept
    if not bm25.ids:
        return 1.0
    if not vector.ids:
        return 0.0
    z = float(features(bm25, vector, query) @ coef + intercept)
    return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def adaptive_weights(bm25: Leg, vector: Leg, query: str, coef: np.ndarray | None = None,
                     intercept: float | None = None) -> tuple[float, float]:
    """RRF weights (bm25, vector) for one query: ``(1 - p, p)`` with ``p`` from :func:`vector_share`."""
    p = vector_share(bm25, vector, query, coef, intercept)
    return (1.0 - p, p)


_WORD = re.compile(r"[A-Za-z0-9]+")


def _top(scores: Sequence[float]) -> list[float]:
    top = [float(s) for s in list(scores)[:TOP]]
    return top + [0.0] * (TOP - len(top))
