"""A plain lexical-then-vector search, to check ingestion by hand.

BM25 finds candidates (with the metadata filters applied), and the candidates are
reordered by cosine similarity to the query embedding, with vectors taken from the local
vector cache when there is one. When no keyword matches, it falls back to vector search.
Other modes (``bm25``, ``vector``, ``rrf``) are in :class:`rag.retrieval.HybridRetriever`.

Example::

    hits = search(services, "ssl certificate verification", k=5, filters=Filters(source=("pydocs",)))
"""

from __future__ import annotations

from rag.retrieval import HybridRetriever
from rag.services import Services
from rag.types import Filters, Hit

__all__ = ["search"]


def search(services: Services, query: str, k: int = 10, filters: Filters | None = None,
           candidates: int = 100) -> list[Hit]:
    return HybridRetriever(services, mode="hybrid", candidates=candidates).retrieve(query, k, filters)
