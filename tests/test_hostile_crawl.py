"""Crawling a hostile site on 127.0.0.1 (tests/hostile_site.py): every fault is an error for its
own URL with a named kind, memory stays bounded, the crawl ends, and no document is deleted."""

from __future__ import annotations

import tracemalloc

import pytest

from ingest.extract import extract
from ingest.pipeline import reindex
from ingest.services import open_services
from ingest.sources import SiteSource
from rag.config import CrawlSettings, SourceConfig
from rag.metrics import REGISTRY
from tests.conftest import make_settings
from tests.hostile_site import HEALTHY, HostileSite, hostile_site

MB = 1024 * 1024
# Small limits, so the faults show in seconds: what matters is that each one is met.
CRAWL = dict(timeout_s=1.0, page_deadline_s=2.0, retries=1, backoff_s=0.01, concurrency=4,
             max_bytes=2 * MB, max_pages=60)
EXPECTED_ERRORS = {
    "hang": "timeout", "drip": "slow", "e500": "http", "truncated": "connection", "loop-a": "redirects",
    "huge": "too_large", "huge-unsized": "too_large", "bomb": "too_large", "binary": "unreadable",
}


@pytest.fixture(scope="module")
def site():
    with hostile_site() as running:
        yield running


def _name(url: str) -> str:
    return url.split("/docs/", 1)[1].removesuffix(".html")


def test_each_fault_is_an_error_of_its_own_kind_and_memory_stays_bounded(site: HostileSite):
    source = SiteSource(SourceConfig(name="hostile", kind="site", location=site.url("/docs/index.html")),
                        CrawlSettings(**CRAWL))
    # Load what extraction loads once per process (about 30 MB of language models), so the
    # peak below is what the crawl itself holds.
    extract(b"<html><body><p>A first page, in English, to warm up.</p></body></html>", "html", url="http://h/")
    tracemalloc.start()
    try:
        results = {_name(item.url): item for item in source.crawl(known={}, conditional=False)}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    errors = {name: item.error_kind for name, item in results.items() if item.status == "error"}
    assert errors == EXPECTED_ERRORS, errors
    assert all(name in results[name].error for name in errors)  # each message names its page
    for name in HEALTHY:
        assert results[name].status == "ok" and f"Healthy page {name}" in results[name].document.text
    # Wrong or missing charsets are read right: Latin-1 declared as UTF-8, GBK declared as nothing.
    assert "Un café crème à la française" in results["latin1"].document.text
    assert "检索增强生成的答案必须引用来源文档" in results["gbk"].document.text
    assert results["empty"].status == "ok" and not results["empty"].document.text.strip()
    # robots.txt is obeyed, and the endless calendar stops at max_pages, so the crawl is
    # incomplete (no deletions may follow from it).
    assert site.counts["/docs/private/secret.html"] == 0 and "private/secret" not in results
    assert sum(name.startswith("cal/") for name in results) > 10
    assert len(results) == CRAWL["max_pages"] and not source.complete
    # 50 MB pages and a 1 GiB gzip bomb, four fetched at a time, never held more than
    # max_bytes each: httpx alone inflates one 64 KB read of the bomb to about 64 MB.
    assert peak < 5 * CRAWL["max_bytes"], f"peak traced memory {peak / MB:.1f} MB"


def _errors(source: str, kind: str) -> float:
    return REGISTRY.get_sample_value("crawl_errors_total", {"source": source, "kind": kind}) or 0.0


def test_a_site_that_breaks_after_a_good_crawl_loses_no_document(tmp_path, site: HostileSite):
    services = open_services(make_settings(tmp_path / "data", crawl=CRAWL))
    services.state.add_source(SourceConfig(name="hostile", kind="site", location=site.url("/docs/index.html")))
    with services.write_lock():
        first = reindex(services, "hostile", "full")
    indexed = services.state.counts("hostile")[0]
    assert first.added == indexed and indexed >= len(HEALTHY) + 3  # healthy, charset pages, calendar
    assert first.error_kinds == {**{k: list(EXPECTED_ERRORS.values()).count(k) for k in set(EXPECTED_ERRORS.values())},
                                 "no_text": 1}  # the empty page
    assert first.failed == len(EXPECTED_ERRORS) + 1 and not first.complete

    # The site breaks: six of its eight healthy pages answer 500 from now on.
    site.broken = set(HEALTHY[:6])
    http_before = _errors("hostile", "http")
    for mode in ("incremental", "full"):
        with services.write_lock():
            report = reindex(services, "hostile", mode)
        assert report.deleted == 0 and report.chunks_deleted == 0, report
        assert report.error_kinds["http"] == 1 + 6 and report.failed == first.failed + 6
        assert services.state.counts("hostile")[0] == indexed
    assert _errors("hostile", "http") == http_before + 2 * 7  # every URL of every run, counted
    hits = services.lexical.search("Healthy page p0", k=5)
    assert any("p0" in hit.chunk.text for hit in hits)  # still answering from the last good copy

    site.broken = set()
    with services.write_lock():
        report = reindex(services, "hostile", "incremental")
    assert report.deleted == 0 and report.error_kinds.get("http") == 1
    services.close()
