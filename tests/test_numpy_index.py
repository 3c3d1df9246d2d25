"""NumpyVectorIndex: the shared vector suite in memory and on disk, plus persistence."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rag.errors import SchemaMismatch
from rag.types import Filters
from rag.vectors.numpy_index import NumpyVectorIndex
from tests.backend_suite import VectorIndexSuite, make_corpus, unit_vectors


class TestNumpyInMemory(VectorIndexSuite):
    @pytest.fixture
    def index(self):
        idx = NumpyVectorIndex(None, self.dim)
        yield idx
        idx.close()


class TestNumpyOnDisk(VectorIndexSuite):
    @pytest.fixture
    def index(self, tmp_path: Path):
        idx = NumpyVectorIndex(tmp_path / "vectors.db", self.dim)
        yield idx
        idx.close()


def test_construction_touches_nothing(tmp_path: Path) -> None:
    NumpyVectorIndex(tmp_path / "sub" / "vectors.db", 8)
    assert not (tmp_path / "sub").exists()


def test_reopen_sees_the_data(tmp_path: Path) -> None:
    corpus, vectors = make_corpus(30), unit_vectors(30, 8)
    first = NumpyVectorIndex(tmp_path / "v.db", 8)
    first.upsert(corpus, vectors)
    first.delete_documents(["doc1"])
    first.close()
    again = NumpyVectorIndex(tmp_path / "v.db", 8)
    assert again.count() == 27
    hit = again.search(vectors[20], k=1)[0]
    assert hit.chunk == corpus[20] and hit.score == pytest.approx(1.0)
    assert np.array_equal(again.get_vectors([corpus[7].id])[corpus[7].id], vectors[7])
    again.close()


def test_reopen_with_another_dimension_is_refused(tmp_path: Path) -> None:
    first = NumpyVectorIndex(tmp_path / "v.db", 8)
    first.upsert(make_corpus(2), unit_vectors(2, 8))
    first.close()
    with pytest.raises(SchemaMismatch, match="8-dimensional"):
        NumpyVectorIndex(tmp_path / "v.db", 16).count()


def test_vectors_by_hash() -> None:
    corpus, vectors = make_corpus(5), unit_vectors(5, 8)
    idx = NumpyVectorIndex(None, 8)
    idx.upsert(corpus, vectors)
    got = idx.vectors_by_hash([corpus[1].hash, "missing", corpus[4].hash])
    assert set(got) == {corpus[1].hash, corpus[4].hash}
    assert np.array_equal(got[corpus[4].hash], vectors[4])


def test_many_deletes_compact_and_stay_correct() -> None:
    n = 6000
    corpus = [replace(c, id=f"k{i}", doc_id=f"doc{i // 2}") for i, c in enumerate(make_corpus(n))]
    vectors = unit_vectors(n, 8)
    idx = NumpyVectorIndex(None, 8)
    idx.upsert(corpus, vectors)
    idx.delete_documents([f"doc{d}" for d in range(0, n // 2, 2)] + [f"doc{d}" for d in range(1, 900, 2)])
    mem = idx._mem
    alive = {c.id for c in corpus if int(c.doc_id[3:]) % 2 == 1 and int(c.doc_id[3:]) >= 900}
    assert mem.n == len(alive)  # compacted: no dead rows left behind
    assert idx.chunk_ids() == alive
    some = sorted(alive)[:50]
    for cid in some[:5]:
        i = int(cid[1:])
        assert idx.search(vectors[i], k=1)[0].chunk_id == cid
    tagged = {h.chunk_id for h in idx.search(vectors[0], k=n, filters=Filters(tags=("faq",)))}
    assert tagged == {c.id for c in corpus if c.id in alive and "faq" in c.tags}


def test_concurrent_readers_and_writer() -> None:
    idx = NumpyVectorIndex(None, 8)
    corpus, vectors = make_corpus(40), unit_vectors(40, 8)
    idx.upsert(corpus[:20], vectors[:20])
    errors: list[BaseException] = []

    def read() -> None:
        try:
            for _ in range(200):
                hits = idx.search(vectors[0], k=5, filters=Filters(lang=("en", "zh")))
                assert all(h.chunk is not None for h in hits)
                idx.get_vectors([c.id for c in corpus])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for i in range(20, 40):
        idx.upsert([corpus[i]], vectors[i: i + 1])
        idx.delete_documents([corpus[i - 20].doc_id])
    for t in readers:
        t.join()
    assert errors == []


def test_sees_writes_made_by_another_process(tmp_path: Path) -> None:
    corpus, vectors = make_corpus(6), unit_vectors(6, 8)
    reader = NumpyVectorIndex(tmp_path / "v.db", 8)
    writer = NumpyVectorIndex(tmp_path / "v.db", 8)  # its own SQLite connection, like a process
    writer.upsert(corpus[:3], vectors[:3])
    assert reader.count() == 3
    writer.upsert(corpus[3:], vectors[3:])
    writer.delete_documents(["doc0"])
    assert reader.chunk_ids() == {c.id for c in corpus[3:]}
    assert reader.search(vectors[4], k=1)[0].chunk_id == corpus[4].id
    reader.close()
    writer.close()
