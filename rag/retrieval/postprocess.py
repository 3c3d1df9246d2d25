"""Steps after ranking: a recency boost and near-duplicate removal.

Example::

    hits = boost_recent(hits, half_life_days=30, weight=0.2, now=datetime.now(UTC))
    hits = drop_near_duplicates(hits, threshold=0.8)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

from rag.text import UNSPACED as _CJK
from rag.types import Hit

__all__ = ["boost_recent", "drop_near_duplicates", "words"]

_WORD = re.compile(r"[^\W\d_]+|\d+", re.UNICODE)


def boost_recent(hits: Sequence[Hit], half_life_days: float, weight: float,
                 now: datetime | None = None) -> list[Hit]:
    """Raise recently modified hits and re-sort; the order among equally old hits is kept.

    A hit modified ``age`` days ago gains ``weight * 0.5 ** (age / half_life_days)`` of its
    own score's magnitude: a hit modified today gains ``weight`` (20% by default), one a
    half-life old gains half that. Hits without a modified time gain nothing. Multiplying
    keeps the boost meaningful whatever the scale of the scores (BM25, cosine, RRF).
    """
    now = now or datetime.now(UTC)
    out = []
    for h in hits:
        modified = h.chunk.modified if h.chunk is not None else None
        if modified is None or weight <= 0:
            out.append(h)
            continue
        if modified.tzinfo is None:
            modified = modified.replace(tzinfo=UTC)
        age_days = max(0.0, (now - modified).total_seconds() / 86400)
        boost = weight * 0.5 ** (age_days / half_life_days)
        score = h.score + abs(h.score) * boost
        out.append(Hit(h.chunk_id, score, h.doc_id, h.chunk, {**h.explain, "recency": round(boost, 6)}))
    out.sort(key=lambda h: h.score, reverse=True)
    return out


def words(text: str) -> frozenset[str]:
    """Lower-cased words of ``text``; each CJK character counts as a word."""
    lowered = text.lower()
    return frozenset(_WORD.findall(_CJK.sub(" ", lowered))) | frozenset(_CJK.findall(lowered))


def drop_near_duplicates(hits: Sequence[Hit], threshold: float, limit: int | None = None) -> list[Hit]:
    """Remove hits whose text is (nearly) contained in a better hit.

    A hit is dropped when it has the same text as a better hit (any document), or when
    ``threshold`` of its words already appear in a better hit of the same document (pages
    whose chunks overlap, a section repeated on one page). Hits without a chunk are kept.
    With ``limit``, it stops once that many hits are kept.
    """
    kept: list[Hit] = []
    seen_hashes: set[str] = set()
    kept_words: dict[str, list[frozenset[str]]] = {}
    for h in hits:
        if limit is not None and len(kept) >= limit:
            break
        if h.chunk is None:
            kept.append(h)
            continue
        if h.chunk.hash in seen_hashes:
            continue
        mine = words(h.chunk.text)
        doc = h.doc_id or h.chunk.doc_id
        if mine and any(len(mine & other) >= threshold * len(mine) for other in kept_words.get(doc, ())):
            continue
        seen_hashes.add(h.chunk.hash)
        kept_words.setdefault(doc, []).append(mine)
        kept.append(h)
    return kept
