"""Retrieval over the lexical and vector indexes, in four modes.

* ``bm25``: keyword search alone.
* ``vector``: nearest neighbours of the query embedding alone.
* ``hybrid``: BM25 finds ``candidates`` chunks (filters applied) and cosine similarity to
  the query embedding reorders them; vectors come from the local vector cache when there
  is one. When no keyword matches, it falls back to ``vector``.
* ``rrf``: the BM25 and vector top ``candidates`` fused by reciprocal rank fusion.

Every hit carries its chunk and, in ``explain``, each leg's score and 1-based rank
(``bm25``/``bm25_rank``, ``vector``/``vector_rank``, ``cosine``, ``rrf``).

Example::

    retriever = HybridRetriever(services, mode="rrf", candidates=50)
    for hit in retriever.retrieve("ssl certificate verification", k=5):
        print(hit.score, hit.chunk.title, hit.explain)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from rag.errors import ConfigError
from rag.retrieval.fusion import rrf
from rag.services import Services
from rag.types import Filters, Hit, VectorIndex

__all__ = ["MODES", "HybridRetriever", "Mode"]

Mode = Literal["bm25", "vector", "hybrid", "rrf"]
MODES: tuple[str, ...] = get_args(Mode)


class HybridRetriever:
    """Runs one retrieval mode against a deployment's indexes.

    ``weights`` are the (BM25, vector) weights of rank fusion; ``rrf_k`` is its damping
    constant. Construction is cheap and connects to nothing.

    Example::

        hits = HybridRetriever(services, mode="hybrid").retrieve("tls", k=5, filters=Filters())
    """

    def __init__(self, services: Services, *, mode: str = "hybrid", candidates: int = 100,
                 rrf_k: float = 60, weights: Sequence[float] = (1.0, 1.0)) -> None:
        if mode not in MODES:
            raise ConfigError(f"retrieval mode must be one of {', '.join(MODES)}, not {mode!r}")
        if candidates < 1:
            raise ConfigError(f"candidates must be at least 1, got {candidates}")
        if rrf_k < 0:
            raise ConfigError(f"rrf_k must be >= 0, got {rrf_k}")
        if len(weights) != 2:
            raise ConfigError(f"weights must be (bm25, vector), got {tuple(weights)!r}")
        self.services = services
        self.mode = mode
        self.candidates = candidates
        self.rrf_k = rrf_k
        self.weights = (float(weights[0]), float(weights[1]))

    def retrieve(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        """The best ``k`` chunks for ``query``, best first, one hit per chunk id."""
        if k <= 0:
            return []
        if self.mode == "bm25":
            hits = self._lexical(query, k, filters)
        elif self.mode == "vector":
            hits = self._vector(query, k, filters)
        elif self.mode == "hybrid":
            hits = self._hybrid(query, k, filters)
        else:
            hits = self._rrf(query, k, filters)
        return self._hydrate(hits[:k])

    # -- legs -----------------------------------------------------------------------------
    def _lexical(self, query: str, n: int, filters: Filters | None) -> list[Hit]:
        found = _unique(self.services.lexical.search(query, k=n, filters=filters))
        return [Hit(h.chunk_id, h.score, h.doc_id, h.chunk, {"bm25": h.score, "bm25_rank": float(r)})
                for r, h in enumerate(found, start=1)]

    def _vector(self, query: str, n: int, filters: Filters | None,
                qvec: np.ndarray | None = None) -> list[Hit]:
        if qvec is None:
            qvec = self.services.embedder.embed_query(query)
        found = _unique(self._vector_store().search(qvec, k=n, filters=filters))
        return [Hit(h.chunk_id, h.score, h.doc_id, h.chunk, {"vector": h.score, "vector_rank": float(r)})
                for r, h in enumerate(found, start=1)]

    def _hybrid(self, query: str, k: int, filters: Filters | None) -> list[Hit]:
        lexical = self._lexical(query, max(self.candidates, k), filters)
        qvec = self.services.embedder.embed_query(query)
        if not lexical:
            return self._vector(query, k, filters, qvec)
        vectors = self._fetch_vectors([h.chunk_id for h in lexical])
        scored = []
        for h in lexical:
            vec = vectors.get(h.chunk_id)
            cos = float(np.dot(vec, qvec)) if vec is not None else -1.0
            scored.append(Hit(h.chunk_id, cos, h.doc_id, h.chunk, {**h.explain, "cosine": cos}))
        scored.sort(key=lambda h: h.score, reverse=True)  # stable: BM25 order breaks ties
        return scored

    def _rrf(self, query: str, k: int, filters: Filters | None) -> list[Hit]:
        n = max(self.candidates, k)
        lexical = self._lexical(query, n, filters)
        vector = self._vector(query, n, filters)
        by_id: dict[str, Hit] = {}
        explain: dict[str, dict[str, float]] = {}
        for h in lexical + vector:
            by_id.setdefault(h.chunk_id, h)
            if h.chunk is not None and by_id[h.chunk_id].chunk is None:
                by_id[h.chunk_id] = h
            explain.setdefault(h.chunk_id, {}).update(h.explain)
        fused = rrf([[h.chunk_id for h in lexical], [h.chunk_id for h in vector]],
                    k=self.rrf_k, weights=self.weights)
        out = []
        for cid, score in fused:
            h = by_id[cid]
            out.append(Hit(cid, score, h.doc_id, h.chunk, {**explain[cid], "rrf": score}))
        return out

    # -- helpers --------------------------------------------------------------------------
    def _vector_store(self) -> VectorIndex:
        return self.services.vector_cache or self.services.vector

    def _fetch_vectors(self, chunk_ids: list[str]) -> dict[str, np.ndarray]:
        vectors = self._vector_store().get_vectors(chunk_ids)
        missing = [cid for cid in chunk_ids if cid not in vectors]
        if missing and self.services.vector_cache is not None:
            # The cache can lag the main index (turned on after the last reindex).
            vectors.update(self.services.vector.get_vectors(missing))
        return vectors

    def _hydrate(self, hits: list[Hit]) -> list[Hit]:
        missing = [h.chunk_id for h in hits if h.chunk is None]
        chunks = self.services.state.get_chunks(missing) if missing else {}
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
