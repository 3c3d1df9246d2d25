"""A LangChain retriever over ragqa's indexes.

``RagqaRetriever`` is a :class:`langchain_core.retrievers.BaseRetriever`, so it is a Runnable
that drops into any LangChain chain. Each hit becomes a ``Document`` whose ``page_content``
is the chunk text, whose ``id`` is the chunk id, and whose metadata carries ``chunk_id``,
``doc_id``, ``source``, ``title``, ``url``, ``heading``, ``lang``, ``modified`` and
``published`` (ISO 8601 strings or ``None``), ``trust`` (its name), ``tags`` (a list),
``tenant``, ``score`` and ``explain`` (each retrieval leg's score and rank, e.g. ``bm25``,
``vector_rank``, ``rrf``). Async calls run the blocking search in a worker thread. Needs ``pip install 'ragqa[langchain]'``.

Example::

    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from rag.langchain import RagqaRetriever

    retriever = RagqaRetriever.from_services(services, k=4, filters={"source": "pydocs"})
    docs = retriever.invoke("How do I verify TLS certificates?")
    prompt = ChatPromptTemplate.from_template("Context:\\n{context}\\n\\nQuestion: {question}")
    fmt = lambda docs: "\\n\\n".join(f"[{d.metadata['title']}] {d.page_content}" for d in docs)
    chain = {"context": retriever | fmt, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()
    print(await chain.ainvoke("How do I verify TLS certificates?"))
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

try:
    from langchain_core.callbacks import (
        AsyncCallbackManagerForRetrieverRun,
        CallbackManagerForRetrieverRun,
    )
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # langchain-core comes with the langchain extra
    raise ImportError(f"rag.langchain needs langchain-core ({exc}): pip install 'ragqa[langchain]'") from exc
from pydantic import ConfigDict, Field

import rag.retrieval
from rag.filters import parse_filters
from rag.types import Filters, Hit

__all__ = ["RagqaRetriever", "hit_to_document"]


def hit_to_document(hit: Hit) -> Document:
    """One retrieved (hydrated) hit as a LangChain ``Document``."""
    c = hit.chunk
    if c is None:
        raise ValueError(f"hit {hit.chunk_id!r} has no chunk text")
    metadata: dict[str, Any] = {
        "chunk_id": c.id,
        "doc_id": c.doc_id,
        "source": c.source,
        "title": c.title,
        "url": c.url,
        "heading": c.heading,
        "lang": c.lang,
        "modified": c.modified.isoformat() if c.modified else None,
        "published": c.published.isoformat() if c.published else None,
        "trust": c.trust.name,
        "tags": list(c.tags),
        "tenant": c.tenant,
        "score": float(hit.score),
        "explain": {key: float(value) for key, value in hit.explain.items()},
    }
    return Document(page_content=c.text, metadata=metadata, id=c.id)


class RagqaRetriever(BaseRetriever):
    """LangChain retriever backed by a ragqa retriever (anything with ``retrieve(query, k, filters)``).

    ``filters`` may be a :class:`~rag.types.Filters` or a mapping; either is validated by
    :func:`rag.filters.parse_filters` at construction, which raises ``FilterError``.

    Example::

        retriever = RagqaRetriever(retriever=HybridRetriever(services), k=5,
                                   filters={"source": "pydocs", "modified_from": "2024-01-01"})
        docs = retriever.invoke("ssl certificate verification")
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any
    k: int = Field(default=8, ge=1)
    filters: Any = None

    def __init__(self, **data: Any) -> None:
        # Validated here, not in a pydantic validator, so a bad filter raises FilterError
        # itself rather than a ValidationError wrapping it.
        if data.get("filters") is not None:
            data["filters"] = parse_filters(data["filters"])
        super().__init__(**data)

    @classmethod
    def from_services(cls, services: Any, *, k: int | None = None, mode: str | None = None,
                      filters: Filters | Mapping[str, Any] | None = None) -> RagqaRetriever:
        """Build from a deployment's ``retrieval`` settings (mode, candidates, reranker, top_k)."""
        cfg = services.settings.retrieval
        inner = rag.retrieval.HybridRetriever.from_services(services, **({"mode": mode} if mode else {}))
        return cls(retriever=inner, k=cfg.top_k if k is None else k, filters=filters)

    def _retrieve(self, query: str) -> list[Document]:
        hits = self.retriever.retrieve(query, k=self.k, filters=self.filters)
        return [hit_to_document(h) for h in hits if h.chunk is not None]

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self._retrieve(query)

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        return await asyncio.to_thread(self._retrieve, query)
