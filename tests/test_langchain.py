"""RagqaRetriever: ragqa hits as LangChain Documents, alone and inside a real LCEL chain."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableParallel, RunnablePassthrough

from ingest.pipeline import reindex
from ingest.services import open_services
from rag.config import RetrievalSettings, SourceConfig
from rag.errors import FilterError
from rag.langchain import RagqaRetriever
from rag.retrieval import HybridRetriever
from rag.services import Services
from rag.types import Filters, Trust
from tests.conftest import make_settings

OLD = datetime(2024, 3, 1, tzinfo=UTC)
NEW = datetime(2025, 6, 1, tzinfo=UTC)
CORPUS = {
    "alpha": {
        "tls.md": "# TLS certificates\n\n## Verification\n\nThe client checks the server certificate "
                  "chain against the trusted authority bundle before it sends any request data.\n",
        "pool.md": "# Connection pooling\n\nIdle connections stay in a pool and are reused for later "
                   "requests to the same host; the pool size limits open sockets.\n",
        "cache.md": "# Response caching\n\nResponses with an ETag header are cached on disk and "
                    "revalidated with a conditional request once they expire.\n",
    },
    "beta": {
        "legacy.md": "# Legacy releases\n\nOld releases skipped certificate verification by default; "
                     "upgrade to get authority bundle checks on every certificate.\n",
        "retry.md": "# Retries\n\nFailed requests are retried with exponential backoff, at most three times.\n",
    },
}
SOURCES = {"alpha": (OLD, Trust.high, ("ops",)), "beta": (NEW, Trust.low, ("archive",))}


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Two folder sources: ``alpha`` (3 notes, 2024, high trust) and ``beta`` (2 notes, 2025, low)."""
    base = tmp_path_factory.mktemp("langchain")
    svc = open_services(make_settings(base / "data"))
    for name, files in CORPUS.items():
        when, trust, tags = SOURCES[name]
        (base / name).mkdir()
        for fname, text in files.items():
            path = base / name / fname
            path.write_text(text, encoding="utf-8")
            os.utime(path, (when.timestamp(), when.timestamp()))
        svc.state.add_source(SourceConfig(name=name, kind="folder", location=str(base / name),
                                          lang="en", trust=trust, tags=tags))
        with svc.write_lock():
            assert reindex(svc, name, "full").added == len(files)
    yield svc
    svc.close()


def test_documents_carry_chunk_text_metadata_and_ranking(indexed):
    inner = HybridRetriever(indexed, mode="hybrid")
    query = "server certificate chain authority bundle"
    hits = inner.retrieve(query, k=4)
    docs = RagqaRetriever(retriever=inner, k=4).invoke(query)
    assert all(isinstance(d, Document) for d in docs)
    assert [d.id for d in docs] == [h.chunk_id for h in hits] and len(docs) >= 2
    assert [d.page_content for d in docs] == [h.chunk.text for h in hits]
    scores = [d.metadata["score"] for d in docs]
    assert scores == sorted(scores, reverse=True) == [h.score for h in hits]
    top = docs[0]
    assert top.metadata["doc_id"] == "alpha:tls.md" and "server certificate chain" in top.page_content
    assert top.metadata["chunk_id"] == top.id
    assert top.metadata["source"] == "alpha" and top.metadata["title"] == "TLS certificates"
    assert top.metadata["url"].startswith("file://") and top.metadata["url"].endswith("/alpha/tls.md")
    assert "Verification" in top.metadata["heading"]
    assert top.metadata["lang"] == "en"
    assert datetime.fromisoformat(top.metadata["modified"]) == OLD and top.metadata["published"] is None
    assert top.metadata["trust"] == "high" and top.metadata["tags"] == ["ops"]
    assert top.metadata["explain"] == hits[0].explain and {"bm25", "bm25_rank", "cosine"} <= set(
        top.metadata["explain"])
    assert top.metadata["score"] == top.metadata["explain"]["cosine"]
    legacy = next(d for d in docs if d.metadata["doc_id"] == "beta:legacy.md")
    assert legacy.metadata["trust"] == "low" and legacy.metadata["tags"] == ["archive"]
    assert datetime.fromisoformat(legacy.metadata["modified"]) == NEW
    assert len(RagqaRetriever(retriever=inner, k=1).invoke(query)) == 1


def test_filters_restrict_the_source(indexed):
    inner = HybridRetriever(indexed, mode="hybrid")
    query = "certificate authority bundle"
    unfiltered = RagqaRetriever(retriever=inner, k=5).invoke(query)
    assert {d.metadata["source"] for d in unfiltered} == {"alpha", "beta"}
    retriever = RagqaRetriever(retriever=inner, k=5, filters={"source": "beta"})
    assert retriever.filters == Filters(source=("beta",))
    beta = retriever.invoke(query)
    assert beta and {d.metadata["source"] for d in beta} == {"beta"}
    assert beta[0].metadata["doc_id"] == "beta:legacy.md"
    recent = RagqaRetriever(retriever=inner, k=5, filters=Filters(modified_to=datetime(2024, 12, 31, tzinfo=UTC)))
    assert {d.metadata["source"] for d in recent.invoke(query)} == {"alpha"}


