"""Rerankers in the retriever, the recency boost and near-duplicate removal."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from ingest.services import open_services
from rag.config import RerankerSettings, Settings
from rag.errors import ConfigError
from rag.rerank import CrossEncoderReranker, EmbeddingReranker, KeepOrder, make_reranker
from rag.retrieval import HybridRetriever, boost_recent, drop_near_duplicates
from rag.services import Services
from rag.types import Chunk, Hit, Reranker
from tests.conftest import make_settings
from tests.corpus import doc_text
from tests.reranker_suite import HITS, RerankerSuite

NOW = datetime(2025, 6, 2, tzinfo=UTC)


def hit(cid: str, score: float, text: str, doc: str = "d", modified: datetime | None = None) -> Hit:
    chunk = Chunk(id=cid, doc_id=doc, source="s", text=text, hash=f"h-{text}", modified=modified)
    return Hit(cid, score, doc, chunk, {"bm25": score})


def test_recency_boost_follows_the_half_life_and_reorders():
    hits = [hit("old", 1.0, "a", modified=NOW - timedelta(days=60)),
            hit("new", 0.9, "b", modified=NOW),
            hit("mid", 0.96, "c", modified=NOW - timedelta(days=30)),
            hit("undated", 0.97, "d")]
    out = boost_recent(hits, half_life_days=30, weight=0.2, now=NOW)
    by_id = {h.chunk_id: h for h in out}
    assert by_id["new"].explain["recency"] == pytest.approx(0.2)
    assert by_id["mid"].explain["recency"] == pytest.approx(0.1)
    assert by_id["old"].explain["recency"] == pytest.approx(0.05)
    assert "recency" not in by_id["undated"].explain and by_id["undated"].score == 0.97
    assert by_id["new"].score == pytest.approx(0.9 * 1.2)
    assert [h.chunk_id for h in out] == ["new", "mid", "old", "undated"]
    assert [h.chunk_id for h in boost_recent(hits, 30, 0.0, NOW)] == ["old", "undated", "mid", "new"]


def test_near_duplicates_of_a_better_hit_are_dropped():
    base = "the quick brown fox jumps over the lazy dog near the river bank today"
    hits = [hit("a", 3.0, base),
            hit("overlap", 2.5, base + " again", doc="d"),            # same document, 93% contained
            hit("other-doc", 2.4, base + " again", doc="e"),          # other document: kept
            hit("mirror", 2.3, base, doc="f"),                        # identical text elsewhere: dropped
            hit("distinct", 2.0, "an entirely different passage about tls", doc="d"),
            hit("zh1", 1.9, "北京是中华人民共和国的首都", doc="z"),
            hit("zh2", 1.8, "北京是中华人民共和国的首都。", doc="z")]
    kept = [h.chunk_id for h in drop_near_duplicates(hits, threshold=0.8)]
    assert kept == ["a", "other-doc", "distinct", "zh1"]
    assert [h.chunk_id for h in drop_near_duplicates(hits, threshold=0.8, limit=2)] == ["a", "other-doc"]
    # Only full containment counts at 1.0; "other-doc" then repeats "overlap"'s exact text.
    assert [h.chunk_id for h in drop_near_duplicates(hits, threshold=1.0)] == ["a", "overlap", "distinct", "zh1"]


def test_from_services_reads_the_retrieval_settings(indexed):
    settings = indexed.settings.model_copy(update={"retrieval": indexed.settings.retrieval.model_copy(
        update={"mode": "hybrid", "candidates": 7, "rrf_k": 5.0, "recency_half_life_days": 10.0})})
    indexed.settings, saved = settings, indexed.settings
    try:
        retriever = HybridRetriever.from_services(indexed)
    finally:
        indexed.settings = saved
    assert (retriever.mode, retriever.candidates, retriever.rrf_k) == ("hybrid", 7, 5.0)
    assert retriever.recency_half_life_days == 10.0
    assert isinstance(retriever.reranker, EmbeddingReranker) and isinstance(retriever.reranker, Reranker)
    assert retriever.weights == (1.0, 1.0)  # pinned for the hash embedder by tests.conftest.make_settings
    unset = indexed.settings.model_copy(update={"retrieval": indexed.settings.retrieval.model_copy(
        update={"weights": None, "language_aware": False})})
    indexed.settings, saved = unset, indexed.settings
    try:
        retriever = HybridRetriever.from_services(indexed)
        assert retriever.weights is None and retriever.language_aware is False  # None: adaptive per query
        assert HybridRetriever.from_services(indexed, weights=(2.0, 1.0)).weights == (2.0, 1.0)
    finally:
        indexed.settings = saved


def test_recency_boost_in_the_retriever_prefers_recent_sources(indexed):
    query = "river mountain lantern copper violin harbor meadow"
    plain = HybridRetriever(indexed, mode="bm25").retrieve(query, k=30)
    boosted = HybridRetriever(indexed, mode="bm25", recency_half_life_days=30, recency_weight=1.0,
                              now=datetime(2025, 6, 1, tzinfo=UTC)).retrieve(query, k=30)
    assert {h.chunk_id for h in plain} == {h.chunk_id for h in boosted}

    def beta_rank(hits: list[Hit]) -> float:
        ranks = [i for i, h in enumerate(hits) if h.chunk.source == "beta"]
        return sum(ranks) / len(ranks)

    assert beta_rank(boosted) < beta_rank(plain)
    assert all(h.explain["recency"] > 0.9 for h in boosted if h.chunk.source == "beta")


class ReverseReranker:
    """A reranker that puts the incoming order upside down, to see it take effect."""

    name = "reverse"

    def __init__(self) -> None:
        self.seen: list[int] = []

    def rerank(self, query: str, hits, top_n=None):
        self.seen.append(len(hits))
        assert all(h.chunk is not None for h in hits)
        out = [Hit(h.chunk_id, float(i), h.doc_id, h.chunk, {**h.explain, "reverse": float(i)})
               for i, h in enumerate(hits)]
        return sorted(out, key=lambda h: h.score, reverse=True)[:top_n]


@pytest.mark.parametrize("mode", ["hybrid", "rrf"])
def test_a_model_reranker_reorders_the_candidates(indexed, mode):
    _, body = doc_text(3)
    query = body.split(".")[0]
    reranker = ReverseReranker()
    plain = HybridRetriever(indexed, mode=mode, candidates=20, reranker=None).retrieve(query, k=20)
    reranked = HybridRetriever(indexed, mode=mode, candidates=20, reranker=reranker).retrieve(query, k=20)
    assert reranker.seen and reranker.seen[0] <= 20
    assert reranked[0].chunk_id != plain[0].chunk_id
    assert all("reverse" in h.explain and "bm25" in h.explain for h in reranked if "bm25_rank" in h.explain)


def test_search_reports_step_timings(indexed):
    result = HybridRetriever(indexed, mode="rrf").search("copper violin", k=3)
    assert len(result.hits) == 3
    assert {"embed_ms", "bm25_ms", "vector_ms", "fuse_ms"} <= set(result.timings)
    assert all(v >= 0 for v in result.timings.values())


def test_reranker_none_keeps_the_keyword_order(indexed):
    """``reranker.backend: none`` used to behave like ``embedding``: hybrid reordered by cosine."""
    query = "copper violin harbor meadow"
    none = indexed.settings.model_copy(update={"retrieval": indexed.settings.retrieval.model_copy(
        update={"mode": "hybrid", "reranker": RerankerSettings(backend="none")})})
    indexed.settings, saved = none, indexed.settings
    try:
        retriever = HybridRetriever.from_services(indexed, dedup_threshold=None)
        result = retriever.search(query, k=10)
    finally:
        indexed.settings = saved
    bm25 = HybridRetriever(indexed, mode="bm25", dedup_threshold=None).retrieve(query, k=10)
    assert retriever.reranker.name == "none" and "embed_ms" not in result.timings
    assert [h.chunk_id for h in result.hits] == [h.chunk_id for h in bm25]
    assert not any("cosine" in h.explain for h in result.hits)
    cosine = HybridRetriever(indexed, mode="hybrid", dedup_threshold=None).retrieve(query, k=10)
    assert [h.chunk_id for h in cosine] != [h.chunk_id for h in bm25]  # the default does reorder


def test_reranker_settings_build_the_right_reranker(indexed):
    assert isinstance(make_reranker(indexed), EmbeddingReranker)
    none = indexed.settings.model_copy(update={"retrieval": indexed.settings.retrieval.model_copy(
        update={"reranker": RerankerSettings(backend="none")})})
    assert isinstance(make_reranker(SimpleNamespace(settings=none)), KeepOrder)
    with pytest.raises(ConfigError, match="reranker.model is required"):
        Settings.load(None, retrieval={"reranker": {"backend": "cross-encoder"}})
    ce = CrossEncoderReranker("/nonexistent/cross-encoder")
    with pytest.raises(ConfigError, match="cannot load cross-encoder"):
        ce.rerank("q", [hit("a", 1.0, "text")])
    assert ce.rerank("q", []) == []


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real (random, tiny) BERT cross-encoder saved to a folder, as a trained one would be."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    folder = tmp_path_factory.mktemp("cross-encoder")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a of is in tls handshake certificate server "
             "client river cat paris france capital key exchange".split()]
    (folder / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, num_labels=1, initializer_range=0.5)
    BertForSequenceClassification(config).save_pretrained(folder)
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(folder)
    return str(folder)


def test_the_cross_encoder_reranker_orders_by_the_models_scores(tiny_cross_encoder, indexed):
    from sentence_transformers import CrossEncoder

    texts = ["the tls handshake", "the river cat", "paris is the capital of france", "certificate of the server",
             "key exchange in the client"]
    hits = [Hit(str(i), 0.0, f"d{i}", Chunk(id=str(i), doc_id=f"d{i}", source="s", text=t, hash=str(i)),
                {"bm25": float(i)}) for i, t in enumerate(texts)]
    query = "tls handshake certificate"
    reranker = CrossEncoderReranker(tiny_cross_encoder)
    out = reranker.rerank(query, hits)
    expected = CrossEncoder(tiny_cross_encoder).predict([(query, t) for t in texts])
    assert len({round(float(s), 4) for s in expected}) >= 3  # scores that differ: the order means something
    assert [h.chunk_id for h in out] == [str(i) for i in sorted(range(len(texts)), key=lambda i: -expected[i])]
    for h in out:
        assert h.score == pytest.approx(float(expected[int(h.chunk_id)]), abs=1e-5)
        assert h.explain["cross_encoder"] == h.score and "bm25" in h.explain  # earlier steps kept
    assert [h.chunk_id for h in reranker.rerank(query, hits, top_n=2)] == [h.chunk_id for h in out[:2]]
    # From the settings, in the retriever: rrf's fused candidates reordered by the model.
    cfg = indexed.settings.model_copy(update={"retrieval": indexed.settings.retrieval.model_copy(
        update={"mode": "rrf", "reranker": RerankerSettings(backend="cross-encoder", model=tiny_cross_encoder)})})
    indexed.settings, saved = cfg, indexed.settings
    try:
        result = HybridRetriever.from_services(indexed, dedup_threshold=None).search("copper violin", k=5)
    finally:
        indexed.settings = saved
    scores = [h.explain["cross_encoder"] for h in result.hits]
    assert len(result.hits) == 5 and scores == sorted(scores, reverse=True) and "rerank_ms" in result.timings


# --- the Reranker contract ------------------------------------------------------------------


@pytest.fixture(scope="module")
def vector_services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """Hash-embedder services holding the vectors of the suite's first three hits (the other
    two are embedded on the spot, as chunks indexed after the vectors were stored are)."""
    svc = open_services(make_settings(tmp_path_factory.mktemp("rerank") / "data"))
    stored = [h.chunk for h in HITS[:3] if h.chunk is not None]
    svc.vector.upsert(stored, svc.embedder.embed_documents([c.text for c in stored]))
    yield svc
    svc.close()


class TestEmbeddingRerankerContract(RerankerSuite):
    score_key = "cosine"

    @pytest.fixture
    def reranker(self, vector_services: Services) -> EmbeddingReranker:
        return EmbeddingReranker(vector_services)


class TestCrossEncoderContract(RerankerSuite):
    score_key = "cross_encoder"
    ranks_by_relevance = False  # random weights

    @pytest.fixture
    def reranker(self, tiny_reranker: CrossEncoderReranker) -> CrossEncoderReranker:
        return tiny_reranker


@pytest.fixture(scope="module")
def tiny_reranker(tiny_cross_encoder: str) -> CrossEncoderReranker:
    return CrossEncoderReranker(tiny_cross_encoder)
