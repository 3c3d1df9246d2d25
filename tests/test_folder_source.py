"""The folder source: file kinds, ids, hidden files, globs, limits, conditional skipping."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ingest.sources import FolderSource, Source, Validator, open_source
from ingest.sources.base import Fetched
from rag.config import CrawlSettings, SourceConfig
from rag.errors import IngestError
from rag.types import Trust
from tests.httpserver import minimal_pdf


def _cfg(root: Path, **extra: object) -> SourceConfig:
    return SourceConfig(name="handbook", kind="folder", location=str(root), trust="high",
                        tags=("internal",), tenant="acme", **extra)


def _crawl(source: Source, known: dict[str, Validator] | None = None,
           conditional: bool = False) -> dict[str, Fetched]:
    return {f.url: f for f in source.crawl(known or {}, conditional)}


def _known(results: dict[str, Fetched]) -> dict[str, Validator]:
    return {url: Validator(f.etag, f.last_modified) for url, f in results.items()}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "guides" / "deep").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "README.md").write_text("# Read me\n\nWelcome   to the handbook.\n", encoding="utf-8")
    (root / "notes.txt").write_text("Plain notes\nsecond line\n", encoding="utf-8")
    (root / "guides" / "setup.html").write_text(
        "<html><head><title>Setup</title></head><body><h1>Setup</h1>"
        "<p>Install the package and run the service on your own machine.</p></body></html>",
        encoding="utf-8")
    (root / "guides" / "deep" / "manual.pdf").write_bytes(minimal_pdf(["PDF manual text"], "Manual"))
    (root / "guides" / "deep" / "中文.md").write_text("# 检索\n\n检索增强生成的说明文档。\n", encoding="utf-8")
    (root / ".hidden.md").write_text("# hidden\n", encoding="utf-8")
    (root / ".git" / "config.md").write_text("# git\n", encoding="utf-8")
    (root / "picture.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return root


def test_reads_every_supported_file_with_stable_ids(tree: Path):
    source = open_source(_cfg(tree), CrawlSettings())
    assert isinstance(source, FolderSource) and isinstance(source, Source)
    results = _crawl(source)
    assert source.complete
    docs = {f.document.id: f.document for f in results.values() if f.document}
    assert sorted(docs) == [
        "handbook:README.md", "handbook:guides/deep/manual.pdf", "handbook:guides/deep/中文.md",
        "handbook:guides/setup.html", "handbook:notes.txt",
    ]
    assert all(f.status == "ok" for f in results.values())
    readme = docs["handbook:README.md"]
    assert readme.title == "Read me" and readme.text == "# Read me\n\nWelcome to the handbook."
    assert readme.url == (tree / "README.md").as_uri()
    assert (readme.source, readme.trust, readme.tags, readme.tenant) == ("handbook", Trust.high,
                                                                        ("internal",), "acme")
    assert readme.lang == "en" and docs["handbook:guides/deep/中文.md"].lang == "zh"
    stat = (tree / "README.md").stat()
    assert readme.modified == datetime.fromtimestamp(stat.st_mtime_ns / 1e9, tz=UTC)
    assert readme.fetched_at is not None and readme.fetched_at.tzinfo is not None
    assert results[readme.url].last_modified == f"{stat.st_mtime_ns}:{stat.st_size}"
    assert docs["handbook:notes.txt"].title == "notes"
    assert docs["handbook:guides/setup.html"].title == "Setup"
    assert docs["handbook:guides/deep/manual.pdf"].text == "PDF manual text"
    assert docs["handbook:guides/deep/manual.pdf"].title == "Manual"


def test_conditional_crawl_skips_unchanged_files_without_reading_them(tree: Path):
    source = FolderSource(_cfg(tree), CrawlSettings())
    first = _crawl(source)
    readme, notes = tree / "README.md", tree / "notes.txt"
    # Same size and the same mtime: a conditional crawl must not even open the file.
    stat = readme.stat()
    readme.write_text("# Read me\n\nWelcome   to the HANDBOOK.\n", encoding="utf-8")
    os.utime(readme, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    notes.write_text("Plain notes, changed\n", encoding="utf-8")
    second = _crawl(source, _known(first), conditional=True)
    assert source.complete
    assert second[readme.as_uri()].status == "not_modified"
    assert second[readme.as_uri()].last_modified == first[readme.as_uri()].last_modified
    assert second[notes.as_uri()].status == "ok"
    assert second[notes.as_uri()].document.text == "Plain notes, changed"
    assert {f.status for u, f in second.items() if u != notes.as_uri()} == {"not_modified"}
    # Unconditionally, everything is read again.
    third = _crawl(source, _known(first), conditional=False)
    assert {f.status for f in third.values()} == {"ok"}
    assert "HANDBOOK" in third[readme.as_uri()].document.text


def test_include_exclude_globs_on_relative_paths(tree: Path):
    source = FolderSource(_cfg(tree, include=("guides/*",), exclude=("*.pdf",)), CrawlSettings())
    ids = {f.document.id for f in _crawl(source).values()}
    assert ids == {"handbook:guides/setup.html", "handbook:guides/deep/中文.md"}


def test_oversize_and_undecodable_files_are_errors_not_fatal(tree: Path):
    (tree / "big.txt").write_text("x" * 5000, encoding="utf-8")
    (tree / "binary.txt").write_bytes(b"\x00\x01\x02\x03 not text")
    source = FolderSource(_cfg(tree), CrawlSettings(max_bytes=1024))
    results = _crawl(source)
    big, binary = results[(tree / "big.txt").as_uri()], results[(tree / "binary.txt").as_uri()]
    assert big.status == "error" and "larger than 1024 bytes" in big.error
    assert binary.status == "error" and "cannot extract text" in binary.error
    assert results[(tree / "README.md").as_uri()].status == "ok"
    assert source.complete  # the folder itself was listed in full


def test_max_pages_truncates_and_leaves_the_crawl_incomplete(tree: Path):
    source = FolderSource(_cfg(tree, max_pages=2), CrawlSettings())
    assert len(_crawl(source)) == 2
    assert not source.complete


def test_missing_folder_raises_when_the_crawl_starts(tmp_path: Path):
    source = open_source(_cfg(tmp_path / "nope"), CrawlSettings())
    crawl = source.crawl({}, conditional=False)
    with pytest.raises(IngestError, match=r"source 'handbook': folder not found: .*nope"):
        next(crawl)
    assert not source.complete


def test_file_uri_location(tree: Path):
    source = FolderSource(_cfg(Path("/unused")).model_copy(update={"location": tree.as_uri()}),
                          CrawlSettings())
    assert len(_crawl(source)) == 5 and source.complete


def test_lang_from_config_wins(tree: Path):
    source = FolderSource(_cfg(tree, lang="de"), CrawlSettings())
    assert {f.document.lang for f in _crawl(source).values()} == {"de"}
