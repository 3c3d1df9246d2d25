"""A reranker that scores (query, passage) pairs with a sentence-transformers CrossEncoder."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from rag.errors import ConfigError, RerankerError
from rag.types import Hit

__all__ = ["CrossEncoderReranker"]


class CrossEncoderReranker:
    """Reranks with a ``sentence_transformers.CrossEncoder`` loaded from ``model``.

    The model loads on first use; a path that does not hold a model fails then with one
    ``ConfigError`` line. Scores are the model's raw relevance logits (higher is better).

    Example::

        reranker = CrossEncoderReranker("/models/ms-marco-MiniLM-L-6-v2")
        best = reranker.rerank("what is tls", hits, top_n=5)
    """

    name = "cross-encoder"

    def __init__(self, model: str, *, batch_size: int = 32, device: str = "cpu",
                 max_length: int = 512) -> None:
        if not model:
            raise ConfigError("the cross-encoder reranker needs a model path or hub id")
        self.model_name = model
        self.batch_size = batch_size
        self.device = device
        self.max_length = max_length
        self._model: Any = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        with self._lock:
            if self._model is None:
                from rag.embedders import one_line, openmp_env

                try:
                    with openmp_env():
                        from sentence_transformers import CrossEncoder

                        self._model = CrossEncoder(self.model_name, device=self.device,
                                                   max_length=self.max_length)
                except Exception as exc:  # any load failure is a config problem
                    raise ConfigError(f"cannot load cross-encoder {self.model_name!r}: {one_line(exc)}") from exc
        return self._model

    def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None) -> list[Hit]:
        if not hits:
            return []
        model = self.load()
        pairs = [(query, h.chunk.text if h.chunk is not None else "") for h in hits]
        try:
            scores = model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)
        except Exception as exc:
            raise RerankerError(f"cross-encoder {self.model_name!r} failed: {exc}") from exc
        scored = [Hit(h.chunk_id, float(s), h.doc_id, h.chunk, {**h.explain, "cross_encoder": float(s)})
                  for h, s in zip(hits, scores, strict=True)]
        scored.sort(key=lambda h: h.score, reverse=True)
        return scored[:top_n] if top_n is not None else scored
