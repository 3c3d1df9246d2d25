"""Reciprocal rank fusion of ranked lists.

Each list contributes ``weight / (k + rank)`` for every id it holds (ranks start at 1), so
an id ranked high by several lists beats one ranked first by a single list, whatever the
scales of the original scores.

Example::

    fused = rrf([["a", "b"], ["b", "c"]], k=60)
    assert [doc for doc, _ in fused] == ["b", "a", "c"]
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["rrf"]


def rrf(rankings: Sequence[Sequence[str]], k: float = 60.0,
        weights: Sequence[float] | None = None) -> list[tuple[str, float]]:
    """Fuse ranked id lists; returns ``(id, score)`` best first, ties in first-seen order.

    A repeated id within one list counts only at its best rank.
    """
    if k < 0:
        raise ValueError(f"rrf k must be >= 0, got {k}")
    if weights is None:
        weights = [1.0] * len(rankings)
    if len(weights) != len(rankings):
        raise ValueError(f"{len(weights)} weights for {len(rankings)} rankings")
    scores: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        for rank, item in enumerate(dict.fromkeys(ranking), start=1):
            scores[item] = scores.get(item, 0.0) + weight / (k + rank)
    order = {item: i for i, item in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))
