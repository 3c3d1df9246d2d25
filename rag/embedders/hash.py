"""A deterministic embedder with no model: feature hashing of words and character n-grams."""

from __future__ import annotations

import hashlib
import math
import unicodedata
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import regex

from rag.text import UNSPACED, UNSPACED_CLASS

__all__ = ["HashEmbedder"]

# Runs of a script written without spaces (Han, kana, Hangul), or words.
_TOKEN = regex.compile(rf"[{UNSPACED_CLASS}]+|[^\W{UNSPACED_CLASS}]+")
_CJK_RUN = UNSPACED
_WORD_WEIGHT = 1.0
_NGRAM_WEIGHT = 0.5


class HashEmbedder:
    """Hashes tokens into ``dim`` signed buckets, then L2-normalises: same text, same vector.

    Features are lowercased NFKC words plus their character n-grams (``#word#``, n=3), and for
    Chinese, Japanese and Korean, which have no spaces, single characters and character
    pairs. Texts that share words or characters get similar vectors, which is enough for
    tests of indexing and search code; it knows nothing of meaning (no synonyms, no
    translation). Queries and documents embed alike.

    Example::

        embedder = HashEmbedder(dim=64)
        a, b = embedder.embed_documents(["the cat sat", "the cat sat down"])
        float(a @ b)                          # high: most features are shared
        embedder.embed_query("北京的天气")     # (64,) float32, unit length
    """

    def __init__(self, dim: int = 384, ngram: int = 3, seed: int = 0) -> None:
        if dim < 2:
            raise ValueError("dim must be at least 2")
        if ngram < 0:
            raise ValueError("ngram must be 0 (no character n-grams) or more")
        self.dim = dim
        self.languages: frozenset[str] | None = None  # character n-grams: any script
        self.ngram = ngram
        self.seed = seed
        self.name = f"hash:d{dim}-n{ngram}-s{seed}"
        self._key = seed.to_bytes(8, "little", signed=True)

    def __repr__(self) -> str:
        return f"HashEmbedder(dim={self.dim}, ngram={self.ngram}, seed={self.seed})"

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in zip(out, texts, strict=True):
            self._fill(row, text)
        return out

    def embed_query(self, text: str) -> np.ndarray:
        row = np.zeros(self.dim, dtype=np.float32)
        self._fill(row, text)
        return row

    def count_tokens(self, text: str) -> int:
        """Words, plus one per CJK character: the units this embedder hashes."""
        return sum(len(t) if _CJK_RUN.match(t) else 1 for t in _TOKEN.findall(_normalise(text)))

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        return [self.count_tokens(t) for t in texts]

    def features(self, text: str) -> dict[str, float]:
        """The weighted features of ``text``, before hashing."""
        feats: defaultdict[str, float] = defaultdict(float)
        for token in _TOKEN.findall(_normalise(text)):
            if _CJK_RUN.match(token):
                for i, ch in enumerate(token):
                    feats["c:" + ch] += _WORD_WEIGHT
                    if i + 1 < len(token):
                        feats["b:" + token[i : i + 2]] += _WORD_WEIGHT
                continue
            feats["w:" + token] += _WORD_WEIGHT
            padded = f"#{token}#"
            if self.ngram and len(padded) > self.ngram:
                n = self.ngram
                for i in range(len(padded) - n + 1):
                    feats["g:" + padded[i : i + n]] += _NGRAM_WEIGHT
        return feats

    def _fill(self, row: np.ndarray, text: str) -> None:
        feats = self.features(text) or {"empty:": 1.0}
        for feature, weight in feats.items():
            h = int.from_bytes(
                hashlib.blake2b(feature.encode("utf-8"), digest_size=8, key=self._key).digest(), "little"
            )
            # Sublinear term frequency, so one repeated word does not swamp the rest.
            value = 1.0 + math.log(weight) if weight >= 1.0 else weight
            row[h % self.dim] += value if h >> 63 else -value
        norm = float(np.linalg.norm(row))
        if norm > 0:
            row /= norm
        else:  # every feature cancelled out; any fixed unit vector will do
            row[0] = 1.0


def _normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).lower()
