"""The ``openai`` embedder, through the real ``openai`` SDK, against a real embeddings server.

``tests/embeddings_server.py`` speaks the OpenAI ``/v1/embeddings`` protocol (and vLLM's
``/tokenize``) on loopback, computing its vectors with the packaged MiniLM, so the remote
embedder's vectors, chunks and retrieval can be checked against the local model's, and its
retries and errors against scripted faults of the same server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from ingest.pipeline import reindex
from ingest.registry import source_from_argument
from ingest.services import open_services
from rag.config import EmbedderSettings
from rag.embedders import SentenceTransformerEmbedder, make_embedder
from rag.embedders.openai_server import OpenAIEmbedder
from rag.errors import BackendTimeout, BackendUnavailable, ConfigError, EmbedderError
from rag.services import Services
from rag.types import Embedder
from tests.conftest import make_settings
from tests.embedder_suite import EmbedderSuite
from tests.embeddings_server import EmbeddingsServer, serve_embeddings

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DOCS = [
    "The Eiffel Tower is in Paris, the capital of France.",
    "Reset your password from the account settings page.",
    "Password rules: at least twelve characters, one digit.",
    "Account deletion is permanent; a reset is impossible afterwards.",
    "Rust manages memory with ownership instead of a garbage collector.",
]


@pytest.fixture(scope="module")
def minilm() -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(progress=False)


def _tokenize(local: SentenceTransformerEmbedder) -> Callable[[str, bool], list[int]]:
    def tokenize(text: str, special: bool) -> list[int]:
        tok = local.tokenizer
        if hasattr(tok, "encode_batch"):
            return list(tok.encode(text, add_special_tokens=special).ids)
        return list(tok(text, add_special_tokens=special)["input_ids"])

    return tokenize


@pytest.fixture
def server(minilm: SentenceTransformerEmbedder) -> Iterator[EmbeddingsServer]:
    with serve_embeddings(MODEL, minilm.embed_documents, _tokenize(minilm), max_model_len=256) as running:
        yield running


@pytest.fixture
def make(server: EmbeddingsServer) -> Iterator[Callable[..., OpenAIEmbedder]]:
    made: list[OpenAIEmbedder] = []

    def build(**kwargs: object) -> OpenAIEmbedder:
        kwargs.setdefault("max_retries", 2)
        embedder = OpenAIEmbedder(str(kwargs.pop("base_url", server.base_url)), str(kwargs.pop("model", MODEL)),
                                  **kwargs)  # type: ignore[arg-type]
        made.append(embedder)
        return embedder

    yield build
    for embedder in made:
        embedder.close()


@pytest.fixture(scope="module")
def served(minilm: SentenceTransformerEmbedder) -> Iterator[OpenAIEmbedder]:
    with serve_embeddings(MODEL, minilm.embed_documents, _tokenize(minilm), max_model_len=256) as running:
        embedder = OpenAIEmbedder(running.base_url, MODEL, max_retries=2)
        yield embedder
        embedder.close()


class TestOpenAIContract(EmbedderSuite):
    @pytest.fixture
    def embedder(self, served: OpenAIEmbedder) -> OpenAIEmbedder:
        return served


def test_vectors_equal_the_local_models(make: Callable[..., OpenAIEmbedder], minilm: SentenceTransformerEmbedder,
                                        server: EmbeddingsServer) -> None:
    embedder = make(batch_size=2)
    assert embedder.name == f"openai:{MODEL}" and embedder.languages == frozenset({"en"})
    remote = embedder.embed_documents(DOCS)
    assert isinstance(embedder, Embedder)  # after embedding: the Protocol check reads ``dim``
    local = minilm.embed_documents(DOCS)
    assert remote.shape == (5, 384) and remote.dtype == np.float32 and embedder.dim == 384
    assert np.allclose(np.linalg.norm(remote, axis=1), 1.0, atol=1e-5)
    assert float(np.min(np.sum(remote * local, axis=1))) > 0.9999
    query = embedder.embed_query("how do I change my password")
    assert float(query @ minilm.embed_query("how do I change my password")) > 0.9999
    assert int(np.argmax(remote @ query)) == 1
    bodies = server.calls()
    # Batches of 2, in order, then the query. The SDK may send a batch again (a connection dropped
    # under load): a retry repeats the same body, so count each distinct batch once.
    batches = [b["input"] for i, b in enumerate(bodies) if i == 0 or b["input"] != bodies[i - 1]["input"]]
    assert [len(inputs) for inputs in batches] == [2, 2, 1, 1]
    assert [text for inputs in batches[:3] for text in inputs] == DOCS
    assert all(b["encoding_format"] == "float" and b["model"] == MODEL and "dimensions" not in b for b in bodies)
    assert all(b["truncate_prompt_tokens"] == 256 for b in bodies)  # vLLM (it serves /tokenize): cut, not refused
    assert embedder.embed_documents([]).shape == (0, 384)


def test_chunk_sizes_fit_the_served_model(make: Callable[..., OpenAIEmbedder],
                                          minilm: SentenceTransformerEmbedder, server: EmbeddingsServer) -> None:
    embedder = make()
    assert embedder.max_text_tokens == minilm.max_text_tokens == 254  # vLLM's max_model_len, less [CLS] [SEP]
    for text in DOCS + ["北京是中国的首都。", "Tokenizers split unbelievably long words into word-pieces."]:
        assert embedder.count_tokens(text) >= minilm.count_tokens(text)  # an over-estimate: chunks fit
    # The estimate asks nothing of the server (a request per count would make chunking slow).
    assert len(server.calls("/tokenize")) == 1


def test_estimates_tokens_without_a_tokenize_endpoint(minilm: SentenceTransformerEmbedder) -> None:
    with serve_embeddings(MODEL, minilm.embed_documents) as bare:
        embedder = OpenAIEmbedder(bare.base_url, MODEL)
        try:
            text = "Tokenizers split unbelievably long words into word-pieces. 北京是中国的首都。"
            assert embedder.max_text_tokens is None
            assert embedder.count_tokens(text) >= minilm.count_tokens(text)  # an over-estimate: chunks fit
        finally:
            embedder.close()


def test_an_index_built_through_it_answers_like_the_local_model(server: EmbeddingsServer, tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, text in enumerate(DOCS):
        (folder / f"doc{i}.md").write_text(f"# Note {i}\n\n{text}\n", encoding="utf-8")
    remote = {"backend": "openai", "base_url": server.base_url, "model": MODEL, "progress": False}
    local = {"backend": "sentence-transformers", "progress": False}
    questions = ["how do I change my password", "where is the Eiffel Tower", "garbage collection in Rust"]
    answers = []
    for name, embedder in (("remote", remote), ("local", local)):
        services = open_services(make_settings(tmp_path / name, embedder=embedder))
        try:
            services.state.add_source(source_from_argument(str(folder), name="notes"))
            report = reindex(services, "notes", "full")
            assert report.chunks_embedded == len(DOCS)
            answers.append([[(h.chunk_id, round(h.score, 4)) for h in
                             services.vector.search(services.embedder.embed_query(q), k=3)] for q in questions])
        finally:
            _close(services)
    assert answers[0] == answers[1]
    assert server.calls()  # the remote index really went through the server

    # The index records openai:<model>:384; another served model is refused, even of that size.
    other = dict(remote, model="BAAI/bge-small-en-v1.5")
    with serve_embeddings("BAAI/bge-small-en-v1.5", _same_size) as second:
        other["base_url"] = second.base_url
        services = open_services(make_settings(tmp_path / "remote", embedder=other))
        try:
            with pytest.raises(ConfigError, match=f"built with embedder openai:{MODEL}:384"):
                reindex(services, "notes", "full")
        finally:
            _close(services)


def _close(services: Services) -> None:
    """Services leave the embedder open; the remote one holds connections."""
    close = getattr(services.__dict__.get("_embedder"), "close", None)
    if close is not None:
        close()
    services.close()


def _same_size(texts: list[str]) -> np.ndarray:
    return np.ones((len(texts), 384), dtype=np.float32)


def test_retries_a_503_then_succeeds(make: Callable[..., OpenAIEmbedder], server: EmbeddingsServer) -> None:
    server.fail(503, "the engine is starting", count=1)
    assert make().embed_documents(DOCS[:2]).shape == (2, 384)
    assert len(server.calls()) == 2


def test_waits_as_a_429_retry_after_asks(make: Callable[..., OpenAIEmbedder], server: EmbeddingsServer) -> None:
    server.fail(429, "too many requests", count=1, retry_after="1")
    started = time.monotonic()
    assert make().embed_query("hello").shape == (384,)
    assert len(server.calls()) == 2 and time.monotonic() - started >= 0.9


def test_a_400_fails_at_once_with_the_servers_message(make: Callable[..., OpenAIEmbedder],
                                                      server: EmbeddingsServer) -> None:
    server.serve_tokenize = False  # not vLLM, as far as the embedder can tell: nothing is cut
    embedder = make()
    with pytest.raises(EmbedderError, match=r"rejected the request \(400\): This model's maximum context length is 256") as err:
        embedder.embed_documents(["word " * 600])
    assert server.base_url in str(err.value)
    assert len(server.calls()) == 1  # not retried


def test_vllm_cuts_an_overlong_passage_as_the_local_model_does(make: Callable[..., OpenAIEmbedder],
                                                               minilm: SentenceTransformerEmbedder) -> None:
    text = "Code like x[i] = f(y, *z) ** 2 has more tokens than characters/3. " * 40
    assert minilm.count_tokens(text) > 256
    remote = make().embed_documents([text])[0]
    assert float(remote @ minilm.embed_documents([text])[0]) > 0.9999


def test_gives_up_after_the_retries(make: Callable[..., OpenAIEmbedder], server: EmbeddingsServer) -> None:
    server.fail(503, "overloaded")
    with pytest.raises(BackendUnavailable, match=rf"{server.base_url}/embeddings is unavailable \(503\): overloaded"):
        make(max_retries=1).embed_query("hello")
    assert len(server.calls()) == 2


def test_a_wrong_dimension_is_an_error(make: Callable[..., OpenAIEmbedder], server: EmbeddingsServer) -> None:
    embedder = make()
    assert embedder.dim == 384
    server.truncate_to = 256
    with pytest.raises(EmbedderError, match="returned 256 dimensions .* expected 384"):
        embedder.embed_documents(DOCS)
    # Asked-for dimensions are sent, and a server that ignores them is caught on the first answer.
    server.truncate_to = None
    assert make(dimensions=256).embed_query("hi").shape == (256,)
    assert server.calls()[-1]["dimensions"] == 256
    server.ignore_dimensions = True
    with pytest.raises(EmbedderError, match="returned 384 dimensions .* expected 128"):
        make(dimensions=128).embed_query("hi")


def test_a_hung_server_is_a_timeout(make: Callable[..., OpenAIEmbedder], server: EmbeddingsServer) -> None:
    server.delay_s = 3.0
    started = time.monotonic()
    with pytest.raises(BackendTimeout, match=rf"{server.base_url}/embeddings did not answer within 0.3 s"):
        make(timeout_s=0.3, max_retries=0).embed_query("hello")
    assert time.monotonic() - started < 2.0


def test_unreachable_server_and_unknown_model(make: Callable[..., OpenAIEmbedder], server: EmbeddingsServer) -> None:
    with pytest.raises(BackendUnavailable, match="cannot reach embeddings server http://127.0.0.1:9/v1/embeddings"):
        make(base_url="http://127.0.0.1:9/v1", max_retries=0).embed_query("hello")
    with pytest.raises(ConfigError, match="does not exist.*404"):
        make(model="no-such-model").embed_query("hello")


def test_api_key_is_sent(minilm: SentenceTransformerEmbedder) -> None:
    with serve_embeddings(MODEL, minilm.embed_documents, api_key="s3cret") as guarded:
        refused = OpenAIEmbedder(guarded.base_url, MODEL, max_retries=0)
        allowed = OpenAIEmbedder(guarded.base_url, MODEL, api_key="s3cret")
        try:
            with pytest.raises(BackendUnavailable, match="refused the API key"):
                refused.embed_query("hello")
            assert allowed.embed_query("hello").shape == (384,)
        finally:
            refused.close()
            allowed.close()


def test_make_embedder_from_settings(server: EmbeddingsServer) -> None:
    embedder = make_embedder(EmbedderSettings(backend="openai", base_url=server.base_url, model=MODEL,
                                              dimensions=128, max_retries=1, timeout_s=5))
    assert isinstance(embedder, OpenAIEmbedder)
    assert (embedder.batch_size, embedder.dimensions, embedder.max_retries) == (64, 128, 1)
    assert make_embedder(EmbedderSettings(backend="openai", base_url=server.base_url, model=MODEL,
                                          batch_size=8)).batch_size == 8  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="embedder.base_url"):
        make_embedder(EmbedderSettings(backend="openai", model=MODEL))
    with pytest.raises(ConfigError, match="embedder.model"):
        make_embedder(EmbedderSettings(backend="openai", base_url=server.base_url))
