"""TantivyIndex: the shared lexical suite in memory and on disk, plus persistence and locking."""

from __future__ import annotations

from pathlib import Path

import pytest
import tantivy

from rag.errors import DataDirLocked, SchemaMismatch
from rag.lexical.tantivy_index import TantivyIndex
from rag.lexical.tokenize import query_terms
from tests.backend_suite import LexicalIndexSuite, make_corpus


class TestTantivyInMemory(LexicalIndexSuite):
    @pytest.fixture
    def index(self):
        idx = TantivyIndex(None)
        yield idx
        idx.close()


class TestTantivyOnDisk(LexicalIndexSuite):
    @pytest.fixture
    def index(self, tmp_path: Path):
        idx = TantivyIndex(tmp_path / "lexical")
        yield idx
        idx.close()


def test_construction_touches_nothing(tmp_path: Path) -> None:
    TantivyIndex(tmp_path / "lexical")
    assert not (tmp_path / "lexical").exists()


def test_reopen_sees_the_data(tmp_path: Path) -> None:
    corpus = make_corpus(20)
    with TantivyIndex(tmp_path / "lex") as first:
        first.upsert(corpus)
        first.delete_documents(["doc0"])
    reopened = TantivyIndex(tmp_path / "lex")
    assert reopened.count() == 17
    assert reopened.search("w10x")[0].chunk == corpus[10]
    reopened.close()


def test_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "lex"
    first, second = TantivyIndex(path), TantivyIndex(path)
    first.upsert(make_corpus(3))
    assert second.count() == 3  # readers need no lock
    with pytest.raises(DataDirLocked, match="another process"):
        second.upsert(make_corpus(3))
    with pytest.raises(DataDirLocked):
        second.acquire_writer()
    first.close()
    second.delete_documents(["doc0"])
    assert second.count() == 0
    second.close()


def test_other_schema_on_disk_is_refused(tmp_path: Path) -> None:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("something_else", stored=True)
    tantivy.Index(sb.build(), path=str(tmp_path))
    with pytest.raises(SchemaMismatch):
        TantivyIndex(tmp_path).count()


def test_query_analysis_matches_index_analysis() -> None:
    terms = query_terms("Crawling\xa0ＰＹＴＨＯＮ 黑豹队的防守 foo:bar")
    assert terms.english == ("crawl", "python", "foo", "bar")
    assert "防守" in terms.cjk and "黑豹" in terms.cjk


def test_title_and_heading_are_searchable() -> None:
    c = make_corpus(1)[0]
    from dataclasses import replace

    with TantivyIndex(None) as idx:
        idx.upsert([replace(c, title="Installation guide", heading="Upgrading")])
        assert idx.search("installation")[0].chunk_id == c.id
        assert idx.search("upgrade")[0].chunk_id == c.id
