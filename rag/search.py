"""A plain lexical-then-vector search, to check ingestion by hand.

BM25 finds candidates (with the metadata filters applied), and the candidates are
reordered by cosine similarity to the query embedding, with vectors taken from the local
vector cache when there is one. When no keyword matches, it falls back to vector search.

Example::

    hits = search(services, "ssl certificate verification", k=5, filters=Filters(source=("pydocs",)))
"""

from __future__ import annotations

import numpy as np

from rag.services import Services
from rag.types import Filters, Hit

__all__ = ["search"]


def search(services: Services, query: str, k: int = 10, filters: Filters | None = None,
           candidates: int = 100) -> list[Hit]:
    lexical = services.lexical.search(query, k=max(candidates, k), filters=filters)
    qvec = services.embedder.embed_query(query)
    if not lexical:
        hits = services.vector.search(qvec, k=k, filters=filters)
        return [_hydrate(services, Hit(h.chunk_id, h.score, h.doc_id, h.chunk, {"vector": h.score}))
                for h in hits]
    store = services.vector_cache or services.vector
    vectors = store.get_vectors([h.chunk_id for h in lexical])
    scored = []
    for h in lexical:
        vec = vectors.get(h.chunk_id)
        cos = float(np.dot(vec, qvec)) if vec is not None else -1.0
        scored.append(Hit(h.chunk_id, cos, h.doc_id, h.chunk, {"bm25": h.score, "cosine": cos}))
    scored.sort(key=lambda h: h.score, reverse=True)
    return [_hydrate(services, h) for h in scored[:k]]


def _hydrate(services: Services, hit: Hit) -> Hit:
    if hit.chunk is not None:
        return hit
    chunk = services.state.get_chunks([hit.chunk_id]).get(hit.chunk_id)
    return Hit(hit.chunk_id, hit.score, hit.doc_id or (chunk.doc_id if chunk else ""), chunk, hit.explain)
