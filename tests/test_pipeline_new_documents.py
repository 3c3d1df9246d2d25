"""New documents go into the indexes without a delete first, unless a failed run may have left
chunks the state does not record. On Milvus Lite a delete scans the collection, so deleting
before every new batch made a cold ingest slow down as it grew (quadratic in the pages)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.pipeline import reindex
from ingest.registry import source_from_argument
from ingest.services import open_services
from rag.config import Settings


def _write(folder: Path, name: str, text: str) -> None:
    (folder / name).write_text(f"# {name}\n\n{text}\n", encoding="utf-8")


@pytest.fixture
def services(tmp_path):
    settings = Settings.load(None, data_dir=tmp_path / "data",
                             embedder={"backend": "hash", "progress": False}, vector={"backend": "milvus"})
    services = open_services(settings)
    yield services
    services.close()


def _count_deletes(services, monkeypatch) -> list[list[str]]:
    calls: list[list[str]] = []
    for index in (services.lexical, *services.vector_indexes()):
        original = index.delete_documents

        def spy(doc_ids, _original=original):
            calls.append(list(doc_ids))
            return _original(doc_ids)

        monkeypatch.setattr(index, "delete_documents", spy)
    return calls


def _in_step(services) -> None:
    chunks = services.state.counts()[1]
    assert services.lexical.count() == chunks
    for index in services.vector_indexes():
        assert index.count() == chunks


def _pages(tmp_path: Path, n: int) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(n):
        _write(folder, f"page{i}.md", f"Page {i} tells about topic number {i}. " * 20)
    return folder


def test_cold_ingest_deletes_nothing_and_a_change_replaces_old_chunks(tmp_path, services, monkeypatch):
    folder = _pages(tmp_path, 5)
    services.state.add_source(source_from_argument(str(folder), name="docs"))
    deletes = _count_deletes(services, monkeypatch)

    first = reindex(services, "docs", "full")
    assert first.added == 5 and first.failed == 0
    assert deletes == []
    _in_step(services)

    _write(folder, "page2.md", "Page two now speaks of something else entirely. " * 5)
    _write(folder, "page9.md", "A new page about apples. " * 10)
    second = reindex(services, "docs", "incremental")
    assert (second.changed, second.added) == (1, 1)
    assert {d for call in deletes for d in call} == {"docs:page2.md"}  # only the changed one, never the new
    _in_step(services)


def test_after_a_run_that_failed_half_way_new_documents_are_deleted_first(tmp_path, services, monkeypatch):
    folder = tmp_path / "docs"
    folder.mkdir()
    _write(folder, "a.md", "Alpha version one, about rivers and bridges. " * 30)
    services.state.add_source(source_from_argument(str(folder), name="docs"))

    # The indexes are written, then recording the document in the state fails: the run errors
    # and the state does not know the chunks that are in the indexes.
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    with monkeypatch.context() as m:
        m.setattr(services.state, "save_document", broken)
        with pytest.raises(RuntimeError, match="disk full"):
            reindex(services, "docs", "full")
    assert services.state.counts() == (0, 0) and services.lexical.count() > 0

    _write(folder, "a.md", "Alpha version two, about mountains only. " * 3)
    deletes = _count_deletes(services, monkeypatch)
    again = reindex(services, "docs", "full")
    assert again.added == 1 and again.failed == 0
    assert any("docs:a.md" in call for call in deletes)  # the unrecorded chunks went first
    _in_step(services)

    # That run ended ok, so the next new document is written without a delete.
    deletes.clear()
    _write(folder, "b.md", "Beta, a new page about forests. " * 10)
    third = reindex(services, "docs", "incremental")
    assert third.added == 1 and deletes == []
    _in_step(services)


def test_a_failed_write_stops_the_run_and_no_later_batch_is_written(tmp_path, services, monkeypatch):
    import ingest.pipeline

    monkeypatch.setattr(ingest.pipeline, "EMBED_BATCH_CHUNKS", 1)
    services.state.add_source(source_from_argument(str(_pages(tmp_path, 6)), name="docs"))
    written: list[str] = []
    upsert = services.lexical.upsert

    def upsert_spy(chunks):
        if written:
            raise RuntimeError("index unavailable")
        written.extend(sorted({c.doc_id for c in chunks}))
        return upsert(chunks)

    monkeypatch.setattr(services.lexical, "upsert", upsert_spy)
    with pytest.raises(RuntimeError, match="index unavailable"):
        reindex(services, "docs", "full")
    # The first batch was written and recorded; the failing one and every later one were not.
    assert sorted(services.state.documents("docs")) == written == ["docs:page0.md"]
    assert services.state.runs("docs", limit=1)[0]["status"] == "error"
    _in_step(services)
