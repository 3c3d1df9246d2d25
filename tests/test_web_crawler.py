"""Site and sitemap crawls against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import gzip
import os
import socket
import time
from pathlib import Path

import pytest

from ingest.sources import SitemapSource, SiteSource, Validator, open_source
from ingest.sources.base import Fetched
from rag.config import CrawlSettings, SourceConfig
from tests.httpserver import LocalServer, minimal_pdf, serve_dir, unpack_pydocs

FAST = dict(retries=0, backoff_s=0.0, timeout_s=5.0, concurrency=4)


def _page(title: str, *links: str, extra: str = "") -> str:
    anchors = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    return (f"<html><head><title>{title}</title>{extra}</head><body><main><h1>{title}</h1>"
            f"<p>This page is about {title}; it has enough words to be a real paragraph.</p>"
            f"<ul>{anchors}</ul></main></body></html>")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "www"
    files = {
        "robots.txt": "User-agent: *\nDisallow: /docs/private/\n",
        "outside.html": _page("Outside"),
        "docs/index.html": _page("Index", "a.html", "a.html#section", "b.html?v=1", "sub/c.html",
                                 "private/p.html", "../outside.html", "http://other.invalid/x.html",
                                 "missing.html", "manual.pdf", "logo.png", "noindex.html",
                                 "mailto:x@example.org"),
        "docs/a.html": _page("A", "a2.html"),
        "docs/a2.html": _page("A2", "a3.html"),
        "docs/a3.html": _page("A3", "index.html"),
        "docs/b.html": _page("B", "index.html"),
        "docs/sub/c.html": _page("C", "../a.html"),
        "docs/private/p.html": _page("Private"),
        "docs/noindex.html": _page("Hidden", "a.html", extra='<meta name="robots" content="noindex">'),
        "docs/logo.png": "not really a png",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    (root / "docs" / "manual.pdf").write_bytes(minimal_pdf(["The manual"], "Manual"))
    return root


@pytest.fixture
def server(site: Path):
    with serve_dir(site) as srv:
        yield srv


def _site(server: LocalServer, **settings: object) -> tuple[SiteSource, SourceConfig]:
    extra = {k: settings.pop(k) for k in ("include", "exclude", "max_pages") if k in settings}
    cfg = SourceConfig(name="site", kind="site", location=server.url("/docs/index.html"), **extra)
    source = open_source(cfg, CrawlSettings(**{**FAST, **settings}))
    assert isinstance(source, SiteSource)
    return source, cfg


def _crawl(source, known=None, conditional=False) -> dict[str, Fetched]:
    results = list(source.crawl(known or {}, conditional))
    by_url = {f.url: f for f in results}
    assert len(by_url) == len(results), "a URL was reported twice"
    return by_url


def _paths(results: dict[str, Fetched], status: str) -> set[str]:
    return {url.split("/", 3)[3] for url, f in results.items() if f.status == status}


def test_site_crawl_stays_in_scope_and_obeys_robots(server: LocalServer):
    source, _ = _site(server)
    results = _crawl(source)
    assert _paths(results, "ok") == {"docs/index.html", "docs/a.html", "docs/a2.html",
                                     "docs/a3.html", "docs/b.html?v=1", "docs/sub/c.html",
                                     "docs/manual.pdf"}
    assert _paths(results, "gone") == {"docs/missing.html", "docs/noindex.html"}
    assert source.complete
    for path in ("/docs/private/p.html", "/outside.html", "/docs/logo.png"):
        assert server.counts[path] == 0, path
    assert server.counts["/robots.txt"] == 1 and server.counts["/docs/a.html"] == 1
    doc = results[server.url("/docs/b.html?v=1")].document
    assert doc.id == "site:/docs/b.html?v=1" and doc.title == "B" and doc.source == "site"
    assert doc.url == server.url("/docs/b.html?v=1") and doc.modified is not None
    assert results[server.url("/docs/manual.pdf")].document.text == "The manual"
    assert results[server.url("/docs/missing.html")].http_status == 404
    agents = {headers.get("User-Agent") for _, headers in server.requests}
    assert agents == {CrawlSettings().user_agent}


def test_robots_can_be_ignored(server: LocalServer):
    source, _ = _site(server, respect_robots=False)
    assert "docs/private/p.html" in _paths(_crawl(source), "ok")
    assert server.counts["/robots.txt"] == 0


def test_start_page_disallowed_by_robots_is_a_root_error(server: LocalServer, site: Path):
    (site / "robots.txt").write_text("User-agent: ragqa\nDisallow: /\n", encoding="utf-8")
    source, _ = _site(server)
    results = list(source.crawl({}, False))
    assert [(f.status, f.url) for f in results] == [("error", server.url("/docs/index.html"))]
    assert "robots.txt" in results[0].error and not source.complete


def test_max_depth_and_max_pages(server: LocalServer):
    source, _ = _site(server, max_depth=1)
    results = _crawl(source)
    assert "docs/a.html" in _paths(results, "ok") and server.counts["/docs/a2.html"] == 0
    assert source.complete  # the depth limit is part of what the source is
    source, _ = _site(server, max_pages=3)
    assert len(_crawl(source)) == 3
    assert not source.complete  # there was more to see


def test_include_and_exclude_globs(server: LocalServer):
    source, _ = _site(server, exclude=("*/sub/*", "*.pdf"))
    ok = _paths(_crawl(source), "ok")
    assert "docs/sub/c.html" not in ok and "docs/manual.pdf" not in ok and "docs/a.html" in ok
    assert server.counts["/docs/sub/c.html"] == 0
    # The start page is always read for its links, but reported only when it matches.
    source, _ = _site(server, include=("/docs/a*",))
    assert _paths(_crawl(source), "ok") == {"docs/a.html", "docs/a2.html", "docs/a3.html"}


def test_server_error_everywhere_fails_the_root(server: LocalServer):
    server.force_status = 500
    source, _ = _site(server, retries=2, backoff_s=0.01)
    results = list(source.crawl({}, False))
    assert [(f.status, f.url) for f in results] == [("error", server.url("/docs/index.html"))]
    assert "HTTP 500 after 3 attempts" in results[0].error and not source.complete
    assert server.counts["/robots.txt"] == 3
    source, _ = _site(server, retries=1, backoff_s=0.01, respect_robots=False)
    results = list(source.crawl({}, False))
    assert results[0].http_status == 500 and server.counts["/docs/index.html"] == 2
    assert results[0].error == f"{server.url('/docs/index.html')}: HTTP 500 after 2 attempts"


def test_one_failing_page_is_retried_reported_and_blocks_deletion(server: LocalServer):
    server.status_for["/docs/b.html"] = 500
    source, _ = _site(server, retries=2, backoff_s=0.01)
    results = _crawl(source)
    failed = results[server.url("/docs/b.html?v=1")]
    assert failed.status == "error" and failed.http_status == 500
    assert "HTTP 500 after 3 attempts" in failed.error
    assert server.counts["/docs/b.html"] == 3
    assert "docs/a3.html" in _paths(results, "ok")
    assert not source.complete  # links on the failed page are unknown


def test_transient_errors_are_retried_with_retry_after(server: LocalServer):
    server.fail_first["/docs/a.html"] = 1
    server.fail_status, server.retry_after = 503, "0"
    source, _ = _site(server, retries=2, backoff_s=5.0)  # Retry-After: 0 overrides the backoff
    started = time.monotonic()
    results = _crawl(source)
    assert results[server.url("/docs/a.html")].status == "ok" and source.complete
    assert server.counts["/docs/a.html"] == 2 and time.monotonic() - started < 4


def test_conditional_recrawl_is_all_not_modified_then_finds_changes(server: LocalServer, site: Path):
    source, _ = _site(server)
    first = _crawl(source)
    known = {u: Validator(f.etag, f.last_modified) for u, f in first.items() if f.status == "ok"}
    assert all(v.etag and v.last_modified for v in known.values())
    server.reset_counts()
    second = _crawl(source, known, conditional=True)
    assert {u for u, f in second.items() if f.status == "not_modified"} == set(known)
    assert all(second[u].etag == known[u].etag for u in known) and source.complete
    assert server.requests and all("If-None-Match" in h for p, h in server.requests
                                   if p.startswith("/docs/") and p not in ("/docs/missing.html",
                                                                           "/docs/noindex.html"))
    # Last-Modified alone is enough too.
    by_date = {u: Validator(None, v.last_modified) for u, v in known.items()}
    assert {f.status for u, f in _crawl(source, by_date, True).items() if u in known} == {"not_modified"}
    # A changed page is fetched in full and its new links are followed.
    (site / "docs" / "b.html").write_text(_page("B2", "index.html", "new.html"), encoding="utf-8")
    (site / "docs" / "new.html").write_text(_page("New"), encoding="utf-8")
    future = time.time() + 5
    os.utime(site / "docs" / "b.html", (future, future))
    third = _crawl(source, known, conditional=True)
    assert third[server.url("/docs/b.html?v=1")].document.title == "B2"
    assert third[server.url("/docs/new.html")].status == "ok"
    assert third[server.url("/docs/a3.html")].status == "not_modified"


def test_oversize_pages_are_errors(server: LocalServer, site: Path):
    (site / "docs" / "a.html").write_text(_page("A", extra="<!--" + "x" * 4000 + "-->"), encoding="utf-8")
    (site / "docs" / "b.html").write_text(_page("B", extra="<!--" + "y" * 4000 + "-->"), encoding="utf-8")
    server.unsized.add("/docs/b.html")  # no Content-Length: the streamed body hits the limit
    source, _ = _site(server, max_bytes=2048)
    results = _crawl(source)
    for url in (server.url("/docs/a.html"), server.url("/docs/b.html?v=1")):
        assert results[url].status == "error" and "larger than 2048 bytes" in results[url].error
    assert results[server.url("/docs/sub/c.html")].status == "ok"


def test_slow_page_times_out(server: LocalServer):
    server.delay_for["/docs/a.html"] = 3.0
    source, _ = _site(server, timeout_s=0.6)
    results = _crawl(source)
    slow = results[server.url("/docs/a.html")]
    assert slow.status == "error" and "timed out after 0.6 s (1 attempt)" in slow.error
    assert results[server.url("/docs/b.html?v=1")].status == "ok"


def test_unreachable_host_is_a_root_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens there once the socket is closed
    cfg = SourceConfig(name="site", kind="site", location=f"http://127.0.0.1:{port}/docs/")
    source = open_source(cfg, CrawlSettings(**{**FAST, "retries": 1, "backoff_s": 0.01}))
    results = list(source.crawl({}, False))
    assert [f.status for f in results] == ["error"] and not source.complete
    assert "ConnectError" in results[0].error and "(2 attempts)" in results[0].error


def test_requests_in_flight_are_capped_by_concurrency(server: LocalServer):
    for page in ("a.html", "b.html", "sub/c.html", "missing.html", "manual.pdf"):
        server.delay_for[f"/docs/{page}"] = 0.3
    source, _ = _site(server, concurrency=1)
    _crawl(source)
    assert server.max_in_flight == 1
    server.reset_counts()
    source, _ = _site(server, concurrency=4)
    _crawl(source)
    assert 2 <= server.max_in_flight <= 4


# -- sitemaps -----------------------------------------------------------------------------


def _urlset(server: LocalServer, *paths: str) -> str:
    locs = "".join(f"<url><loc>{server.url(p)}</loc><lastmod>2024-01-01</lastmod></url>" for p in paths)
    return f'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>'


def _sitemap(server: LocalServer, location: str = "/sitemap.xml", **settings: object) -> SitemapSource:
    extra = {"max_pages": settings.pop("max_pages")} if "max_pages" in settings else {}
    cfg = SourceConfig(name="sm", kind="sitemap", location=server.url(location), **extra)
    source = open_source(cfg, CrawlSettings(**{**FAST, **settings}))
    assert isinstance(source, SitemapSource)
    return source


def test_sitemap_lists_pages_without_following_links(server: LocalServer, site: Path):
    xml = _urlset(server, "/docs/a.html", "/docs/sub/c.html", "/docs/missing.html",
                  "/docs/private/p.html", "/outside.html")
    xml = xml.replace("</urlset>", "<url><loc>http://other.invalid/x.html</loc></url></urlset>")
    (site / "sitemap.xml").write_text(xml, encoding="utf-8")
    source = _sitemap(server)
    results = _crawl(source)
    assert _paths(results, "ok") == {"docs/a.html", "docs/sub/c.html", "outside.html"}
    assert _paths(results, "gone") == {"docs/missing.html"}
    assert source.complete and server.counts["/docs/a2.html"] == 0
    assert server.counts["/docs/private/p.html"] == 0
    assert results[server.url("/docs/a.html")].document.id == "sm:/docs/a.html"


def test_sitemap_index_with_gzip_child_and_a_missing_child(server: LocalServer, site: Path):
    (site / "one.xml").write_text(_urlset(server, "/docs/a.html"), encoding="utf-8")
    (site / "two.xml.gz").write_bytes(gzip.compress(_urlset(server, "/docs/b.html").encode()))
    children = "".join(f"<sitemap><loc>{server.url(p)}</loc></sitemap>" for p in ("one.xml", "two.xml.gz"))
    index = f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{children}</sitemapindex>'
    (site / "index.xml").write_text(index, encoding="utf-8")
    source = _sitemap(server, "/index.xml")
    assert _paths(_crawl(source), "ok") == {"docs/a.html", "docs/b.html"} and source.complete
    (site / "index.xml").write_text(index.replace("</sitemapindex>", f"<sitemap><loc>{server.url('gone.xml')}"
                                                  "</loc></sitemap></sitemapindex>"), encoding="utf-8")
    results = _crawl(source)
    assert results[server.url("/gone.xml")].status == "error"
    assert _paths(results, "ok") == {"docs/a.html", "docs/b.html"} and not source.complete


def test_sitemap_root_failures(server: LocalServer, site: Path):
    (site / "sitemap.xml").write_text(_page("Not a sitemap"), encoding="utf-8")
    source = _sitemap(server)
    results = list(source.crawl({}, False))
    assert [f.status for f in results] == ["error"] and "not a sitemap" in results[0].error
    assert not source.complete
    server.status_for["/sitemap.xml"] = 503
    results = list(source.crawl({}, False))
    assert [f.status for f in results] == ["error"] and results[0].http_status == 503
    assert not source.complete


def test_sitemap_max_pages_and_conditional(server: LocalServer, site: Path):
    (site / "sitemap.xml").write_text(_urlset(server, "/docs/a.html", "/docs/b.html"), encoding="utf-8")
    source = _sitemap(server, max_pages=1)
    assert len(_crawl(source)) == 1 and not source.complete
    source = _sitemap(server)
    first = _crawl(source)
    known = {u: Validator(f.etag, f.last_modified) for u, f in first.items()}
    assert {f.status for f in _crawl(source, known, conditional=True).values()} == {"not_modified"}
    assert source.complete


# -- a slice of the real Python docs ------------------------------------------------------


@pytest.fixture(scope="module")
def pydocs_v1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return unpack_pydocs("v1", tmp_path_factory.mktemp("pydocs-html"))


@pytest.mark.slow
def test_pydocs_library_crawl_stays_under_its_prefix(pydocs_v1: Path):
    with serve_dir(pydocs_v1) as server:
        cfg = SourceConfig(name="pydocs", kind="site", location=server.url("/library/index.html"),
                           max_pages=30)
        source = open_source(cfg, CrawlSettings(**FAST))
        results = _crawl(source)
    ok = [f for f in results.values() if f.status == "ok"]
    assert len(results) == 30 and len(ok) >= 25
    assert all(url.startswith(server.url("/library/")) for url in results)
    assert not source.complete  # the library has more than 30 pages
    functools = results.get(server.url("/library/functools.html"))
    if functools is not None:
        assert functools.document.title.startswith("functools")
    assert all(f.document.text and "Last updated" not in f.document.text for f in ok)
