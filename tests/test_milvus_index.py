"""MilvusVectorIndex: the shared vector suite on Milvus Lite (one file per session, one
collection per test), on a real server when RAG_TEST_MILVUS_URI is set, and Milvus specifics."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rag.errors import BackendUnavailable, DataDirLocked, SchemaMismatch
from rag.types import Chunk, Filters, Trust
from rag.vectors.milvus import NO_DATE, MilvusVectorIndex, filter_expression, quote
from tests.backend_suite import VectorIndexSuite, make_corpus, unit_vectors
from tests.fixtures.milvus import collection_name


@pytest.fixture(scope="session")
def milvus_lite_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("milvus") / "milvus.db")


SERVER_URI = os.environ.get("RAG_TEST_MILVUS_URI", "")
ON_SERVER = [pytest.mark.integration,
             pytest.mark.skipif(not SERVER_URI, reason="RAG_TEST_MILVUS_URI is not set")]


@pytest.fixture(params=["lite", pytest.param("server", marks=ON_SERVER)])
def milvus_uri(request: pytest.FixtureRequest) -> str:
    """Milvus Lite, then the server when there is one (their expression parsers differ)."""
    return request.getfixturevalue("milvus_lite_uri") if request.param == "lite" else SERVER_URI


def _index(uri: str, request: pytest.FixtureRequest, dim: int, token: str | None = None
           ) -> Iterator[MilvusVectorIndex]:
    idx = MilvusVectorIndex(uri, collection_name(request), dim, token=token)
    idx.drop()  # a leftover from an interrupted run
    yield idx
    idx.drop()
    idx.close()


class TestMilvusLite(VectorIndexSuite):
    @pytest.fixture
    def index(self, milvus_lite_uri: str, request: pytest.FixtureRequest):
        yield from _index(milvus_lite_uri, request, self.dim)


@pytest.mark.integration
@pytest.mark.skipif(not SERVER_URI, reason="RAG_TEST_MILVUS_URI is not set")
class TestMilvusServer(VectorIndexSuite):
    @pytest.fixture
    def index(self, request: pytest.FixtureRequest):
        yield from _index(SERVER_URI, request, self.dim,
                          token=os.environ.get("RAG_TEST_MILVUS_TOKEN"))


def test_construction_connects_to_nothing() -> None:
    idx = MilvusVectorIndex("http://127.0.0.1:9", "anything", 8, timeout_s=2)
    assert idx._client is None
    with pytest.raises(BackendUnavailable, match="127.0.0.1:9"):
        idx.count()


def test_existing_collection_with_another_dimension(milvus_uri: str,
                                                    request: pytest.FixtureRequest) -> None:
    for idx in _index(milvus_uri, request, 8):
        idx.upsert(make_corpus(2), unit_vectors(2, 8))
        other = MilvusVectorIndex(milvus_uri, idx.collection, 16)
        with pytest.raises(SchemaMismatch, match="8-dimensional"):
            other.count()
        other.close()


def test_long_text_is_cut_at_a_character_boundary(milvus_uri: str,
                                                  request: pytest.FixtureRequest) -> None:
    text = "黑" * 30000  # 90,000 bytes of UTF-8
    for idx in _index(milvus_uri, request, 8):
        idx.upsert([Chunk(id="long", doc_id="d", source="s", text=text, hash="h")], unit_vectors(1, 8))
        stored = idx.search(unit_vectors(1, 8)[0], k=1)[0].chunk.text
        assert stored == "黑" * (65535 // 3)


def test_quote_escapes_what_milvus_unescapes() -> None:
    assert quote('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    assert filter_expression(Filters(source=('s"',), tags=("x",), min_trust=Trust.high)) == (
        '(source in ["s\\""]) and (array_contains_any(tags, ["x"])) and (trust >= 2)'
    )
    assert filter_expression(None) == "" and filter_expression(Filters()) == ""


def test_special_characters_in_values(milvus_uri: str, request: pytest.FixtureRequest) -> None:
    odd = 'we"ird\\ \'va\nlue\t'
    chunks = [Chunk(id=odd + str(i), doc_id=odd, source=odd, text="t", hash="h", tags=(odd,), tenant=odd)
              for i in range(2)]
    for idx in _index(milvus_uri, request, 8):
        vectors = unit_vectors(2, 8)
        idx.upsert(chunks, vectors)
        f = Filters(source=(odd,), tags=(odd,), tenant=odd)
        assert {h.chunk_id for h in idx.search(vectors[0], k=5, filters=f)} == {c.id for c in chunks}
        assert set(idx.get_vectors([c.id for c in chunks])) == {c.id for c in chunks}
        assert idx.chunk_ids(source=odd) == {c.id for c in chunks}
        idx.delete_documents([odd])
        assert idx.count() == 0


def test_date_ranges_exclude_the_sentinel() -> None:
    expr = filter_expression(Filters(published_to=datetime(2024, 1, 1, tzinfo=UTC)))
    assert f"published != {NO_DATE}" in expr and "published <= 1704067200000000" in expr


def test_drop_then_reuse(milvus_lite_uri: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    for idx in _index(milvus_lite_uri, request, 8):
        idx.upsert(make_corpus(3), unit_vectors(3, 8))
        idx.drop()
        assert idx.count() == 0


def test_chunk_ids_pages_through_everything(milvus_uri: str, request: pytest.FixtureRequest,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import rag.vectors.milvus as milvus_module

    monkeypatch.setattr(milvus_module, "_PAGE", 4)
    corpus = [replace(c, id=f'id"{i:02d}\\') for i, c in enumerate(make_corpus(13))]
    for idx in _index(milvus_uri, request, 8):
        idx.upsert(corpus, unit_vectors(13, 8))
        assert idx.chunk_ids() == {c.id for c in corpus}
        assert idx.chunk_ids(source="docs") == {c.id for c in corpus if c.source == "docs"}


def test_milvus_lite_file_held_by_another_process(tmp_path: Path) -> None:
    uri = str(tmp_path / "held.db")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pymilvus import MilvusClient; MilvusClient(uri=sys.argv[1]); "
         "print('ready', flush=True); time.sleep(60)", uri],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        idx = MilvusVectorIndex(uri, "c", 8)
        with pytest.raises(DataDirLocked, match="another process"):
            idx.count()
    finally:
        holder.kill()
        holder.communicate()


def test_driver_errors_map_to_the_error_tree() -> None:
    import grpc
    from pymilvus.exceptions import MilvusException

    from rag.errors import BackendError, BackendTimeout
    from rag.vectors.milvus import _translate

    timeout = MilvusException(code=grpc.StatusCode.DEADLINE_EXCEEDED, message="[search] Retry timeout: 2s")
    assert type(_translate(timeout, "ctx")) is BackendTimeout
    refused = MilvusException(code=2, message="Fail connecting to server on h:19530")
    assert type(_translate(refused, "ctx")) is BackendUnavailable
    other = MilvusException(code=1100, message="invalid parameter")
    mapped = _translate(other, "ctx")
    assert type(mapped) is BackendError and "invalid parameter" in str(mapped)
