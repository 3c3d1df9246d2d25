"""The default reranker: cosine similarity to the query embedding, from stored vectors."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rag.types import Hit

if TYPE_CHECKING:
    from rag.services import Services

__all__ = ["EmbeddingReranker"]


class EmbeddingReranker:
    """Reorders hits by cosine similarity between the query and each chunk's stored vector.

    Vectors come from the local vector cache when there is one (sub-millisecond), else from
    the vector index; a chunk with no stored vector is embedded on the spot. Ties keep the
    incoming order, so BM25 order breaks them.

    Example::

        reranker = EmbeddingReranker(services)
        best = reranker.rerank("configure tls", bm25_hits, top_n=5)
        best[0].explain["cosine"]
    """

    name = "embedding"

    def __init__(self, services: Services) -> None:
        self.services = services

    def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None,
               query_vector: np.ndarray | None = None) -> list[Hit]:
        if not hits:
            return []
        qvec = query_vector if query_vector is not None else self.services.embedder.embed_query(query)
        vectors = self.vectors([h.chunk_id for h in hits])
        missing = [h for h in hits if h.chunk_id not in vectors and h.chunk is not None]
        if missing:
            fresh = self.services.embedder.embed_documents([h.chunk.text for h in missing])  # type: ignore[union-attr]
            vectors.update({h.chunk_id: v for h, v in zip(missing, fresh, strict=True)})
        scored = []
        for h in hits:
            vec = vectors.get(h.chunk_id)
            cos = float(np.dot(vec, qvec)) if vec is not None else -1.0
            scored.append(Hit(h.chunk_id, cos, h.doc_id, h.chunk, {**h.explain, "cosine": cos}))
        scored.sort(key=lambda h: h.score, reverse=True)  # stable
        return scored[:top_n] if top_n is not None else scored

    def vectors(self, chunk_ids: list[str]) -> dict[str, np.ndarray]:
        cache = self.services.vector_cache
        store = cache or self.services.vector
        vectors = store.get_vectors(chunk_ids)
        missing = [cid for cid in chunk_ids if cid not in vectors]
        if missing and cache is not None:
            # The cache can lag the main index (turned on after the last reindex).
            vectors.update(self.services.vector.get_vectors(missing))
        return vectors
