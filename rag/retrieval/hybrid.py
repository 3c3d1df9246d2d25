"""Retrieval over the lexical and vector indexes, in four modes, then rerank and tidy.

* ``bm25``: keyword search alone.
* ``vector``: nearest neighbours of the query embedding alone.
* ``hybrid``: BM25 finds ``candidates`` chunks (filters applied) and the reranker reorders
  them; the default reranker is cosine similarity to the query embedding, from the local
  vector cache when there is one. When no keyword matches, it falls back to ``vector``.
* ``rrf``: the BM25 and vector top ``candidates`` fused by reciprocal rank fusion, with
  weights per query from the shape of each leg's scores (:mod:`rag.retrieval.adaptive`) unless
  fixed ``weights`` are given. A model reranker (Cohere, cross-encoder), when configured,
  then reorders the fused candidates.

A query in a language that the embedder does not cover (``Embedder.languages``: MiniLM ranks
only English) keeps :data:`UNCOVERED_SHARE` of the vector leg's weight in ``rrf`` and gets no
cosine reorder in ``hybrid``: such a ranking is close to random, and fusing it at full weight
drags BM25 down (Chinese XQuAD with MiniLM: BM25 0.962 nDCG@10, equal-weight RRF 0.549). The
small share only fills in where BM25 matches little (Chinese questions on English documents:
0.140 with no vector leg, 0.181 with it). ``Retrieval.fusion`` says which weights a query got
and why; ``ragqa search --explain`` prints it.

A leg whose backend fails (Elasticsearch down or hung past ``lexical.query_timeout_s``, the
vector store or the embedder failing, a reranker API down) is left out and the hits come from
the others, with the reason in ``Retrieval.degraded``; it is skipped for a few seconds, then
tried again (:mod:`rag.retrieval.legs`). Only when every leg of the mode fails does the search
raise.

After ranking, an optional recency boost raises recently modified chunks, and near-duplicate
chunks (the same text, or overlapping chunks of one document) are dropped.

Every hit carries its chunk and, in ``explain``, each step's score and 1-based rank
(``bm25``/``bm25_rank``, ``vector``/``vector_rank``, ``cosine``, ``rrf``, ``cohere``,
``cross_encoder``, ``recency``).

Example::

    retriever = HybridRetriever.from_services(services)      # settings.retrieval
    for hit in retriever.retrieve("ssl certificate verification", k=5):
        print(hit.score, hit.chunk.title, hit.explain)
    result = retriever.search("tls", k=5)                     # hits and per-step timings
    result.timings["bm25_ms"]
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np

from rag.errors import ConfigError
from rag.lang import LANG_NAMES, detect_lang, ranks
from rag.rerank import EmbeddingReranker, make_reranker
from rag.retrieval.adaptive import Leg, adaptive_weights
from rag.retrieval.fusion import rrf
from rag.retrieval.legs import LEG_ERRORS, LegBreaker, LegDown
from rag.retrieval.postprocess import boost_recent, drop_near_duplicates
from rag.types import Filters, Hit, Reranker

if TYPE_CHECKING:
    from rag.services import Services

__all__ = ["MODES", "UNCOVERED_SHARE", "HybridRetriever", "Mode", "Retrieval"]

UNCOVERED_SHARE = 0.03
"""The share of its weight that the vector leg keeps for a query in a language its model does
not cover. Measured with MiniLM (evals/RESULTS-retrieval.md): 0 and 0.03 score alike on
Chinese XQuAD (0.962 and 0.961 nDCG@10, p = 0.26), 0.1 already costs 0.005 (p < 0.01); with
Chinese questions on English paragraphs, 0.03 scores 0.181 against 0.140 for 0."""

Mode = Literal["bm25", "vector", "hybrid", "rrf"]
MODES: tuple[str, ...] = get_args(Mode)


@dataclass(slots=True)
class Retrieval:
    """The hits of one query, best first, and milliseconds spent per step."""

    hits: list[Hit]
    timings: dict[str, float] = field(default_factory=dict)
    fusion: dict[str, Any] = field(default_factory=dict)
    """``lang`` (the query's), ``weights`` (bm25, vector) as used, and ``why`` in words."""
    degraded: list[str] = field(default_factory=list)
    """Why a leg is missing from these hits (its backend failed, :mod:`rag.retrieval.legs`)."""


class _Clock:
    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.timings[f"{step}_ms"] = self.timings.get(f"{step}_ms", 0.0) + (now - self._last) * 1000
        self._last = now


class HybridRetriever:
    """Runs one retrieval mode against a deployment's indexes, then reranks and tidies.

    ``weights`` are the (BM25, vector) weights of rank fusion, ``None`` for adaptive weights
    per query; ``rrf_k`` is its damping constant. ``language_aware`` leaves the vector leg
    :data:`UNCOVERED_SHARE` of its weight for a query in a language the embedder does not cover.
    ``reranker`` is the hybrid mode's second step (default: embedding cosine); a non-embedding
    reranker also reorders the other modes' candidates. Construction is cheap and connects to
    nothing.

    Example::

        hits = HybridRetriever(services, mode="hybrid").retrieve("tls", k=5, filters=Filters())
    """

    def __init__(self, services: Services, *, mode: str = "hybrid", candidates: int = 100,
                 rrf_k: float = 60, weights: Sequence[float] | None = None,
                 reranker: Reranker | None = None, recency_half_life_days: float | None = None,
                 recency_weight: float = 0.2, dedup_threshold: float | None = 0.8,
                 now: datetime | None = None, language_aware: bool = True) -> None:
        if mode not in MODES:
            raise ConfigError(f"retrieval mode must be one of {', '.join(MODES)}, not {mode!r}")
        if candidates < 1:
            raise ConfigError(f"candidates must be at least 1, got {candidates}")
        if rrf_k < 0:
            raise ConfigError(f"rrf_k must be >= 0, got {rrf_k}")
        if weights is not None and (len(weights) != 2 or min(weights) < 0 or not any(weights)):
            raise ConfigError(f"weights must be (bm25, vector), non-negative and not both 0, got {tuple(weights)!r}")
        if recency_half_life_days is not None and recency_half_life_days <= 0:
            raise ConfigError(f"recency half-life must be > 0 days, got {recency_half_life_days}")
        self.services = services
        self.mode = mode
        self.candidates = candidates
        self.rrf_k = rrf_k
        self.weights = None if weights is None else (float(weights[0]), float(weights[1]))
        self.reranker: Reranker = reranker if reranker is not None else EmbeddingReranker(services)
        self.recency_half_life_days = recency_half_life_days
        self.recency_weight = recency_weight
        self.dedup_threshold = dedup_threshold
        self.now = now
        self.language_aware = language_aware
        self.breakers = {leg: LegBreaker(leg) for leg in ("lexical", "vector", "rerank")}

    @classmethod
    def from_services(cls, services: Services, **overrides: Any) -> HybridRetriever:
        """A retriever configured by ``services.settings.retrieval``; keywords override."""
        cfg = services.settings.retrieval
        options: dict[str, Any] = {
            "mode": cfg.mode, "candidates": cfg.candidates, "rrf_k": cfg.rrf_k,
            "weights": cfg.weights,
            "recency_half_life_days": cfg.recency_half_life_days, "recency_weight": cfg.recency_weight,
            "dedup_threshold": cfg.dedup_threshold, "language_aware": cfg.language_aware,
        }
        options.update(overrides)
        if "reranker" not in options:
            options["reranker"] = make_reranker(services)
        return cls(services, **options)

    def retrieve(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        """The best ``k`` chunks for ``query``, best first, one hit per chunk id."""
        return self.search(query, k, filters).hits

    def search(self, query: str, k: int = 10, filters: Filters | None = None,
               query_vector: np.ndarray | None = None) -> Retrieval:
        """Like :meth:`retrieve`, with the milliseconds each step took.

        ``query_vector`` is the query's embedding when the caller already has it (the
        answer cache computes it for its semantic lookup), so it is not computed twice.
        """
        clock = _Clock()
        if k <= 0:
            return Retrieval([], clock.timings)
        n = max(self.candidates, k)
        fusion = self._fusion(query)
        clock.lap("lang")
        use_vectors = fusion["weights"][1] > 0
        down: list[LegDown] = []
        qvec: np.ndarray | None = query_vector

        def leg(name: str, step: str, run: Callable[[], list[Hit]], otherwise: list[Hit] | None = None) -> list[Hit] | None:
            """``run`` through the leg's breaker; ``otherwise`` (and the reason noted) when it is down."""
            try:
                return self.breakers[name].call(run)
            except LegDown as exc:
                down.append(exc)
                return otherwise
            finally:
                clock.lap(step)

        def nearest() -> list[Hit]:
            nonlocal qvec
            if qvec is None:
                qvec = self.services.embedder.embed_query(query)
                clock.lap("embed")
            return self._vector(qvec, n, filters)

        def lexical() -> list[Hit] | None:
            return leg("lexical", "bm25", lambda: self._lexical(query, n, filters))

        def vector() -> list[Hit] | None:
            return leg("vector", "vector", nearest)

        def rerank(hits: list[Hit]) -> list[Hit] | None:  # (the hits as they are when the reranker is down)
            return leg("rerank", "rerank", lambda: self._rerank(query, self._hydrate(hits), qvec), hits)

        if self.mode == "bm25":
            hits = lexical()
            if hits is None:
                hits = vector()
        elif self.mode == "vector":
            hits = vector()
            if hits is None:
                hits = lexical()
        elif self.mode == "hybrid":
            if qvec is None and use_vectors and self._embedding_rerank:
                with contextlib.suppress(*LEG_ERRORS):  # (a failing embedder is met again below)
                    qvec = self.services.embedder.embed_query(query)
                clock.lap("embed")
            hits = lexical()
            if hits is None:  # no lexical index: the nearest neighbours
                hits = vector()
            elif not hits:  # no keyword matches: the nearest neighbours
                hits = vector() or []
            elif use_vectors or not self._embedding_rerank:
                hits = rerank(hits)
        else:
            lex = lexical()
            vec: list[Hit] | None = vector() if use_vectors else []
            if lex is None and vec is None:
                hits = None
            elif lex is None or vec is None:  # one leg: its own order
                alone = (0.0, 1.0) if lex is None else (1.0, 0.0)
                hits = self._fuse(lex or [], vec or [], alone)
                fusion = {**fusion, "weights": alone, "why": f"{down[0].leg} unavailable: the other leg alone"}
            else:
                if self.weights is None and use_vectors:
                    fusion = self._adapt(query, lex, vec, fusion)
                    clock.lap("weights")
                hits = self._fuse(lex, vec, fusion["weights"])
                clock.lap("fuse")
            if hits is not None and not self._embedding_rerank:  # a model reranker reorders the fused candidates
                hits = rerank(hits[:n])
        if hits is None:  # every leg this mode has failed: nothing to answer from
            raise down[0].cause
        hits = self._hydrate(hits)
        clock.lap("hydrate")
        if self.recency_half_life_days is not None:
            hits = boost_recent(hits, self.recency_half_life_days, self.recency_weight, self.now)
        if self.dedup_threshold is not None:
            hits = drop_near_duplicates(hits, self.dedup_threshold, limit=k)
        clock.lap("tidy")
        return Retrieval(hits[:k], clock.timings, fusion, [str(d) for d in down])

    def _fusion(self, query: str) -> dict[str, Any]:
        """The (bm25, vector) weights for ``query`` before retrieval, and why (adaptive weights
        are refined by :meth:`_adapt` once both legs are in)."""
        lang = detect_lang(query)
        bm25, vec = self.weights or (0.5, 0.5)
        if self.mode == "bm25":
            return {"lang": lang, "weights": (1.0, 0.0), "why": "bm25 mode: keyword search alone"}
        if self.mode == "vector":
            return {"lang": lang, "weights": (0.0, 1.0), "why": "vector mode: nearest neighbours alone"}
        embedder = self.services.embedder
        if self.language_aware and not ranks(embedder, lang):
            unranked = (f"the question is in {LANG_NAMES.get(lang, lang)}, which the embedder {embedder.name} "
                        f"does not rank ({', '.join(sorted(embedder.languages or ()))} only)")
            if self.mode == "hybrid":
                return {"lang": lang, "weights": (1.0, 0.0), "why": f"{unranked}: keyword order, not reordered"}
            return {"lang": lang, "weights": (bm25 if bm25 > 0 else 1.0, vec * UNCOVERED_SHARE),
                    "uncovered": True,
                    "why": f"{unranked}: the vector leg keeps {UNCOVERED_SHARE:.0%} of its weight"}
        if self.mode == "hybrid":
            return {"lang": lang, "weights": (bm25, vec), "why": "hybrid mode: keyword candidates, reordered"}
        return {"lang": lang, "weights": (bm25, vec), "why": "the configured weights"}

    @staticmethod
    def _adapt(query: str, lexical: list[Hit], vector: list[Hit], fusion: dict[str, Any]) -> dict[str, Any]:
        legs = [Leg([h.doc_id or h.chunk_id for h in hits], [h.score for h in hits]) for hits in (lexical, vector)]
        bm25, vec = adaptive_weights(legs[0], legs[1], query)
        if fusion.get("uncovered"):
            return {**fusion, "weights": (bm25, vec * UNCOVERED_SHARE),
                    "why": f"{fusion['why']} (adaptive: rag.retrieval.adaptive)"}
        lead = "the vector leg" if vec > bm25 else "BM25"
        return {**fusion, "weights": (bm25, vec),
                "why": f"adaptive: {lead} leads, from the shape of each leg's scores (rag.retrieval.adaptive)"}

    @property
    def _embedding_rerank(self) -> bool:
        return isinstance(self.reranker, EmbeddingReranker)

    # -- legs -----------------------------------------------------------------------------
    def _lexical(self, query: str, n: int, filters: Filters | None) -> list[Hit]:
        found = _unique(self.services.lexical.search(query, k=n, filters=filters))
        return [Hit(h.chunk_id, h.score, h.doc_id, h.chunk, {"bm25": h.score, "bm25_rank": float(r)})
                for r, h in enumerate(found, start=1)]

    def _vector(self, qvec: np.ndarray | None, n: int, filters: Filters | None) -> list[Hit]:
        assert qvec is not None
        store = self.services.vector_cache or self.services.vector
        found = _unique(store.search(qvec, k=n, filters=filters))
        return [Hit(h.chunk_id, h.score, h.doc_id, h.chunk, {"vector": h.score, "vector_rank": float(r)})
                for r, h in enumerate(found, start=1)]

    def _rerank(self, query: str, hits: list[Hit], qvec: np.ndarray | None) -> list[Hit]:
        if isinstance(self.reranker, EmbeddingReranker):
            return self.reranker.rerank(query, hits, query_vector=qvec)
        return self.reranker.rerank(query, hits)

    def _fuse(self, lexical: list[Hit], vector: list[Hit], weights: tuple[float, float]) -> list[Hit]:
        by_id: dict[str, Hit] = {}
        explain: dict[str, dict[str, float]] = {}
        for h in lexical + vector:
            if h.chunk_id not in by_id or (h.chunk is not None and by_id[h.chunk_id].chunk is None):
                by_id[h.chunk_id] = h
            explain.setdefault(h.chunk_id, {}).update(h.explain)
        fused = rrf([[h.chunk_id for h in lexical], [h.chunk_id for h in vector]],
                    k=self.rrf_k, weights=weights)
        return [Hit(cid, score, by_id[cid].doc_id, by_id[cid].chunk, {**explain[cid], "rrf": score})
                for cid, score in fused]

    def _hydrate(self, hits: list[Hit]) -> list[Hit]:
        """Fill in the chunks of hits from an index that returned only ids, from the state.
        Every index ragqa ships (tantivy, Elasticsearch, Milvus, the local vector store)
        returns whole chunks, so answering reads no state unless an id-only index is plugged in."""
        missing = [h.chunk_id for h in hits if h.chunk is None]
        if not missing:
            return hits
        # (a plain object standing in for Services has no query_state: its state is the one to read)
        state = self.services.query_state if hasattr(type(self.services), "query_state") else self.services.state
        if state is None:
            return hits
        chunks = state.get_chunks(missing)
        out = []
        for h in hits:
            chunk = h.chunk if h.chunk is not None else chunks.get(h.chunk_id)
            doc_id = h.doc_id or (chunk.doc_id if chunk is not None else "")
            out.append(h if (chunk is h.chunk and doc_id == h.doc_id)
                       else Hit(h.chunk_id, h.score, doc_id, chunk, h.explain))
        return out


def _unique(hits: Sequence[Hit]) -> list[Hit]:
    """Keep the first (best) hit of each chunk id."""
    seen: set[str] = set()
    out = []
    for h in hits:
        if h.chunk_id not in seen:
            seen.add(h.chunk_id)
            out.append(h)
    return out
