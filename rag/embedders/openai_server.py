"""The ``openai`` embedder: any OpenAI-compatible ``/v1/embeddings`` server, e.g. vLLM or TEI.

This is how a deployment moves embedding onto GPUs: ``vllm serve BAAI/bge-small-en-v1.5
--task embed`` (or Hugging Face text-embeddings-inference) on a GPU machine, and
``embedder.backend: openai`` with ``base_url`` and ``model`` on every ingesting machine. It
talks to the server with the ``openai`` SDK's synchronous :class:`openai.OpenAI` client
(``pip install 'ragqa[openai]'``): ``embeddings.create`` with ``encoding_format="float"``,
``batch_size`` texts per request (64 unless set), and ``dimensions`` when configured.

Failure rules:

- The SDK tries a request again ``max_retries`` times on connection errors, timeouts, 408,
  409, 429 and 5xx, with exponential backoff from 0.5 s, honouring a ``Retry-After`` header
  of up to 60 s.
- Then an unreachable server raises ``BackendUnavailable``, one that did not answer within
  ``timeout_s`` ``BackendTimeout``, a refused key ``BackendUnavailable``, an unknown model or
  wrong URL (404) ``ConfigError``; anything else the server rejects (e.g. 400, an input longer
  than the model reads) raises ``EmbedderError`` with the server's status and message at once.
  Every message names the URL.
- The first response fixes ``dim``; a later response of another size, or not one vector per
  text, is an ``EmbedderError``.

The embedder's identity (``name``) is ``openai:<model>``, so an index built through one served
model refuses another (the guard compares ``name:dim``).

Tokens, which size the chunks: ``count_tokens`` is an estimate, one token per CJK character
plus one per 3 other characters, more than WordPiece or BPE tokenizers count for English and
Chinese prose. It is not asked of the server: the chunker counts each candidate piece, about
6 calls per chunk, and one ``/tokenize`` request per call made chunking this project's docs
take seconds instead of 0.06 s on loopback, longer than a GPU takes to embed them. vLLM
serves ``POST /tokenize`` beside ``/v1``; when it answers (asked once), ``max_text_tokens`` is
its ``max_model_len`` less two special tokens, and every request carries
``truncate_prompt_tokens`` so that a passage the estimate let through too long (dense code,
scripts with many tokens per character) is cut as sentence-transformers cuts it, not refused.
Other servers (TEI, hosted APIs) know nothing of that parameter and get none.

Example::

    from rag.embedders.openai_server import OpenAIEmbedder
    embedder = OpenAIEmbedder("http://gpu-1:8000/v1", "BAAI/bge-small-en-v1.5")
    docs = embedder.embed_documents(["Paris is the capital of France.", "Rust has no GC."])
    query = embedder.embed_query("What is the capital of France?")   # shape (384,)
    scores = docs @ query                                             # unit vectors: cosines
    embedder.close()
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from rag.embedders import measured_dim, one_line, unit_rows
from rag.errors import BackendTimeout, BackendUnavailable, ConfigError, EmbedderError, RagError
from rag.lang import model_languages
from rag.text import estimate_tokens
from rag.text import shorten as _short

if TYPE_CHECKING:
    import openai

    from rag.config import EmbedderSettings

__all__ = ["OpenAIEmbedder", "DEFAULT_BATCH_SIZE", "SPECIAL_TOKENS"]

#: Texts per request unless ``embedder.batch_size`` is set.
DEFAULT_BATCH_SIZE = 64
#: Tokens the server adds to each text ([CLS] and [SEP], <s> and </s>), kept out of the budget.
SPECIAL_TOKENS = 2


class OpenAIEmbedder:
    """Unit-length float32 vectors from an OpenAI-compatible server. See the module docstring.

    Nothing is sent until first use: ``dim`` costs one request when ``dimensions`` is unset.
    """

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None, timeout_s: float = 30.0,
                 max_retries: int = 3, batch_size: int = DEFAULT_BATCH_SIZE,
                 dimensions: int | None = None) -> None:
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"the openai embedder needs embedder.base_url, the server's http(s) /v1 URL "
                              f"(e.g. http://127.0.0.1:8000/v1), not {base_url!r}")
        if not model:
            raise ConfigError("the openai embedder needs embedder.model, the served model's name "
                              "(e.g. BAAI/bge-small-en-v1.5)")
        if batch_size < 1:
            raise ConfigError(f"embedder.batch_size must be at least 1, not {batch_size}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/embeddings"
        self.model = model
        self.name = f"openai:{model}"
        self.languages = model_languages(model)
        self.batch_size = batch_size
        self.dimensions = dimensions
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._api_key = api_key
        self._dim: int | None = None
        self._client: openai.OpenAI | None = None
        self._lock = threading.Lock()
        self._tokenize_url = self.base_url.removesuffix("/v1") + "/tokenize"
        self._probed = False
        self._max_model_len: int | None = None  # known when the server is vLLM

    @classmethod
    def from_settings(cls, settings: EmbedderSettings) -> OpenAIEmbedder:
        """From ``EmbedderSettings``; ``batch_size`` applies only when set (else 64)."""
        explicit = "batch_size" in settings.model_fields_set
        return cls(settings.base_url or "", settings.model or "",
                   api_key=settings.api_key.get_secret_value() if settings.api_key else None,
                   timeout_s=settings.timeout_s, max_retries=settings.max_retries,
                   batch_size=settings.batch_size if explicit else DEFAULT_BATCH_SIZE,
                   dimensions=settings.dimensions)

    def __repr__(self) -> str:
        return f"OpenAIEmbedder({self.base_url!r}, {self.model!r})"

    # -- the Embedder Protocol ----------------------------------------------------------------
    @property
    def dim(self) -> int:
        if self._dim is None:
            self._embed(["dimension"])
        return measured_dim(self._dim, self.name)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        step = self.batch_size
        return unit_rows(np.concatenate([self._embed(texts[i : i + step]) for i in range(0, len(texts), step)]))

    def embed_query(self, text: str) -> np.ndarray:
        return unit_rows(self._embed([text]))[0]

    # -- tokens, for the chunker --------------------------------------------------------------
    def count_tokens(self, text: str) -> int:
        """:func:`rag.text.estimate_tokens` with ``upper=True``, an over-estimate for prose."""
        return estimate_tokens(text, upper=True)

    @property
    def max_text_tokens(self) -> int | None:
        """Most tokens of a passage the model reads, when the server says (vLLM); else ``None``."""
        self._probe()
        return None if self._max_model_len is None else max(1, self._max_model_len - SPECIAL_TOKENS)

    def close(self) -> None:
        """Close the connections; a later call opens new ones."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # -- the calls ----------------------------------------------------------------------------
    def _http_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def _sdk(self) -> openai.OpenAI:
        with self._lock:
            if self._client is None:
                try:
                    import openai
                except ImportError as exc:
                    raise ConfigError("the openai embedder needs the openai SDK: pip install 'ragqa[openai]'") from exc
                # A server without auth takes any key; the SDK insists on one.
                self._client = openai.OpenAI(
                    base_url=self.base_url, api_key=self._api_key or "none", max_retries=self.max_retries,
                    timeout=openai.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0)))
            return self._client

    def _embed(self, texts: list[str]) -> np.ndarray:
        client = self._sdk()
        self._probe()
        import openai

        extra: dict[str, Any] = {} if self.dimensions is None else {"dimensions": self.dimensions}
        if self._max_model_len is not None:
            extra["extra_body"] = {"truncate_prompt_tokens": self._max_model_len}
        try:
            response = client.embeddings.create(model=self.model, input=texts, encoding_format="float", **extra)
        except openai.APITimeoutError as exc:
            raise BackendTimeout(f"embeddings server {self.url} did not answer within {self.timeout_s:g} s "
                                 f"({self.max_retries + 1} tries)") from exc
        except openai.APIConnectionError as exc:
            cause = one_line(exc.__cause__) if exc.__cause__ else one_line(exc)
            raise BackendUnavailable(f"cannot reach embeddings server {self.url}: {cause}") from exc
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from exc
        except openai.OpenAIError as exc:
            raise EmbedderError(f"embeddings server {self.url} failed: {_short(one_line(exc))}") from exc
        return self._vectors(response, len(texts))

    def _status_error(self, exc: openai.APIStatusError) -> RagError:
        status, body = exc.status_code, exc.body
        message = body.get("message", body) if isinstance(body, dict) else (body or exc.message)
        message = _short(message)
        if status in (401, 403):
            return BackendUnavailable(f"embeddings server {self.url} refused the API key ({status}: {message}); "
                                      "check embedder.api_key")
        if status == 404:
            return ConfigError(f"embeddings server {self.url}: {message} (404: model {self.model!r} not served "
                               "there, or not an OpenAI-compatible /v1 URL)")
        if status in (502, 503):
            return BackendUnavailable(f"embeddings server {self.url} is unavailable ({status}): {message}")
        if status == 504:
            return BackendTimeout(f"embeddings server {self.url} timed out ({status}): {message}")
        return EmbedderError(f"embeddings server {self.url} rejected the request ({status}): {message}")

    def _vectors(self, response: Any, expected: int) -> np.ndarray:
        data = sorted(getattr(response, "data", None) or [], key=lambda item: item.index)
        if len(data) != expected:
            raise EmbedderError(f"embeddings server {self.url} returned {len(data)} embeddings for {expected} texts")
        try:
            vectors = np.asarray([item.embedding for item in data], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbedderError(f"embeddings server {self.url} returned unreadable embeddings "
                                f"(not lists of floats of one size): {one_line(exc)}") from exc
        if vectors.ndim != 2:
            raise EmbedderError(f"embeddings server {self.url} returned embeddings that are not float lists")
        got = vectors.shape[1]
        expected_dim = self._dim if self._dim is not None else self.dimensions
        if expected_dim is not None and got != expected_dim:
            raise EmbedderError(f"embeddings server {self.url} returned {got} dimensions for {self.model!r}, "
                                f"expected {expected_dim}")
        self._dim = got
        return vectors

    def _probe(self) -> None:
        """Find out once whether the server is vLLM, and its ``max_model_len`` (``/tokenize``)."""
        with self._lock:
            if self._probed:
                return
            self._probed = True
            try:
                with httpx.Client(headers=self._http_headers(), timeout=min(self.timeout_s, 5.0)) as http:
                    probe = http.post(self._tokenize_url, json={"model": self.model, "prompt": "ok"})
                answer = probe.json() if probe.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                answer = None  # not vLLM, or not answering yet: the embedding request will say
            length = answer.get("max_model_len") if isinstance(answer, dict) else None
            self._max_model_len = length if isinstance(length, int) and length > SPECIAL_TOKENS else None
