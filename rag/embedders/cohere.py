"""Cohere's embed API as an embedder (``embedder.backend: cohere``), through the ``cohere`` SDK.

Needs ``pip install 'ragqa[cohere]'`` and an API key: ``embedder.api_key``, or the SDK's own
``CO_API_KEY`` variable. ``base_url`` points at another endpoint than https://api.cohere.com
(a proxy, a private deployment): its root, without ``/v2``. Documents are embedded with
``input_type="search_document"`` and queries with ``"search_query"``, as Cohere's v3 and
later models expect, at most 96 texts per call (the API's limit).

:class:`CohereApi` (the lazily made SDK client and the translation of its failures into
ragqa's error tree) is shared with :class:`rag.rerank.cohere.CohereReranker`.

Example::

    from rag.embedders.cohere import CohereEmbedder
    embedder = CohereEmbedder("embed-multilingual-v3.0", api_key="...")
    docs = embedder.embed_documents(["Paris is the capital of France.", "北京是中国的首都。"])
    query = embedder.embed_query("What is the capital of France?")     # shape (1024,)
    scores = docs @ query                                              # unit vectors: cosines
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rag.embedders import measured_dim, one_line, unit_rows
from rag.errors import BackendTimeout, BackendUnavailable, ConfigError, EmbedderError, RagError
from rag.lang import model_languages
from rag.text import shorten as _text

if TYPE_CHECKING:
    from rag.config import EmbedderSettings

__all__ = ["CohereEmbedder", "CohereApi", "MAX_TEXTS_PER_CALL", "KNOWN_DIMS"]

#: The most texts Cohere's embed endpoint takes in one call.
MAX_TEXTS_PER_CALL = 96
DEFAULT_MODEL = "embed-multilingual-v3.0"
#: Output dimensions of the common models; any other model's is found by one call.
KNOWN_DIMS = {
    "embed-multilingual-v3.0": 1024,
    "embed-english-v3.0": 1024,
    "embed-multilingual-light-v3.0": 384,
    "embed-english-light-v3.0": 384,
    "embed-v4.0": 1536,
}


class CohereApi:
    """A ``cohere.ClientV2`` made on first use, whose failures come out as one-line ragqa errors.

    ``error`` is the class for the API's own failures (``EmbedderError``, ``RerankerError``);
    a refused key or an unreachable endpoint is ``BackendUnavailable``, a timeout
    ``BackendTimeout``, a missing key or an unknown model (404) ``ConfigError``.
    """

    def __init__(self, *, role: str, setting: str, error: type[RagError], api_key: str | None = None,
                 base_url: str | None = None, timeout_s: float = 30.0, max_retries: int = 3) -> None:
        self.role, self.setting, self.error = role, setting, error
        self.api_key = api_key or os.environ.get("CO_API_KEY") or os.environ.get("COHERE_API_KEY")
        self.base_url = base_url.rstrip("/") if base_url else None
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._client: Any = None
        self._http: Any = None
        self._lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return self.base_url or os.environ.get("CO_API_URL") or "https://api.cohere.com"

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                if not self.api_key:
                    raise ConfigError(f"{self.role} needs an API key: set {self.setting}.api_key or CO_API_KEY")
                try:
                    import cohere
                    import httpx
                except ImportError as exc:
                    raise self.error(f"{self.role} needs the cohere SDK: pip install 'ragqa[cohere]'") from exc
                self._http = httpx.Client(timeout=self.timeout_s)
                self._client = cohere.ClientV2(
                    api_key=self.api_key, base_url=self.endpoint, timeout=self.timeout_s,
                    max_retries=self.max_retries, client_name="ragqa", httpx_client=self._http,
                )
        return self._client

    def call(self, method: str, **kwargs: Any) -> Any:
        """``client.<method>(**kwargs)``; any failure raises a ragqa error ``from`` the SDK's."""
        client = self.client()
        import httpx
        from cohere.core.api_error import ApiError

        try:
            return getattr(client, method)(**kwargs)
        except ApiError as exc:
            raise self._api_error(exc, kwargs.get("model")) from exc
        except httpx.TimeoutException as exc:
            raise BackendTimeout(f"{self.role} at {self.endpoint} did not answer within {self.timeout_s:g} s") from exc
        except httpx.TransportError as exc:
            raise BackendUnavailable(f"cannot reach {self.role} at {self.endpoint}: {one_line(exc)}") from exc
        except Exception as exc:  # e.g. a response the SDK cannot parse
            raise self.error(f"{self.role} failed: {type(exc).__name__}: {_text(one_line(exc))}") from exc

    def _api_error(self, exc: Any, model: object) -> RagError:
        status, body = exc.status_code, exc.body
        message = _text(body.get("message", body) if isinstance(body, dict) else body or f"HTTP {status}")
        if status in (401, 403, 498):
            return BackendUnavailable(f"{self.role} at {self.endpoint} refused the API key ({status}: {message}); "
                                      f"check {self.setting}.api_key")
        if status == 404:
            return ConfigError(f"{self.role}: {message} (model {model!r} at {self.endpoint}, 404)")
        if status == 503:
            return BackendUnavailable(f"{self.role} at {self.endpoint} is unavailable (503): {message}")
        if status == 504:
            return BackendTimeout(f"{self.role} at {self.endpoint} timed out (504): {message}")
        return self.error(f"{self.role} failed ({status}): {message}")

    def close(self) -> None:
        """Close the connections; a later call opens new ones."""
        with self._lock:
            http, self._http, self._client = self._http, None, None
        if http is not None:
            http.close()


