"""The Cohere embedder and reranker, through the real ``cohere`` SDK, against a local fake of the API.

``tests/cohere_server.py`` is a real HTTP server speaking Cohere's v2 wire format (auth,
validation and error bodies included), so these tests exercise the SDK's requests, its
retries and its exceptions, and ragqa's translation of them.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np
import pytest

from ingest.services import open_services
from rag.config import EmbedderSettings, Settings
from rag.embedders import make_embedder
from rag.embedders.cohere import CohereEmbedder
from rag.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigError,
    EmbedderError,
    RerankerError,
)
from rag.rerank import make_reranker
from rag.rerank.cohere import CohereReranker
from rag.types import Chunk, Embedder, Hit, Reranker
from tests.cohere_server import CohereServer, hash_embedding, serve_cohere
from tests.embedder_suite import EmbedderSuite
from tests.reranker_suite import RerankerSuite

T = TypeVar("T")
DOCS = [
    "The Eiffel Tower is in Paris.",
    "Reset your password from the account settings page.",
    "Password rules: at least twelve characters.",
    "Account deletion is permanent; a reset is impossible.",
]
QUERY = "reset password account"


@pytest.fixture
def server() -> Iterator[CohereServer]:
    with serve_cohere() as running:
        yield running


@pytest.fixture
def closing() -> Iterator[Callable[[T], T]]:
    """Registers clients to close after the test, passed or failed (no unclosed sockets)."""
    made: list = []

    def register(client: T) -> T:
        made.append(client)
        return client

    yield register
    for client in made:
        client.close()


@pytest.fixture
def embedder(server: CohereServer, closing: Callable) -> CohereEmbedder:
    return closing(CohereEmbedder(api_key=server.api_key, base_url=server.base_url, max_retries=0))


@pytest.fixture
def reranker(server: CohereServer, closing: Callable) -> CohereReranker:
    return closing(CohereReranker(api_key=server.api_key, base_url=server.base_url, max_retries=0))


def make_hits(texts: list[str]) -> list[Hit]:
    return [Hit(f"c{i}", 10.0 - i, f"d{i}", Chunk(id=f"c{i}", doc_id=f"d{i}", source="s", text=t, hash=f"h{i}"),
                {"bm25": 10.0 - i, "bm25_rank": float(i + 1)})
            for i, t in enumerate(texts)]


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def assert_one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text and "headers:" not in text
    return text


def unit(vector: list[float]) -> np.ndarray:
    arr = np.asarray(vector, dtype=np.float32)
    return arr / np.linalg.norm(arr)


# --- the fake server itself rejects what Cohere rejects ---------------------------------------


def test_fake_server_validates_like_cohere(server: CohereServer) -> None:
    auth = {"Authorization": f"Bearer {server.api_key}"}
    with httpx.Client(base_url=server.base_url) as http:
        r = http.post("/v2/embed", json={"model": "embed-english-v3.0", "texts": ["a"], "input_type": "search_query"})
        assert (r.status_code, r.json()["message"]) == (401, "no api key supplied")
        r = http.post("/v2/embed", headers={"Authorization": "Bearer nope"},
                      json={"model": "embed-english-v3.0", "texts": ["a"], "input_type": "search_query"})
        assert (r.status_code, r.json()["message"]) == (401, "invalid api token")
        r = http.post("/v2/embed", headers=auth, json={"model": "embed-english-v3.0", "texts": ["a"]})
        assert r.status_code == 400 and "valid input_type must be provided" in r.json()["message"]
        r = http.post("/v2/embed", headers=auth, json={"model": "embed-english-v3.0", "texts": ["a"] * 97,
                                                       "input_type": "search_document"})
        assert r.status_code == 400 and "at most 96 - received 97" in r.json()["message"]
        r = http.post("/v2/rerank", headers=auth, json={"model": "rerank-v3.5", "query": "q", "documents": []})
        assert r.status_code == 400 and "list of documents must not be empty" in r.json()["message"]
        r = http.post("/v2/rerank", headers=auth, json={"model": "rerank-v3.5", "query": "q", "documents": ["a"],
                                                        "top_k": 1})
        assert r.status_code == 422 and "'top_k' is not a valid field" in r.json()["message"]
        r = http.post("/v2/rerank", headers=auth, json={"model": "rerank-v3.5", "query": QUERY, "documents": DOCS,
                                                        "top_n": 2})
        body = r.json()
        assert r.status_code == 200 and body["id"] and body["meta"]["billed_units"]["search_units"] == 1
        assert [x["index"] for x in body["results"]] == [1, 3]


# --- the reranker ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_reranker() -> Iterator[CohereReranker]:
    with serve_cohere() as running:
        reranker = CohereReranker(api_key=running.api_key, base_url=running.base_url, max_retries=0)
        yield reranker
        reranker.close()


class TestCohereRerankerContract(RerankerSuite):
    score_key = "cohere"

    @pytest.fixture
    def reranker(self, served_reranker: CohereReranker) -> CohereReranker:
        return served_reranker


def test_reranker_orders_by_relevance_and_keeps_explain(server: CohereServer, reranker: CohereReranker) -> None:
    assert isinstance(reranker, Reranker) and reranker.name == "cohere"
    out = reranker.rerank(QUERY, make_hits(DOCS))
    assert [h.chunk_id for h in out] == ["c1", "c3", "c2", "c0"]
    assert [round(h.score, 3) for h in out] == [1.0, 0.667, 0.333, 0.0]
    for h in out:
        assert h.explain["cohere"] == h.score
        i = int(h.chunk_id[1:])
        assert h.explain["bm25"] == 10.0 - i and h.explain["bm25_rank"] == i + 1
        assert h.doc_id == f"d{i}" and h.chunk is not None and h.chunk.text == DOCS[i]
    (request,) = server.calls("/v2/rerank")
    assert request["model"] == "rerank-v3.5" and request["query"] == QUERY
    assert request["documents"] == DOCS and "top_n" not in request


def test_reranker_top_n(server: CohereServer, reranker: CohereReranker) -> None:
    out = reranker.rerank(QUERY, make_hits(DOCS), top_n=2)
    assert [h.chunk_id for h in out] == ["c1", "c3"]
    assert server.calls("/v2/rerank")[-1]["top_n"] == 2
    out = reranker.rerank(QUERY, make_hits(DOCS), top_n=10)  # more than there are: all, none asked
    assert len(out) == 4 and "top_n" not in server.calls("/v2/rerank")[-1]
    assert reranker.rerank(QUERY, make_hits(DOCS), top_n=0) == []
    assert reranker.rerank(QUERY, []) == []
    assert len(server.requests) == 2


def test_reranker_puts_hits_without_chunks_last(server: CohereServer, reranker: CohereReranker) -> None:
    hits = [Hit("bare", 99.0, "dx", None, {"bm25": 99.0}), *make_hits(DOCS[:2])]
    out = reranker.rerank(QUERY, hits)
    assert [h.chunk_id for h in out] == ["c1", "c0", "bare"]
    assert out[-1].score == 0.0 and out[-1].explain == {"bm25": 99.0}
    assert server.calls("/v2/rerank")[0]["documents"] == DOCS[:2]
    assert [h.chunk_id for h in reranker.rerank(QUERY, hits, top_n=2)] == ["c1", "c0"]
    assert "top_n" not in server.calls("/v2/rerank")[1]  # both documents are wanted
    bare = reranker.rerank(QUERY, hits[:1])  # nothing to send: no request
    assert [(h.chunk_id, h.score) for h in bare] == [("bare", 0.0)] and len(server.requests) == 2


def test_reranker_bad_key(server: CohereServer, closing: Callable) -> None:
    reranker = closing(CohereReranker(api_key="wrong", base_url=server.base_url, max_retries=0))
    with pytest.raises(BackendUnavailable) as exc:
        reranker.rerank(QUERY, make_hits(DOCS))
    text = assert_one_line(exc)
    assert "invalid api token" in text and "retrieval.reranker.api_key" in text


def test_reranker_server_error_carries_its_message(server: CohereServer, reranker: CohereReranker) -> None:
    server.fail(500, "the ranking cluster is on fire")
    with pytest.raises(RerankerError) as exc:
        reranker.rerank(QUERY, make_hits(DOCS))
    assert "the ranking cluster is on fire" in assert_one_line(exc) and "500" in str(exc.value)
    server.fail(429, "You are using a Trial key, which is limited to 10 API calls / minute.")
    with pytest.raises(RerankerError, match="429.*Trial key"):
        reranker.rerank(QUERY, make_hits(DOCS))
    assert len(server.requests) == 2  # max_retries=0: no retry


def test_reranker_retries_a_transient_failure(server: CohereServer, closing: Callable) -> None:
    server.fail(503, "overloaded", count=1)
    reranker = closing(CohereReranker(api_key=server.api_key, base_url=server.base_url, max_retries=1))
    out = reranker.rerank(QUERY, make_hits(DOCS), top_n=1)
    assert [h.chunk_id for h in out] == ["c1"] and len(server.requests) == 2


def test_reranker_unreachable_and_timeout(server: CohereServer, closing: Callable) -> None:
    down = closing(CohereReranker(api_key="k", base_url=closed_port_url(), max_retries=0))
    with pytest.raises(BackendUnavailable, match="cannot reach Cohere rerank") as exc:
        down.rerank(QUERY, make_hits(DOCS))
    assert_one_line(exc)
    server.delay_s = 2.0
    slow = closing(CohereReranker(api_key=server.api_key, base_url=server.base_url, timeout_s=0.3, max_retries=0))
    with pytest.raises(BackendTimeout, match="did not answer within 0.3 s"):
        slow.rerank(QUERY, make_hits(DOCS))


def test_make_reranker_from_settings(server: CohereServer, closing: Callable, tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, retrieval={"reranker": {
        "backend": "cohere", "model": "rerank-english-v3.0", "api_key": server.api_key,
        "base_url": server.base_url + "/", "max_retries": 0}})
    reranker = closing(make_reranker(open_services(settings)))
    assert isinstance(reranker, CohereReranker)
    assert [h.chunk_id for h in reranker.rerank(QUERY, make_hits(DOCS), top_n=3)] == ["c1", "c3", "c2"]
    assert server.calls("/v2/rerank")[0]["model"] == "rerank-english-v3.0"


# --- the embedder ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served_embedder() -> Iterator[CohereEmbedder]:
    with serve_cohere() as running:
        embedder = CohereEmbedder(api_key=running.api_key, base_url=running.base_url, max_retries=0)
        yield embedder
        embedder.close()


class TestCohereEmbedderContract(EmbedderSuite):
    @pytest.fixture
    def embedder(self, served_embedder: CohereEmbedder) -> CohereEmbedder:
        return served_embedder


def test_embedder_input_types_unit_vectors_and_closeness(server: CohereServer, embedder: CohereEmbedder) -> None:
    assert isinstance(embedder, Embedder)
    assert (embedder.name, embedder.dim) == ("cohere:embed-multilingual-v3.0", 1024)
    docs = embedder.embed_documents(["the cat sat on the mat", "stock markets fell sharply today"])
    query = embedder.embed_query("where did the cat sit on the mat")
    assert docs.dtype == np.float32 and docs.shape == (2, 1024) and query.shape == (1024,)
    np.testing.assert_allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    assert abs(float(np.linalg.norm(query)) - 1.0) < 1e-5
    assert float(docs[0] @ query) > 0.5 > float(docs[1] @ query)
    doc_call, query_call = server.calls("/v2/embed")
    assert doc_call["input_type"] == "search_document" and query_call["input_type"] == "search_query"
    for call in (doc_call, query_call):
        assert call["model"] == "embed-multilingual-v3.0" and call["embedding_types"] == ["float"]
    assert query_call["texts"] == ["where did the cat sit on the mat"]


def test_embedder_batches_of_96_in_order(server: CohereServer, embedder: CohereEmbedder) -> None:
    texts = [f"passage {i} about topic t{i % 7} and item n{i}" for i in range(200)]
    vectors = embedder.embed_documents(texts)
    calls = server.calls("/v2/embed")
    assert [len(c["texts"]) for c in calls] == [96, 96, 8]
    assert [t for c in calls for t in c["texts"]] == texts
    assert vectors.shape == (200, 1024)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert abs(np.linalg.norm(hash_embedding(texts[150], 1024)) - 1.0) > 0.5  # the server's are not unit
    for i in (0, 95, 96, 150, 199):
        np.testing.assert_allclose(vectors[i], unit(hash_embedding(texts[i], 1024)), atol=1e-6)
    assert embedder.embed_documents([]).shape == (0, 1024) and len(server.requests) == 3


def test_embedder_dimensions(server: CohereServer, closing: Callable) -> None:
    light = closing(CohereEmbedder("embed-english-light-v3.0", api_key=server.api_key, base_url=server.base_url))
    assert light.dim == 384 and server.requests == []  # known: nothing sent
    assert light.embed_query("hello").shape == (384,)
    server.embed_models["acme-embed-ft"] = 256
    custom = closing(CohereEmbedder("acme-embed-ft", api_key=server.api_key, base_url=server.base_url))
    assert custom.dim == 256 and custom.dim == 256  # asked once, then remembered
    assert len(server.calls("/v2/embed")) == 2  # one probe for the unknown model
    server.embed_models["embed-english-v3.0"] = 512  # not what the model should return
    wrong = closing(CohereEmbedder("embed-english-v3.0", api_key=server.api_key, base_url=server.base_url))
    with pytest.raises(EmbedderError, match="512 dimensions .* expected 1024"):
        wrong.embed_query("hello")


def test_embedder_key_problems(server: CohereServer, closing: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CO_API_KEY", raising=False)
    monkeypatch.delenv("COHERE_API_KEY", raising=False)
    keyless = closing(CohereEmbedder(base_url=server.base_url))
    with pytest.raises(ConfigError, match="needs an API key: set embedder.api_key or CO_API_KEY"):
        keyless.embed_query("hello")
    assert server.requests == []
    wrong = closing(CohereEmbedder(api_key="wrong", base_url=server.base_url, max_retries=0))
    with pytest.raises(BackendUnavailable) as exc:
        wrong.embed_documents(["hello"])
    text = assert_one_line(exc)
    assert "refused the API key (401: invalid api token)" in text and "embedder.api_key" in text
    monkeypatch.setenv("CO_API_KEY", server.api_key)  # the SDK's own variable works too
    from_env = closing(CohereEmbedder(base_url=server.base_url))
    assert from_env.embed_query("hello").shape == (1024,)


def test_embedder_api_failures(server: CohereServer, embedder: CohereEmbedder, closing: Callable) -> None:
    server.fail(500, "embedding shard 7 crashed")
    with pytest.raises(EmbedderError) as exc:
        embedder.embed_documents(["hello"])
    assert "embedding shard 7 crashed" in assert_one_line(exc) and not isinstance(exc.value, BackendError)
    server.fail(503, "maintenance")
    with pytest.raises(BackendUnavailable, match="unavailable \\(503\\): maintenance"):
        embedder.embed_query("hello")
    server.fail_status = None
    unknown = closing(CohereEmbedder("embed-nonexistent-v9", api_key=server.api_key, base_url=server.base_url))
    with pytest.raises(ConfigError, match="model 'embed-nonexistent-v9' not found"):
        unknown.embed_query("hello")


def test_embedder_unreachable_and_timeout(server: CohereServer, closing: Callable) -> None:
    down = closing(CohereEmbedder(api_key="k", base_url=closed_port_url(), max_retries=0))
    with pytest.raises(BackendUnavailable, match="cannot reach Cohere embed at http://127.0.0.1:") as exc:
        down.embed_documents(["hello"])
    assert_one_line(exc)
    server.delay_s = 2.0
    slow = closing(CohereEmbedder(api_key=server.api_key, base_url=server.base_url, timeout_s=0.3, max_retries=0))
    with pytest.raises(BackendTimeout):
        slow.embed_query("hello")


def test_make_embedder_from_settings(server: CohereServer, closing: Callable) -> None:
    settings = EmbedderSettings(backend="cohere", api_key=server.api_key, base_url=server.base_url, max_retries=0)
    embedder = closing(make_embedder(settings))
    assert isinstance(embedder, CohereEmbedder) and embedder.batch_size == 96  # the default 32 is for local models
    assert embedder.embed_documents([f"text {i}" for i in range(100)]).shape == (100, 1024)
    assert [len(c["texts"]) for c in server.calls("/v2/embed")] == [96, 4]


def test_make_embedder_explicit_batch_size(server: CohereServer, closing: Callable) -> None:
    settings = EmbedderSettings(backend="cohere", model="embed-english-v3.0", api_key=server.api_key,
                                base_url=server.base_url, batch_size=50)
    embedder = closing(make_embedder(settings))
    embedder.embed_documents([f"text {i}" for i in range(120)])
    assert [len(c["texts"]) for c in server.calls("/v2/embed")] == [50, 50, 20]
    assert {c["model"] for c in server.calls("/v2/embed")} == {"embed-english-v3.0"}
    too_big = closing(make_embedder(EmbedderSettings(backend="cohere", api_key="k", batch_size=500)))
    assert too_big.batch_size == 96 and too_big.name == "cohere:embed-multilingual-v3.0"


def test_importing_ragqa_does_not_import_the_sdk() -> None:
    code = ("import sys, rag.embedders, rag.rerank, rag.embedders.cohere, rag.rerank.cohere; "
            "print('cohere' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"
