"""Extraction in worker processes (``crawl.extract_workers``): the same documents and chunks as
inline, in the same order, and a page whose extraction kills its worker costs that page only."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import ingest.extract_pool
from ingest.extract_pool import CRASHED, ExtractPool, Job, Outcome, run_job
from ingest.pipeline import reindex
from ingest.registry import source_from_argument
from ingest.services import open_services
from ingest.sources import open_source
from ingest.sources.base import Fetched
from rag.config import CrawlSettings, SourceConfig
from tests.conftest import make_settings, publish
from tests.httpserver import LocalServer, QuietServer, _Handler, minimal_pdf, running

CRASH_MARK = "crash-me"


def _crash_on_mark(job: Job) -> Outcome:
    """Extraction that dies as a crash in lxml does (SIGSEGV) on pages whose URL has the mark."""
    if CRASH_MARK in job.url:
        ctypes.string_at(0)  # reads address 0: the worker process gets SIGSEGV
    return run_job(job)


@contextmanager
def _serve(root: Path) -> Iterator[LocalServer]:
    """Serve ``root`` on the first free loopback port of 18200-18299."""
    state = LocalServer(root=root)
    handler = type("Handler", (_Handler,), {"state": state})
    server = None
    for port in range(18200, 18300):
        try:
            server = QuietServer(("127.0.0.1", port), handler)
            break
        except OSError:
            continue
    assert server is not None, "no free port in 18200-18299"
    state.port = server.server_address[1]
    with running(server):
        yield state


def _crawl(cfg: SourceConfig, workers: int, **settings: object) -> list[Fetched]:
    source = open_source(cfg, CrawlSettings(retries=0, timeout_s=10, extract_workers=workers, **settings))
    return list(source.crawl({}, conditional=False))


def _view(results: list[Fetched]) -> list[tuple[object, ...]]:
    """What a crawl reported, in order, without the fetch times."""
    return [(f.url, f.status, f.error_kind, f.etag, f.last_modified,
             f.document and (f.document.id, f.document.title, f.document.text, f.document.lang,
                             f.document.published, f.document.modified)) for f in results]


@pytest.mark.slow
def test_pooled_site_crawl_and_ingest_equal_inline(tmp_path: Path, pydocs):
    served = tmp_path / "www" / "site"
    publish(pydocs["v1"], served)
    with _serve(served.parent) as server:
        cfg = source_from_argument(server.url("/site/index.html"), name="pydocs")
        inline = _crawl(cfg, 0, max_pages=20)
        pooled = _crawl(cfg, 2, max_pages=20)
        assert len(inline) == 20
        assert _view(pooled) == _view(inline)

        chunks = {}
        for workers in (0, 2):
            s = open_services(make_settings(tmp_path / f"data{workers}",
                                            crawl={"max_pages": 20, "extract_workers": workers}))
            s.state.add_source(cfg)
            report = reindex(s, "pydocs", "full")
            assert report.failed == 0 and report.added == 20, report
            chunks[workers] = sorted((c.doc_id, c.id, c.text) for c in s.state.iter_chunks("pydocs"))
            s.close()
        assert chunks[2] == chunks[0] and len(chunks[0]) > 20


def test_pooled_folder_crawl_equals_inline(tmp_path: Path):
    root = tmp_path / "docs"
    (root / "guides").mkdir(parents=True)
    (root / "README.md").write_text("# Read me\n\nWelcome to the handbook.\n", encoding="utf-8")
    (root / "notes.txt").write_text("Plain notes\nsecond line\n", encoding="utf-8")
    for i in range(8):
        (root / "guides" / f"page{i}.html").write_text(
            f"<html><head><title>Page {i}</title></head><body><main><h1>Page {i}</h1>"
            f"<p>Paragraph {i} explains how to install and run the service.</p></main></body></html>",
            encoding="utf-8")
    (root / "guides" / "manual.pdf").write_bytes(minimal_pdf(["PDF manual text"], "Manual"))
    (root / "guides" / "broken.pdf").write_bytes(b"%PDF-1.4 not really a PDF")
    cfg = SourceConfig(name="handbook", kind="folder", location=str(root))
    inline, pooled = _crawl(cfg, 0), _crawl(cfg, 2)
    assert _view(pooled) == _view(inline)
    assert [f.status for f in inline].count("ok") == 11
    assert [f.error_kind for f in inline if f.status == "error"] == ["unreadable"]  # broken.pdf


def test_a_page_that_kills_its_worker_is_one_error_and_the_rest_are_indexed(tmp_path: Path, monkeypatch):
    site = tmp_path / "www"
    names = [f"p{i}.html" for i in range(8)] + [f"{CRASH_MARK}.html"] + [f"q{i}.html" for i in range(8)]
    links = "".join(f'<li><a href="{n}">{n}</a></li>' for n in names)
    (site / "docs").mkdir(parents=True)
    (site / "docs" / "index.html").write_text(
        f"<html><head><title>Index</title></head><body><main><h1>Index</h1>"
        f"<p>All the pages of this small site are listed below.</p><ul>{links}</ul></main></body></html>")
    for n in names:
        (site / "docs" / n).write_text(
            f"<html><head><title>{n}</title></head><body><main><h1>{n}</h1>"
            f"<p>The page {n} has a paragraph of its own about the service.</p></main></body></html>")
    with _serve(site) as server:
        s = open_services(make_settings(tmp_path / "data", crawl={"extract_workers": 2, "retries": 0}))
        s.state.add_source(source_from_argument(server.url("/docs/index.html"), name="docs"))
        first = reindex(s, "docs", "full")
        assert first.added == 18 and first.failed == 0

        monkeypatch.setattr(ingest.extract_pool, "run_job", _crash_on_mark)
        again = reindex(s, "docs", "full")
        assert again.failed == 1 and again.error_kinds == {CRASHED: 1}, again
        assert CRASH_MARK in again.errors[0] and "died" in again.errors[0]
        assert again.unchanged == 17 and again.deleted == 0
        assert s.state.document_row(f"docs:/docs/{CRASH_MARK}.html") is not None  # kept, not deleted
        s.close()


def test_the_pool_recovers_after_a_crash(monkeypatch):
    monkeypatch.setattr(ingest.extract_pool, "run_job", _crash_on_mark)
    pages = [Job(f"<p>page {i}</p>".encode(), "html", f"http://127.0.0.1/{i}.html") for i in range(6)]
    pages.insert(2, Job(b"<p>x</p>", "html", f"http://127.0.0.1/{CRASH_MARK}.html"))
    with ExtractPool(2) as pool:
        handles = [pool.submit(job) for job in pages]
        outcomes = [pool.result(h) for h in handles]
        later = pool.result(pool.submit(pages[0]))
    assert [o.kind for o in outcomes] == [None, None, CRASHED, None, None, None, None]
    assert [o.page.text for o in outcomes if o.page] == [f"page {i}" for i in range(6)]
    assert later.page is not None and later.page.text == "page 0"
    assert pool.crashes >= 1


@pytest.mark.parametrize("workers", [0, 1])
def test_a_page_that_raises_is_its_error(workers: int):
    with ExtractPool(workers) as pool:
        outcome = pool.result(pool.submit(Job(b"%PDF-1.4 garbage", "pdf", "http://127.0.0.1/x.pdf")))
    assert outcome.page is None and outcome.kind == "unreadable"
    assert outcome.error is not None and outcome.error.startswith("http://127.0.0.1/x.pdf: cannot extract pdf")
