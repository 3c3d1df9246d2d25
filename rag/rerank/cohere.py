"""A reranker on Cohere's rerank API (``retrieval.reranker.backend: cohere``), through the ``cohere`` SDK."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rag.embedders.cohere import CohereApi
from rag.errors import RerankerError
from rag.types import Hit

if TYPE_CHECKING:
    from rag.config import RerankerSettings

__all__ = ["CohereReranker", "DEFAULT_MODEL"]

DEFAULT_MODEL = "rerank-v3.5"


class CohereReranker:
    """Reorders hits by Cohere's relevance score (``ClientV2.rerank``, ``POST /v2/rerank``).

    The hits' chunk texts are sent as the documents, in order; each result's ``index`` maps
    back to its hit, whose ``score`` and ``explain["cohere"]`` become the ``relevance_score``
    (0 to 1), the hit's other explain keys kept. Only ``top_n`` results are asked for when
    fewer than all are wanted. A hit without a chunk cannot be judged: it follows the scored
    ones, in incoming order, with score 0.0 and no ``cohere`` key.

    Needs ``pip install 'ragqa[cohere]'`` and an API key (``retrieval.reranker.api_key`` or
    ``CO_API_KEY``). A refused key or an unreachable endpoint raises ``BackendUnavailable``, a
    timeout ``BackendTimeout``, any other API failure ``RerankerError``.

    Example::

        reranker = CohereReranker(api_key="...")              # model rerank-v3.5
        best = reranker.rerank("how do I reset my password", hits, top_n=5)
        best[0].explain["cohere"], best[0].explain.get("bm25")
    """

    name = "cohere"

    def __init__(self, model: str | None = None, *, api_key: str | None = None, base_url: str | None = None,
                 timeout_s: float = 30.0, max_retries: int = 2) -> None:
        self.model = model or DEFAULT_MODEL
        self.api = CohereApi(role="Cohere rerank", setting="retrieval.reranker", error=RerankerError,
                             api_key=api_key, base_url=base_url, timeout_s=timeout_s, max_retries=max_retries)

    @classmethod
    def from_settings(cls, cfg: RerankerSettings) -> CohereReranker:
        return cls(cfg.model, api_key=cfg.api_key.get_secret_value() if cfg.api_key else None,
                   base_url=cfg.base_url, timeout_s=cfg.timeout_s, max_retries=cfg.max_retries)

    def __repr__(self) -> str:
        return f"CohereReranker({self.model!r}, base_url={self.api.endpoint!r})"

    def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None) -> list[Hit]:
        if not hits or (top_n is not None and top_n <= 0):
            return []
        judged = [h for h in hits if h.chunk is not None]
        unjudged = [Hit(h.chunk_id, 0.0, h.doc_id, h.chunk, dict(h.explain)) for h in hits if h.chunk is None]
        scored = self._score(query, judged, top_n) if judged else []
        result = scored + unjudged
        return result[:top_n] if top_n is not None else result

    def close(self) -> None:
        self.api.close()

    def _score(self, query: str, hits: list[Hit], top_n: int | None) -> list[Hit]:
        want = len(hits) if top_n is None else min(top_n, len(hits))
        documents = [h.chunk.text for h in hits]  # type: ignore[union-attr]
        request: dict[str, Any] = {"model": self.model, "query": query, "documents": documents}
        if want < len(hits):
            request["top_n"] = want
        response = self.api.call("rerank", **request)
        results = list(getattr(response, "results", None) or [])
        scored: list[Hit] = []
        seen: set[int] = set()
        for item in results:
            index, score = int(item.index), float(item.relevance_score)
            if not 0 <= index < len(hits) or index in seen:
                raise RerankerError(f"Cohere rerank returned index {item.index} for {len(hits)} documents")
            seen.add(index)
            h = hits[index]
            scored.append(Hit(h.chunk_id, score, h.doc_id, h.chunk, {**h.explain, "cohere": score}))
        if len(scored) < want:
            raise RerankerError(f"Cohere rerank returned {len(scored)} results, {want} were asked for")
        scored.sort(key=lambda h: h.score, reverse=True)  # stable: Cohere's own order breaks ties
        return scored[:want]
