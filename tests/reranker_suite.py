"""What every :class:`rag.types.Reranker` promises. Subclass the suite and provide ``reranker``.

A reranker returns the hits it was given (the same ids, documents and chunks), best first,
the best ``top_n`` of them when asked, each scored by the reranker: its score is ``score``
and also sits under ``score_key`` in ``explain``, beside the keys the hit already had.
A model that ranks by relevance puts the passage that answers the query first; a random
model (the tiny cross-encoder of the tests) only has to order by its own scores.

Example::

    class TestMyReranker(RerankerSuite):
        score_key = "mine"

        @pytest.fixture
        def reranker(self):
            return MyReranker()
"""

from __future__ import annotations

import pytest

from rag.types import Chunk, Hit, Reranker

__all__ = ["RerankerSuite", "HITS", "QUERY"]

QUERY = "how do I reset my password"
TEXTS = [
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "Stock markets fell sharply on Monday morning.",
    "Reset your password from the account settings page.",
    "The server presents its certificate during the TLS handshake.",
    "Rivers carry water from the mountains to the sea.",
]
ANSWER = "c2"
HITS = [
    Hit(f"c{i}", 10.0 - i, f"d{i}",
        Chunk(id=f"c{i}", doc_id=f"d{i}", source="s", text=text, hash=f"h{i}"),
        {"bm25": 10.0 - i, "bm25_rank": float(i + 1)})
    for i, text in enumerate(TEXTS)
]


class RerankerSuite:
    """Contract tests; ``reranker`` is the subclass's fixture."""

    score_key: str  # where the reranker's score goes in ``explain`` ("cosine", "cohere", ...)
    ranks_by_relevance: bool = True  # False for a random model

    def test_is_a_reranker_with_a_name(self, reranker: Reranker) -> None:
        assert isinstance(reranker, Reranker)
        assert isinstance(reranker.name, str) and reranker.name

    def test_no_hits_is_no_hits(self, reranker: Reranker) -> None:
        assert reranker.rerank(QUERY, []) == []
        assert reranker.rerank(QUERY, [], top_n=3) == []

    def test_keeps_every_hit_with_its_document_chunk_and_explain(self, reranker: Reranker) -> None:
        out = reranker.rerank(QUERY, HITS)
        assert sorted(h.chunk_id for h in out) == sorted(h.chunk_id for h in HITS)
        given = {h.chunk_id: h for h in HITS}
        for h in out:
            assert h.doc_id == given[h.chunk_id].doc_id and h.chunk == given[h.chunk_id].chunk
            assert h.explain["bm25"] == given[h.chunk_id].explain["bm25"]
            assert h.explain["bm25_rank"] == given[h.chunk_id].explain["bm25_rank"]

    def test_best_first_by_its_own_score(self, reranker: Reranker) -> None:
        out = reranker.rerank(QUERY, HITS)
        scores = [h.score for h in out]
        assert scores == sorted(scores, reverse=True)
        assert all(h.explain[self.score_key] == h.score for h in out)
        again = reranker.rerank(QUERY, HITS)
        assert [h.chunk_id for h in again] == [h.chunk_id for h in out]

    def test_top_n_keeps_the_best(self, reranker: Reranker) -> None:
        full = [h.chunk_id for h in reranker.rerank(QUERY, HITS)]
        assert [h.chunk_id for h in reranker.rerank(QUERY, HITS, top_n=2)] == full[:2]
        assert [h.chunk_id for h in reranker.rerank(QUERY, HITS, top_n=len(HITS) + 5)] == full
        assert reranker.rerank(QUERY, HITS, top_n=0) == []

    def test_the_passage_that_answers_comes_first(self, reranker: Reranker) -> None:
        if not self.ranks_by_relevance:
            pytest.skip(f"{reranker.name} here is a random model")
        out = reranker.rerank(QUERY, HITS)
        assert out[0].chunk_id == ANSWER, [(h.chunk_id, h.score) for h in out]
        assert HITS[0].chunk_id != ANSWER  # it came third: moved up, not merely kept
