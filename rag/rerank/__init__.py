"""Rerankers: the second stage that reorders retrieved candidates (``rag.types.Reranker``).

- :class:`EmbeddingReranker` (``embedding``, the default): cosine similarity between the
  query embedding and each candidate's stored vector. No extra model, a few milliseconds.
- :class:`CohereReranker` (``cohere``): Cohere's rerank API through the ``cohere`` SDK.
- :class:`CrossEncoderReranker` (``cross-encoder``): a sentence-transformers ``CrossEncoder``
  from a local folder or hub id, for teams that have one.
- :class:`KeepOrder` (``none``): no second stage; ``hybrid`` keeps BM25's order.

Example::

    from rag.rerank import make_reranker
    reranker = make_reranker(services)               # from settings.retrieval.reranker
    best = reranker.rerank("tls handshake", hits, top_n=5)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rag.errors import ConfigError
from rag.types import Hit, Reranker

if TYPE_CHECKING:
    from rag.services import Services

__all__ = ["make_reranker", "EmbeddingReranker", "CrossEncoderReranker", "CohereReranker", "KeepOrder"]


class KeepOrder:
    """The reranker of ``reranker.backend: none``: candidates stay in the order they came."""

    name = "none"

    def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None) -> list[Hit]:
        return list(hits if top_n is None else hits[:top_n])


def make_reranker(services: Services) -> Reranker:
    """The reranker that ``services.settings.retrieval.reranker`` names (:class:`KeepOrder` for
    ``none``)."""
    cfg = services.settings.retrieval.reranker
    if cfg.backend == "none":
        return KeepOrder()
    if cfg.backend == "embedding":
        return EmbeddingReranker(services)
    if cfg.backend == "cross-encoder":
        return CrossEncoderReranker(cfg.model or "", batch_size=cfg.batch_size,
                                    device=services.settings.embedder.device)
    if cfg.backend == "cohere":
        from rag.rerank.cohere import CohereReranker as _Cohere

        return _Cohere.from_settings(cfg)
    raise ConfigError(f"unknown reranker backend {cfg.backend!r}")


def __getattr__(name: str) -> object:  # the Cohere SDK loads only when asked for
    if name == "CohereReranker":
        from rag.rerank.cohere import CohereReranker

        return CohereReranker
    raise AttributeError(name)


from rag.rerank.cross_encoder import CrossEncoderReranker  # noqa: E402
from rag.rerank.embedding import EmbeddingReranker  # noqa: E402
