"""A real HTTP server on 127.0.0.1 that speaks Cohere's v2 wire protocol, for tests through the SDK.

``POST /v2/embed`` and ``POST /v2/rerank`` check ``Authorization: Bearer <key>`` and validate
their bodies the way api.cohere.com does (with its error bodies, ``{"message": ...}``, where
they are known), and answer with the real response shapes. Their semantics are simple and
deterministic:

- embeddings hash each lower-cased word to a signed dimension of the model's size, so texts
  that share words come out close (the vectors are not unit length, as Cohere's are not
  exactly either);
- a rerank relevance score is the share of the query's distinct words found in the document,
  in [0, 1]; ties keep document order.

Knobs to misbehave: ``fail_status``/``fail_message`` (for the next ``fail_count`` requests, or
all when it is None), ``delay_s`` (wait before answering: a hang), ``retry_after``. Every
request is recorded in ``requests`` (path, headers, parsed JSON body).

Example::

    with serve_cohere() as server:
        client = cohere.ClientV2(api_key=server.api_key, base_url=server.base_url)
        client.embed(model="embed-english-v3.0", texts=["hi"], input_type="search_query",
                     embedding_types=["float"])
        assert server.calls("/v2/embed")[0]["input_type"] == "search_query"
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.json_api_server import ApiFailure, JsonHandler, Knobs, serve

__all__ = ["CohereServer", "serve_cohere", "EMBED_MODELS", "RERANK_MODELS", "words"]

#: Embed models and their dimensions; v3 and later need ``input_type``.
EMBED_MODELS = {
    "embed-english-v3.0": 1024, "embed-multilingual-v3.0": 1024,
    "embed-english-light-v3.0": 384, "embed-multilingual-light-v3.0": 384, "embed-v4.0": 1536,
}
RERANK_MODELS = {"rerank-v3.5", "rerank-english-v3.0", "rerank-multilingual-v3.0",
                 "rerank-v4.0-pro", "rerank-v4.0-fast"}
INPUT_TYPES = {"search_document", "search_query", "classification", "clustering", "image"}
EMBEDDING_TYPES = {"float", "int8", "uint8", "binary", "ubinary", "base64"}
EMBED_FIELDS = {"model", "input_type", "texts", "images", "inputs", "max_tokens", "output_dimension",
                "embedding_types", "truncate", "priority"}
RERANK_FIELDS = {"model", "query", "documents", "top_n", "max_tokens_per_doc", "relevant_spans", "priority"}
MAX_TEXTS = 96
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def hash_embedding(text: str, dim: int) -> list[float]:
    vector = [0.0] * dim
    for word in words(text):
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dim
        vector[index] += 1.0 if digest[4] & 1 else -1.0
    return vector


def overlap(query: str, document: str) -> float:
    wanted = set(words(query))
    return len(wanted & set(words(document))) / len(wanted) if wanted else 0.0


@dataclass
class CohereServer(Knobs):
    """The state of a running fake Cohere API. Tests change the knobs while it runs."""

    api_key: str = "test-key"
    embed_models: dict[str, int] = field(default_factory=lambda: dict(EMBED_MODELS))
    rerank_models: set[str] = field(default_factory=lambda: set(RERANK_MODELS))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, status: int, message: str, count: int | None = None) -> None:
        self.fail_status, self.fail_message, self.fail_count = status, message, count

    # -- the endpoints ------------------------------------------------------------------------
    def embed(self, body: dict[str, Any]) -> dict[str, Any]:
        _unknown_fields(body, EMBED_FIELDS, "embed")
        model = _model(body, self.embed_models)
        dim = self.embed_models[model]
        input_type = body.get("input_type")
        if input_type is None or input_type not in INPUT_TYPES:
            raise ApiFailure(400, "invalid request: valid input_type must be provided with the provided model")
        texts = body.get("texts")
        if texts is None or not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ApiFailure(400, "invalid request: texts must be a list of strings")
        if len(texts) > MAX_TEXTS:
            raise ApiFailure(400, f"invalid request: total number of texts must be at most {MAX_TEXTS} "
                                  f"- received {len(texts)}")
        types = body.get("embedding_types") or ["float"]
        if unknown := [t for t in types if t not in EMBEDDING_TYPES]:
            raise ApiFailure(400, f"invalid request: embedding_types contains an invalid type {unknown[0]!r}")
        if types != ["float"]:
            raise ApiFailure(400, "this fake Cohere server only returns float embeddings")
        return {
            "id": str(uuid.uuid4()),
            "embeddings": {"float": [hash_embedding(t, dim) for t in texts]},
            "texts": texts,
            "meta": {"api_version": {"version": "2"},
                     "billed_units": {"input_tokens": sum(len(words(t)) for t in texts)}},
            "response_type": "embeddings_by_type",
        }

    def rerank(self, body: dict[str, Any]) -> dict[str, Any]:
        _unknown_fields(body, RERANK_FIELDS, "rerank")
        _model(body, self.rerank_models)
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ApiFailure(400, "invalid request: query must not be empty")
        documents = body.get("documents")
        if not documents:
            raise ApiFailure(400, "invalid request: list of documents must not be empty")
        if not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
            raise ApiFailure(400, "invalid request: documents must be a list of strings")
        top_n = body.get("top_n")
        if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1):
            raise ApiFailure(400, "invalid request: top_n must be a positive integer")
        ranked = sorted(range(len(documents)), key=lambda i: (-overlap(query, documents[i]), i))
        results = [{"index": i, "relevance_score": overlap(query, documents[i])}
                   for i in ranked[: top_n or len(documents)]]
        return {"id": str(uuid.uuid4()), "results": results,
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}}}


def _model(body: dict[str, Any], known: dict[str, int] | set[str]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiFailure(400, "invalid request: model must be specified")
    if model not in known:
        raise ApiFailure(404, f"model '{model}' not found, make sure the correct model ID was used "
                              "and that you have access to the model.")
    return model


def _unknown_fields(body: dict[str, Any], allowed: set[str], endpoint: str) -> None:
    for name in body:
        if name not in allowed:
            raise ApiFailure(422, f"unknown field: parameter '{name}' is not a valid field. For proper "
                                  f"usage, please refer to https://docs.cohere.com/reference/{endpoint}")


class _Handler(JsonHandler):
    def do_POST(self) -> None:
        state: CohereServer = self.server.state
        body, failing = self.receive()
        if self.headers.get("Authorization") is None:
            return self.send(401, {"message": "no api key supplied"})
        if self.headers.get("Authorization") != f"Bearer {state.api_key}":
            return self.send(401, {"message": "invalid api token"})
        if failing:
            return self.send(state.fail_status or 500, {"id": str(uuid.uuid4()), "message": state.fail_message})
        endpoint = {"/v2/embed": state.embed, "/v2/rerank": state.rerank}.get(self.path)
        if endpoint is None:
            return self.send(404, {"message": f"path {self.path} not found"})
        if not isinstance(body, dict):
            return self.send(400, {"message": "invalid request: cannot parse the request body as JSON"})
        try:
            self.send(200, endpoint(body))
        except ApiFailure as exc:
            self.send(exc.status, {"id": str(uuid.uuid4()), "message": exc.message})


@contextmanager
def serve_cohere(api_key: str = "test-key") -> Iterator[CohereServer]:
    """Run a fake Cohere API on a free port of 127.0.0.1 for the duration of the block."""
    with serve(_Handler, CohereServer(api_key=api_key)) as state:
        yield state
