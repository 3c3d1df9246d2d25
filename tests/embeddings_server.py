"""A real HTTP server on 127.0.0.1 that speaks the OpenAI embeddings protocol with real vectors.

``POST /v1/embeddings`` answers as vLLM's OpenAI-compatible server does (``{"object": "list",
"data": [{"object": "embedding", "index": i, "embedding": [...]}], "model", "usage"}``), with
vectors computed by a real model: the ``encode`` callable it is given (in the tests, the
packaged MiniLM through sentence-transformers). ``GET /v1/models`` lists the served model, and
``POST /tokenize`` answers as vLLM's does (``count``, ``tokens``, ``max_model_len``) when a
``tokenize`` callable is given (and ``serve_tokenize`` is on); otherwise it is a 404, as on
servers without one. With ``tokenize``, an input longer than ``max_model_len`` tokens is a 400,
unless the request sets vLLM's ``truncate_prompt_tokens``. Errors have
vLLM's and OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``.

Knobs to misbehave, changed by tests while it runs: ``fail_status``/``fail_message`` (for the
next ``fail_count`` embedding requests, or all when None), ``retry_after`` (a header on
failures), ``delay_s`` (wait before answering: a hang), ``truncate_to`` (answer with vectors
cut to this many dimensions: a server that changed model), ``ignore_dimensions`` (answer with
the model's size whatever a request asks, as servers without Matryoshka support do). Every request is recorded in
``requests`` (path, headers, parsed JSON body).

Example::

    with serve_embeddings("all-MiniLM-L6-v2", model.encode) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="none")
        client.embeddings.create(model="all-MiniLM-L6-v2", input=["hi"], encoding_format="float")
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tests.json_api_server import ApiFailure, JsonHandler, Knobs, serve

__all__ = ["EmbeddingsServer", "serve_embeddings"]

Encode = Callable[[list[str]], np.ndarray]
Tokenize = Callable[[str, bool], list[int]]


@dataclass(kw_only=True)
class EmbeddingsServer(Knobs):
    """The state of a running embeddings server. Tests change the knobs while it runs."""

    model: str
    encode: Encode
    tokenize: Tokenize | None = None
    max_model_len: int = 256
    api_key: str | None = None
    truncate_to: int | None = None
    ignore_dimensions: bool = False
    serve_tokenize: bool = True

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def calls(self, path: str = "/v1/embeddings") -> list[Any]:
        """The JSON bodies of the requests received for ``path``, in order."""
        return super().calls(path)

    def fail(self, status: int | None, message: str = "internal server error", count: int | None = None,
             retry_after: str | None = None) -> None:
        self.fail_status, self.fail_message, self.fail_count = status, message, count
        self.retry_after = retry_after

    # -- the endpoints ------------------------------------------------------------------------
    def embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model") != self.model:
            raise ApiFailure(404, f"The model `{body.get('model')}` does not exist.")
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs or not all(isinstance(t, str) for t in inputs):
            raise ApiFailure(400, "input must be a string or a non-empty list of strings")
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise ApiFailure(400, f"encoding_format must be float or base64, not {fmt!r}")
        truncate = body.get("truncate_prompt_tokens")
        if truncate is not None and (not isinstance(truncate, int) or truncate > self.max_model_len):
            raise ApiFailure(400, f"truncate_prompt_tokens value ({truncate}) is greater than "
                                  f"max_model_len ({self.max_model_len}). Please, select a smaller truncation size.")
        if self.tokenize is not None and truncate is None:  # else ``encode`` cuts at the model's length
            for text in inputs:
                if (n := len(self.tokenize(text, True))) > self.max_model_len:
                    raise ApiFailure(400, f"This model's maximum context length is {self.max_model_len} tokens. "
                                          f"However, you requested {n} tokens in the input for embedding "
                                          "generation. Please reduce the length of the input.")
        vectors = np.asarray(self.encode(inputs), dtype=np.float32)
        dimensions = body.get("dimensions")
        if dimensions is not None and not self.ignore_dimensions:
            if not isinstance(dimensions, int) or not 0 < dimensions <= vectors.shape[1]:
                raise ApiFailure(400, f"dimensions must be between 1 and {vectors.shape[1]}")
            vectors = vectors[:, :dimensions]
        if self.truncate_to is not None:  # a server that changed model
            vectors = vectors[:, : self.truncate_to]
        data = [{"object": "embedding", "index": i,
                 "embedding": (row.tolist() if fmt == "float" else base64.b64encode(row.tobytes()).decode())}
                for i, row in enumerate(vectors)]
        tokens = sum(len(self.tokenize(t, True)) if self.tokenize else len(t.split()) for t in inputs)
        return {"id": f"embd-{time.monotonic_ns()}", "object": "list", "created": int(time.time()),
                "model": self.model, "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    def tokenize_endpoint(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.tokenize is None or not self.serve_tokenize:
            raise ApiFailure(404, "Not Found")
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ApiFailure(400, "prompt must be a string")
        tokens = self.tokenize(prompt, bool(body.get("add_special_tokens", True)))
        return {"count": len(tokens), "max_model_len": self.max_model_len, "tokens": tokens, "token_strs": None}

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0,
                                            "owned_by": "ragqa-tests", "max_model_len": self.max_model_len}]}


class _Handler(JsonHandler):
    def do_GET(self) -> None:
        state: EmbeddingsServer = self.server.state
        if self.path == "/v1/models":
            return self.send(200, state.models())
        return self._error(404, "Not Found")

    def do_POST(self) -> None:
        state: EmbeddingsServer = self.server.state
        body, failing = self.receive(fallible=self.path == "/v1/embeddings")
        if state.api_key is not None and self.headers.get("Authorization") != f"Bearer {state.api_key}":
            return self._error(401, "Unauthorized")
        if failing:
            return self._error(state.fail_status or 500, state.fail_message)
        endpoint = {"/v1/embeddings": state.embeddings, "/tokenize": state.tokenize_endpoint}.get(self.path)
        if endpoint is None:
            return self._error(404, "Not Found")
        if not isinstance(body, dict):
            return self._error(400, "the request body is not a JSON object")
        try:
            self.send(200, endpoint(body))
        except ApiFailure as exc:
            self._error(exc.status, exc.message)

    def _error(self, status: int, message: str) -> None:
        kind = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError"}.get(status, "InternalServerError")
        self.send(status, {"error": {"message": message, "type": kind, "param": None, "code": status}})


@contextmanager
def serve_embeddings(model: str, encode: Encode, tokenize: Tokenize | None = None, *,
                     max_model_len: int = 256, api_key: str | None = None) -> Iterator[EmbeddingsServer]:
    """Run an embeddings server on a free port of 127.0.0.1 for the duration of the block."""
    state = EmbeddingsServer(model=model, encode=encode, tokenize=tokenize, max_model_len=max_model_len,
                             api_key=api_key)
    with serve(_Handler, state):
        yield state
