"""HybridRetriever in every mode, rank fusion, and ``ragqa search --mode``, on a real index."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from rag.errors import ConfigError
from rag.filters import parse_filters
from rag.retrieval import MODES, HybridRetriever, rrf
from rag.search import search
from rag.types import Chunk, Hit
from ragqa.cli import cli
from tests.corpus import doc_text


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_returns_unique_hydrated_hits(indexed, mode):
    _, body = doc_text(3)
    hits = HybridRetriever(indexed, mode=mode).retrieve(body.split(".")[0], k=8)
    assert 0 < len(hits) <= 8
    assert len({h.chunk_id for h in hits}) == len(hits)
    assert all(h.chunk is not None and h.doc_id == h.chunk.doc_id for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    if mode != "vector":  # the hash embedder is no semantic model; keywords find the note
        assert hits[0].doc_id == "alpha:d03.md"


@pytest.mark.parametrize("mode", MODES)
def test_filters_apply_in_every_mode(indexed, mode):
    retriever = HybridRetriever(indexed, mode=mode)
    query = "river mountain lantern copper violin"
    beta = retriever.retrieve(query, k=30, filters=parse_filters({"source": "beta"}))
    assert beta and {h.chunk.source for h in beta} == {"beta"}
    recent = retriever.retrieve(query, k=30, filters=parse_filters({"modified_from": "2025-01-01"}))
    assert recent and all(h.chunk.modified >= datetime(2025, 1, 1, tzinfo=UTC) for h in recent)
    old = retriever.retrieve(query, k=30, filters=parse_filters({"modified_to": "2024-12-31"}))
    assert old and {h.chunk.source for h in old} == {"alpha"}


def test_rrf_math_on_a_hand_computed_example():
    fused = dict(rrf([["a", "b", "c"], ["c", "a", "a"]], k=60, weights=(1.0, 2.0)))
    assert fused["a"] == pytest.approx(1 / 61 + 2 / 62)
    assert fused["b"] == pytest.approx(1 / 62)
    assert fused["c"] == pytest.approx(1 / 63 + 2 / 61)
    assert [item for item, _ in rrf([["a", "b", "c"], ["c", "a"]], k=60, weights=(1.0, 2.0))] == ["c", "a", "b"]
    assert rrf([["x", "y"], ["y", "x"]], k=0) == [("x", 1.5), ("y", 1.5)]  # ties keep first-seen order
    with pytest.raises(ValueError):
        rrf([["a"]], weights=(1.0, 1.0))


def test_rrf_mode_scores_are_the_fused_ranks(indexed):
    hits = HybridRetriever(indexed, mode="rrf", rrf_k=10, weights=(1.0, 0.5)).retrieve(
        "glacier falcon orchard compass", k=10)
    both = [h for h in hits if "bm25_rank" in h.explain and "vector_rank" in h.explain]
    assert both
    for h in hits:
        expected = (1.0 / (10 + h.explain["bm25_rank"]) if "bm25_rank" in h.explain else 0.0) + (
            0.5 / (10 + h.explain["vector_rank"]) if "vector_rank" in h.explain else 0.0)
        assert h.score == pytest.approx(expected) == pytest.approx(h.explain["rrf"])


def test_hybrid_falls_back_to_vector_when_no_keyword_matches(indexed):
    hits = HybridRetriever(indexed, mode="hybrid").retrieve("qwxyzzy plughfrob", k=5)
    assert len(hits) == 5
    assert all("vector" in h.explain and "bm25" not in h.explain for h in hits)
    filtered = HybridRetriever(indexed).retrieve("qwxyzzy", k=5, filters=parse_filters({"source": "beta"}))
    assert filtered and {h.chunk.source for h in filtered} == {"beta"}


def test_search_wrapper_keeps_hybrid_explain(indexed):
    hits = search(indexed, "copper violin harbor", k=3)
    assert len(hits) == 3 and all({"bm25", "cosine"} <= set(h.explain) for h in hits)
    assert hits[0].score == hits[0].explain["cosine"]


def _chunk(cid: str) -> Chunk:
    return Chunk(id=cid, doc_id=f"doc-{cid}", source="s", text=cid, hash=cid)


class _Store:
    """Returns duplicated hits without chunks, as a remote backend might."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids

    def search(self, query: object, k: int = 10, filters: object = None) -> list[Hit]:
        return [Hit(cid, 1.0 / (i + 1)) for i, cid in enumerate(self.ids)][:k]

    def get_vectors(self, chunk_ids: list[str]) -> dict[str, np.ndarray]:
        return {cid: np.ones(2, dtype=np.float32) / np.sqrt(2) for cid in chunk_ids}


@pytest.mark.parametrize("mode", MODES)
def test_duplicates_are_dropped_and_chunks_hydrated(mode):
    state = SimpleNamespace(get_chunks=lambda ids: {cid: _chunk(cid) for cid in ids})
    embedder = SimpleNamespace(embed_query=lambda text: np.array([1.0, 0.0], dtype=np.float32))
    services = SimpleNamespace(lexical=_Store(["a", "b", "a", "c", "b"]), vector=_Store(["c", "c", "d", "a"]),
                               vector_cache=None, embedder=embedder, state=state)
    hits = HybridRetriever(services, mode=mode).retrieve("q", k=10)
    ids = [h.chunk_id for h in hits]
    assert len(ids) == len(set(ids)) and len(ids) >= 2
    assert all(h.chunk is not None and h.doc_id == f"doc-{h.chunk_id}" for h in hits)


def test_bad_arguments_are_config_errors(indexed):
    with pytest.raises(ConfigError):
        HybridRetriever(indexed, mode="dense")
    with pytest.raises(ConfigError):
        HybridRetriever(indexed, candidates=0)
    assert HybridRetriever(indexed).retrieve("river", k=0) == []


def test_cli_search_mode_rrf_explain_shows_both_legs(indexed):
    env = {"RAG_DATA_DIR": str(indexed.data_dir), "RAG_EMBEDDER__BACKEND": "hash",
           "RAG_EMBEDDER__DIM": "256", "RAG_VECTOR__BACKEND": "numpy", "RAG_CONFIG": "",
           "RAG_RETRIEVAL__WEIGHTS": "[1, 1]"}
    _, body = doc_text(5)
    res = CliRunner().invoke(cli, ["search", body.split(".")[0], "--mode", "rrf", "--explain", "-k", "3"],
                             env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    legs = [line for line in res.stdout.splitlines() if line.strip().startswith("legs:")]
    assert len(legs) == 3
    assert "bm25 " in legs[0] and "vector " in legs[0] and "(rank 1)" in legs[0] and "rrf " in legs[0]
    lines = res.stdout.splitlines()
    assert lines[0] == "language en; weights bm25 1.0, vector 1.0: the configured weights"
    assert lines[1].startswith("[1] Note zorfaith")
    steps = [line for line in res.stdout.splitlines() if line.startswith("steps: ")]
    assert len(steps) == 1 and "bm25 " in steps[0] and "vector " in steps[0]
    res = CliRunner().invoke(cli, ["search", body.split(".")[0], "-k", "2", "--json"], env=env,
                             catch_exceptions=False)
    assert '"mode": "rrf"' in res.stdout and '"reranker": "embedding"' in res.stdout  # the settings' default
    res = CliRunner().invoke(cli, ["search", "river", "--mode", "bm25", "--json"], env=env,
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert '"mode": "bm25"' in res.stdout
