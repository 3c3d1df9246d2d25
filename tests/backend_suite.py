"""Tests every backend must pass, unchanged. Subclass a suite and provide the ``index`` fixture.

Filter tests compare the backend's result set with :func:`rag.filters.matches` applied to the
inserted chunks, for each filter field alone and for a batch of random combinations.

Example::

    class TestMyIndex(VectorIndexSuite):
        @pytest.fixture
        def index(self):
            idx = MyIndex(dim=self.dim)
            yield idx
            idx.close()
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from rag.errors import SchemaMismatch
from rag.filters import matches
from rag.types import Chunk, Filters, LexicalIndex, Trust, VectorIndex

__all__ = ["LexicalIndexSuite", "VectorIndexSuite", "make_corpus", "unit_vectors", "filter_cases"]

_BASE = datetime(2024, 1, 1, tzinfo=UTC)
_SOURCES, _TENANTS = ("docs", "blog", "wiki"), (None, "acme", "globex")
_TAGS, _LANGS = ("faq", "api", "ops"), ("en", "zh", "und")


def _date(rng: random.Random) -> datetime | None:
    if rng.random() < 0.25:
        return None
    return _BASE + timedelta(days=rng.randrange(0, 400), microseconds=rng.randrange(0, 10**6))


def make_corpus(n: int = 60, seed: int = 7) -> list[Chunk]:
    """Chunks with varied metadata; every text holds the word ``common`` and a unique word."""
    rng = random.Random(seed)
    return [
        Chunk(
            id=f"c{i:03d}", doc_id=f"doc{i // 3}", source=rng.choice(_SOURCES),
            text=f"common passage number w{i}x about topic {rng.choice(('alpha', 'beta'))}",
            hash=f"h{i}", ordinal=i % 3, title=f"Title {i // 3}", url=f"https://example.org/{i // 3}",
            lang=rng.choice(_LANGS), published=_date(rng), modified=_date(rng),
            trust=Trust(rng.randrange(3)), tags=tuple(t for t in _TAGS if rng.random() < 0.4),
            tenant=rng.choice(_TENANTS),
        )
        for i in range(n)
    ]


def unit_vectors(n: int, dim: int, seed: int = 3) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def filter_cases(corpus: list[Chunk], n_random: int = 30, seed: int = 11) -> list[Filters]:
    """One filter per field (dates bounded by exact stored values), then random combinations."""
    dates = sorted(c.published for c in corpus if c.published)
    mods = sorted(c.modified for c in corpus if c.modified)
    cases = [
        Filters(source=("docs",)), Filters(source=("blog", "wiki")), Filters(source=("nope",)),
        Filters(tenant="acme"), Filters(tenant="nope"), Filters(tags=("faq",)), Filters(tags=("api", "ops")),
        Filters(tags=("nope",)), Filters(lang=("zh",)), Filters(lang=("en", "und")),
        Filters(min_trust=Trust.low), Filters(min_trust=Trust.normal), Filters(min_trust=Trust.high),
        Filters(published_from=dates[len(dates) // 2]), Filters(published_to=dates[len(dates) // 3]),
        Filters(published_from=dates[5], published_to=dates[-5]),
        Filters(modified_from=mods[3]), Filters(modified_to=mods[-3]),
        Filters(modified_from=mods[2], modified_to=mods[2]),
    ]
    rng = random.Random(seed)
    for _ in range(n_random):
        kw: dict = {}
        if rng.random() < 0.4:
            kw["source"] = tuple(rng.sample(_SOURCES, rng.randint(1, 2)))
        if rng.random() < 0.3:
            kw["tenant"] = rng.choice(_TENANTS[1:])
        if rng.random() < 0.4:
            kw["tags"] = tuple(rng.sample(_TAGS, rng.randint(1, 2)))
        if rng.random() < 0.3:
            kw["lang"] = tuple(rng.sample(_LANGS, rng.randint(1, 2)))
        if rng.random() < 0.3:
            kw["min_trust"] = Trust(rng.randrange(3))
        for name, pool in (("published", dates), ("modified", mods)):
            if rng.random() < 0.3:
                lo, hi = sorted(rng.sample(pool, 2))
                kw.update({f"{name}_from": lo} if rng.random() < 0.5 else {f"{name}_to": hi})
        cases.append(Filters(**kw))
    return cases


def _full_chunk() -> Chunk:
    return Chunk(
        id="rt-1", doc_id="site:https://example.org/a?b=1", source="docs",
        text="Round trip: naïve café, 黑豹队 “quotes” \"double\" \\ back\nslash\ttab", hash="abc123",
        ordinal=7, title="A title — with dash", url="https://example.org/a?b=1#x", heading="Intro › Part",
        lang="zh", published=datetime(2023, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
        modified=datetime(2024, 2, 29, 23, 59, 59, 999999, tzinfo=UTC), trust=Trust.high,
        tags=("faq", "a b", 'q"t'), tenant="acme",
    )


def _odd_ids(corpus: list[Chunk]) -> list[Chunk]:
    """The corpus with the chunks of ``doc1`` under ids that need escaping in query languages."""
    odd = {3: 'c"003\\', 4: "c'004 ", 5: "c[005]\n"}
    return [replace(c, id=odd.get(i, c.id)) for i, c in enumerate(corpus)]


class LexicalIndexSuite:
    """Behaviour shared by every :class:`~rag.types.LexicalIndex`. ``index`` must start empty."""

    @pytest.fixture
    def index(self) -> LexicalIndex:
        raise NotImplementedError("a backend's test class provides the index fixture")

    def test_implements_protocol(self, index: LexicalIndex) -> None:
        assert isinstance(index, LexicalIndex)

    def test_search_finds_the_right_chunk(self, index: LexicalIndex) -> None:
        index.upsert(make_corpus())
        hits = index.search("w17x", k=5)
        assert [h.chunk_id for h in hits] == ["c017"]
        assert hits[0].doc_id == "doc5" and hits[0].score > 0

    def test_results_are_ranked_and_limited(self, index: LexicalIndex) -> None:
        index.upsert(make_corpus())
        hits = index.search("common w3x", k=7)
        assert len(hits) == 7 and hits[0].chunk_id == "c003"
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)

    def test_upsert_same_id_replaces(self, index: LexicalIndex) -> None:
        c = make_corpus(3)
        index.upsert(c)
        index.upsert([replace(c[0], text="completely different wording")])
        assert index.count() == 3
        assert index.search("w0x") == []
        assert [h.chunk_id for h in index.search("wording")] == ["c000"]

    def test_duplicate_ids_in_one_batch_keep_the_last(self, index: LexicalIndex) -> None:
        c = make_corpus(1)[0]
        index.upsert([c, replace(c, text="second version")])
        assert index.count() == 1
        assert index.search("second")[0].chunk.text == "second version"

    def test_delete_documents_removes_all_chunks_of_a_doc_only(self, index: LexicalIndex) -> None:
        corpus = make_corpus(9)
        index.upsert(corpus)
        index.delete_documents(["doc1", "missing-doc"])
        assert index.chunk_ids() == {c.id for c in corpus if c.doc_id != "doc1"}
        assert index.search("w4x") == []
        assert index.count() == 6

    def test_delete_chunks_keeps_the_rest_of_the_document(self, index: LexicalIndex) -> None:
        corpus = _odd_ids(make_corpus(9))
        index.upsert(corpus)
        index.delete_chunks([corpus[3].id, corpus[5].id])
        remaining = {c.id for c in corpus} - {corpus[3].id, corpus[5].id}
        assert index.chunk_ids() == remaining
        assert index.count() == len(index.chunk_ids()) == 7
        assert [h.chunk_id for h in index.search("w4x")] == [corpus[4].id]
        assert index.search("w3x") == [] and index.search("w5x") == []

    def test_delete_unknown_chunks_is_a_no_op(self, index: LexicalIndex) -> None:
        corpus = make_corpus(6)
        index.upsert(corpus)
        index.delete_chunks([])
        index.delete_chunks(["missing", "doc0", 'c"000'])  # a doc id is not a chunk id
        assert index.chunk_ids() == {c.id for c in corpus}
        assert index.count() == len(index.chunk_ids()) == 6

    def test_filters_agree_with_reference(self, index: LexicalIndex) -> None:
        corpus = make_corpus()
        index.upsert(corpus)
        for f in filter_cases(corpus):
            got = {h.chunk_id for h in index.search("common", k=1000, filters=f)}
            assert got == {c.id for c in corpus if matches(c, f)}, f

    def test_empty_filters_do_not_filter(self, index: LexicalIndex) -> None:
        corpus = make_corpus()
        index.upsert(corpus)
        assert len(index.search("common", k=1000, filters=Filters())) == len(corpus)

    def test_chinese_query_finds_chinese_text(self, index: LexicalIndex) -> None:
        index.upsert([
            Chunk(id="zh1", doc_id="d1", source="s", hash="1", lang="zh",
                  text="黑豹队的防守只丢了 308分，在联盟中排名第六。"),
            Chunk(id="zh2", doc_id="d2", source="s", hash="2", lang="zh",
                  text="今天的天气很好，我们去公园散步。"),
            Chunk(id="en1", doc_id="d3", source="s", hash="3",
                  text="The Panthers defense gave up 308 points."),
        ])
        hits = index.search("黑豹队的防守丢了多少分", k=3)
        assert hits and hits[0].chunk_id == "zh1"

    def test_english_stemming(self, index: LexicalIndex) -> None:
        index.upsert([
            Chunk(id="a", doc_id="d1", source="s", hash="1", text="The spider crawled up the wall."),
            Chunk(id="b", doc_id="d2", source="s", hash="2", text="Nothing related here."),
        ])
        assert [h.chunk_id for h in index.search("crawling")] == ["a"]
        assert [h.chunk_id for h in index.search("CRAWLS")] == ["a"]

    @pytest.mark.parametrize("query", ['foo:bar (', "AND", '"', "*", "foo AND (bar OR", "title:x^2 ~",
                                       "[1 TO 5]", "-", "\\", "a' OR '1'='1", "path/to/file.py?"])
    def test_query_syntax_is_just_text(self, index: LexicalIndex, query: str) -> None:
        index.upsert([Chunk(id="s", doc_id="d", source="s", hash="1",
                            text="foo and bar or title x to 1 5 path to file py")])
        hits = index.search(query)
        assert isinstance(hits, list)
        if any(ch.isalnum() for ch in query):
            assert [h.chunk_id for h in hits] == ["s"]

    def test_non_breaking_spaces_in_query(self, index: LexicalIndex) -> None:
        index.upsert(make_corpus())
        assert index.search("\xa0w12x\xa0common\u3000")[0].chunk_id == "c012"

    @pytest.mark.parametrize("query", ["", "   ", "\xa0", "()", "*?!", "。，"])
    def test_query_without_terms_returns_nothing(self, index: LexicalIndex, query: str) -> None:
        index.upsert(make_corpus(3))
        assert index.search(query) == []

    def test_chunk_round_trip(self, index: LexicalIndex) -> None:
        chunk = _full_chunk()
        index.upsert([chunk])
        (hit,) = index.search("café")
        assert hit.chunk == chunk
        assert hit.chunk.published.tzinfo is not None and hit.chunk.published.utcoffset() == timedelta(0)

    def test_count_and_chunk_ids(self, index: LexicalIndex) -> None:
        assert index.count() == 0 and index.chunk_ids() == set()
        corpus = make_corpus(12)
        index.upsert(corpus)
        assert index.count() == 12
        assert index.chunk_ids() == {c.id for c in corpus}
        assert index.chunk_ids(source="docs") == {c.id for c in corpus if c.source == "docs"}
        assert index.chunk_ids(source="nope") == set()


class VectorIndexSuite:
    """Behaviour shared by every :class:`~rag.types.VectorIndex` of dimension ``dim``."""

    dim = 16

    @pytest.fixture
    def index(self) -> VectorIndex:
        raise NotImplementedError("a backend's test class provides the index fixture")

    def _load(self, index: VectorIndex, n: int = 60) -> tuple[list[Chunk], np.ndarray]:
        corpus, vectors = make_corpus(n), unit_vectors(n, self.dim)
        index.upsert(corpus, vectors)
        return corpus, vectors

    def test_implements_protocol(self, index: VectorIndex) -> None:
        assert isinstance(index, VectorIndex)

    def test_nearest_neighbour_is_itself(self, index: VectorIndex) -> None:
        corpus, vectors = self._load(index)
        for i in (0, 17, 59):
            hits = index.search(vectors[i], k=3)
            assert hits[0].chunk_id == corpus[i].id and hits[0].doc_id == corpus[i].doc_id
            assert hits[0].score == pytest.approx(1.0, abs=1e-4)
            assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)

    def test_k_limits_results(self, index: VectorIndex) -> None:
        _, vectors = self._load(index)
        assert len(index.search(vectors[0], k=5)) == 5
        assert len(index.search(vectors[0], k=500)) == 60

    def test_filters_agree_with_reference(self, index: VectorIndex) -> None:
        corpus, _ = self._load(index)
        query = unit_vectors(1, self.dim, seed=99)[0]
        for f in filter_cases(corpus):
            got = {h.chunk_id for h in index.search(query, k=len(corpus), filters=f)}
            assert got == {c.id for c in corpus if matches(c, f)}, f

    def test_filtered_results_keep_score_order(self, index: VectorIndex) -> None:
        corpus, vectors = self._load(index)
        scores = vectors @ vectors[5]
        f = Filters(source=("docs",))
        expected = sorted((c.id for c in corpus if matches(c, f)), key=lambda cid: -scores[int(cid[1:])])
        assert [h.chunk_id for h in index.search(vectors[5], k=4, filters=f)] == expected[:4]

    def test_get_vectors_round_trip(self, index: VectorIndex) -> None:
        corpus, vectors = self._load(index)
        got = index.get_vectors([corpus[3].id, "missing", corpus[40].id])
        assert set(got) == {corpus[3].id, corpus[40].id}
        assert np.allclose(got[corpus[3].id], vectors[3], atol=1e-6)
        assert np.allclose(got[corpus[40].id], vectors[40], atol=1e-6)
        assert index.get_vectors([]) == {}

    def test_delete_documents(self, index: VectorIndex) -> None:
        corpus, vectors = self._load(index, 9)
        index.delete_documents(["doc0", "missing-doc"])
        remaining = {c.id for c in corpus if c.doc_id != "doc0"}
        assert index.chunk_ids() == remaining and index.count() == 6
        assert {h.chunk_id for h in index.search(vectors[0], k=50)} == remaining
        assert index.get_vectors([corpus[0].id]) == {}

    def test_delete_chunks_keeps_the_rest_of_the_document(self, index: VectorIndex) -> None:
        corpus, vectors = _odd_ids(make_corpus(9)), unit_vectors(9, self.dim)
        index.upsert(corpus, vectors)
        index.delete_chunks([corpus[3].id, corpus[5].id])
        remaining = {c.id for c in corpus} - {corpus[3].id, corpus[5].id}
        assert index.chunk_ids() == remaining
        assert index.count() == len(index.chunk_ids()) == 7
        assert {h.chunk_id for h in index.search(vectors[3], k=50)} == remaining
        assert set(index.get_vectors([c.id for c in corpus[3:6]])) == {corpus[4].id}

    def test_delete_unknown_chunks_is_a_no_op(self, index: VectorIndex) -> None:
        corpus, _ = self._load(index, 6)
        index.delete_chunks([])
        index.delete_chunks(["missing", "doc0", 'c"000'])  # a doc id is not a chunk id
        assert index.chunk_ids() == {c.id for c in corpus}
        assert index.count() == len(index.chunk_ids()) == 6

    def test_upsert_same_id_replaces(self, index: VectorIndex) -> None:
        corpus, vectors = self._load(index, 6)
        index.upsert([replace(corpus[0], text="new text")], vectors[5:6])
        assert index.count() == 6
        hits = index.search(vectors[5], k=2)
        assert {h.chunk_id for h in hits} == {corpus[0].id, corpus[5].id}
        assert next(h for h in hits if h.chunk_id == corpus[0].id).chunk.text == "new text"
        assert np.allclose(index.get_vectors([corpus[0].id])[corpus[0].id], vectors[5], atol=1e-6)

    def test_dimension_mismatch_is_refused(self, index: VectorIndex) -> None:
        chunk = make_corpus(1)
        with pytest.raises(SchemaMismatch):
            index.upsert(chunk, unit_vectors(1, self.dim + 1))
        self._load(index, 3)
        with pytest.raises(SchemaMismatch):
            index.search(unit_vectors(1, self.dim - 1)[0], k=3)

    def test_chunk_round_trip(self, index: VectorIndex) -> None:
        chunk = _full_chunk()
        vector = unit_vectors(1, self.dim)
        index.upsert([chunk], vector)
        (hit,) = index.search(vector[0], k=5)
        assert hit.chunk == chunk
        assert hit.chunk.published.utcoffset() == timedelta(0)

    def test_chunk_without_optional_fields_round_trips(self, index: VectorIndex) -> None:
        chunk = Chunk(id="bare", doc_id="d", source="s", text="t", hash="h")
        vector = unit_vectors(1, self.dim)
        index.upsert([chunk], vector)
        assert index.search(vector[0], k=1)[0].chunk == chunk

    def test_count_and_chunk_ids(self, index: VectorIndex) -> None:
        assert index.count() == 0 and index.chunk_ids() == set()
        corpus, _ = self._load(index, 12)
        assert index.count() == 12
        assert index.chunk_ids() == {c.id for c in corpus}
        assert index.chunk_ids(source="blog") == {c.id for c in corpus if c.source == "blog"}
        assert index.chunk_ids(source="nope") == set()

    def test_empty_index_search(self, index: VectorIndex) -> None:
        assert index.search(unit_vectors(1, self.dim)[0], k=3) == []