@pytest.mark.parametrize("bad", [
    {"colour": "red"},
    {"min_trust": "absolute"},
    {"modified_from": "not a date"},
    {"source": [""]},
    Filters(modified_from=NEW, modified_to=OLD),
])
def test_an_invalid_filter_raises_filter_error(indexed, bad):
    with pytest.raises(FilterError):
        RagqaRetriever(retriever=HybridRetriever(indexed), filters=bad)
    with pytest.raises(FilterError):
        RagqaRetriever.from_services(indexed, filters=bad)


def test_ainvoke_matches_invoke(indexed):
    retriever = RagqaRetriever(retriever=HybridRetriever(indexed, mode="rrf"), k=3)
    query = "connection pool sockets"
    docs = asyncio.run(retriever.ainvoke(query))
    assert len(docs) == 3 and docs[0].metadata["doc_id"] == "alpha:pool.md"
    assert docs == retriever.invoke(query)


class _Slow:
    """A ragqa retriever that blocks, and notes the thread it ran on."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.threads = inner, []

    def retrieve(self, query: str, k: int = 10, filters: Filters | None = None) -> list:
        self.threads.append(threading.get_ident())
        time.sleep(0.3)
        return self.inner.retrieve(query, k=k, filters=filters)


def test_ainvoke_does_not_block_the_event_loop(indexed):
    slow = _Slow(HybridRetriever(indexed))
    retriever = RagqaRetriever(retriever=slow, k=2)

    async def main() -> tuple[list[Document], int]:
        task = asyncio.create_task(retriever.ainvoke("response caching ETag"))
        ticks = 0
        while not task.done():
            await asyncio.sleep(0.01)
            ticks += 1
        return await task, ticks

    docs, ticks = asyncio.run(main())
    assert docs[0].metadata["doc_id"] == "alpha:cache.md"
    assert ticks >= 10  # the loop kept running while the search slept
    assert slow.threads and slow.threads[0] != threading.get_ident()


def test_from_services_uses_the_retrieval_settings(indexed, monkeypatch):
    default = RagqaRetriever.from_services(indexed)
    assert default.k == indexed.settings.retrieval.top_k == 8
    docs = default.invoke("exponential backoff retries")
    assert docs[0].metadata["doc_id"] == "beta:retry.md" and "rrf" in docs[0].metadata["explain"]
    monkeypatch.setattr(indexed.settings, "retrieval", RetrievalSettings(mode="bm25", top_k=2, candidates=5))
    configured = RagqaRetriever.from_services(indexed, filters={"source": "alpha"})
    docs = configured.invoke("requests")
    assert configured.k == 2 and len(docs) == 2
    assert all(d.metadata["source"] == "alpha" and set(d.metadata["explain"]) == {"bm25", "bm25_rank"}
               for d in docs)
    overridden = RagqaRetriever.from_services(indexed, k=1, mode="vector").invoke("requests")
    assert len(overridden) == 1 and "vector" in overridden[0].metadata["explain"]
    assert "bm25" not in overridden[0].metadata["explain"]


class _PromptSpy(BaseCallbackHandler):
    """Records the messages every chat model of a run was called with."""

    def __init__(self) -> None:
        self.prompts: list[list[BaseMessage]] = []

    def on_chat_model_start(self, serialized: dict, messages: list[list[BaseMessage]], **kwargs: Any) -> None:
        self.prompts.extend(messages)


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(f"[{d.metadata['title']}]({d.metadata['url']})\n{d.page_content}" for d in docs)


@pytest.mark.parametrize("use_async", [False, True], ids=["invoke", "ainvoke"])
def test_retriever_inside_a_real_chain(indexed, use_async):
    retriever = RagqaRetriever(retriever=HybridRetriever(indexed, mode="hybrid"), k=1)
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer from the context only.\n\nContext:\n{context}"),
        ("human", "{question}"),
    ])
    model = GenericFakeChatModel(messages=iter([AIMessage("It checks the chain [TLS certificates].")]))
    answer = ({"context": lambda x: format_docs(x["context"]), "question": lambda x: x["question"]}
              | prompt | model | StrOutputParser())
    chain = RunnableParallel(context=retriever, question=RunnablePassthrough()).assign(answer=answer)
    spy = _PromptSpy()
    question = "How is the server certificate chain checked?"
    config = {"callbacks": [spy]}
    out = asyncio.run(chain.ainvoke(question, config)) if use_async else chain.invoke(question, config)

    assert out["answer"] == "It checks the chain [TLS certificates]." and out["question"] == question
    [doc] = out["context"]
    assert doc.metadata["doc_id"] == "alpha:tls.md" and doc.metadata["trust"] == "high"
    assert doc.id == doc.metadata["chunk_id"] and "cosine" in doc.metadata["explain"]
    [messages] = spy.prompts
    system, human = messages
    assert doc.page_content in system.content and "server certificate chain" in system.content
    assert f"[TLS certificates]({doc.metadata['url']})" in system.content
    assert "pool size" not in system.content  # only the retrieved passage went in
    assert human.content == question