class CohereEmbedder:
    """Unit-length float32 vectors from Cohere's ``/v2/embed`` (``ClientV2.embed``).

    Nothing is sent until the first embedding: ``dim`` is known for the common models and
    found by one call for any other (a fine-tuned model, a newer one). Calls are retried
    ``max_retries`` times by the SDK (on connection errors, 429 and 5xx) before failing.
    """

    def __init__(self, model: str | None = None, *, api_key: str | None = None, base_url: str | None = None,
                 timeout_s: float = 30.0, max_retries: int = 3, batch_size: int = MAX_TEXTS_PER_CALL) -> None:
        self.model = model or DEFAULT_MODEL
        self.name = f"cohere:{self.model}"
        self.languages = model_languages(self.model)  # embed-english-*: English; the rest: any
        self.batch_size = max(1, min(batch_size, MAX_TEXTS_PER_CALL))
        self._dim = KNOWN_DIMS.get(self.model)
        self.api = CohereApi(role="Cohere embed", setting="embedder", error=EmbedderError, api_key=api_key,
                             base_url=base_url, timeout_s=timeout_s, max_retries=max_retries)

    @classmethod
    def from_settings(cls, settings: EmbedderSettings) -> CohereEmbedder:
        """From ``EmbedderSettings``; ``batch_size`` applies only when set (else 96, the most)."""
        explicit = "batch_size" in settings.model_fields_set
        return cls(settings.model, api_key=settings.api_key.get_secret_value() if settings.api_key else None,
                   base_url=settings.base_url, timeout_s=settings.timeout_s, max_retries=settings.max_retries,
                   batch_size=settings.batch_size if explicit else MAX_TEXTS_PER_CALL)

    def __repr__(self) -> str:
        return f"CohereEmbedder({self.model!r}, base_url={self.api.endpoint!r})"

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._embed(["dimension"], "search_query")
        return measured_dim(self._dim, self.name)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        step = self.batch_size
        return unit_rows(np.concatenate([self._embed(texts[i : i + step], "search_document")
                                         for i in range(0, len(texts), step)]))

    def embed_query(self, text: str) -> np.ndarray:
        return unit_rows(self._embed([text], "search_query"))[0]

    def close(self) -> None:
        self.api.close()

    def _embed(self, texts: list[str], input_type: str) -> np.ndarray:
        response = self.api.call("embed", model=self.model, texts=texts, input_type=input_type,
                                 embedding_types=["float"])
        rows = getattr(getattr(response, "embeddings", None), "float_", None)
        try:
            vectors = np.asarray(rows, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EmbedderError(f"Cohere embed returned unreadable float embeddings: {one_line(exc)}") from exc
        if vectors.ndim != 2 or len(vectors) != len(texts):
            raise EmbedderError(f"Cohere embed returned {0 if rows is None else len(rows)} float embeddings "
                                f"for {len(texts)} texts")
        if self._dim is None:
            self._dim = vectors.shape[1]
        elif vectors.shape[1] != self._dim:
            raise EmbedderError(f"Cohere embed returned {vectors.shape[1]} dimensions for {self.model!r}, "
                                f"expected {self._dim}")
        return vectors
