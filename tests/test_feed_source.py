"""RSS and Atom feeds served by a real HTTP server on 127.0.0.1."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from ingest.sources import FeedSource, Validator, open_source
from ingest.sources.base import Fetched
from rag.config import CrawlSettings, SourceConfig
from rag.errors import ConfigError
from tests.httpserver import LocalServer, serve_dir

FAST = CrawlSettings(retries=1, backoff_s=0.01, timeout_s=5)

RSS = """<?xml version="1.0" encoding="UTF-8"?>
<rss version="2.0" xmlns:content="http://purl.org/rss/1.0/modules/content/">
<channel><title>News</title><link>{base}/</link><description>d</description>
<item>
  <title>First   post</title><link>{base}/posts/1.html</link><guid>p1</guid>
  <pubDate>Tue, 05 Mar 2024 10:00:00 GMT</pubDate>
  <description>Short summary</description>
  <content:encoded><![CDATA[<h2>Details</h2><p>The <b>full</b> text of the first post.</p>
  <p>Last updated on March 5, 2024.</p>]]></content:encoded>
</item>
<item>
  <title>Second post</title><link>{base}/posts/2.html?ref=rss</link>
  <pubDate>Wed, 06 Mar 2024 08:30:00 +0100</pubDate>
  <description>&lt;p&gt;Only a &lt;i&gt;summary&lt;/i&gt; here.&lt;/p&gt;</description>
</item>
<item><title>Duplicate</title><link>{base}/posts/1.html</link><description>again</description></item>
<item><title>No link at all</title><description>nowhere</description></item>
</channel></rss>"""

ATOM = """<?xml version="1.0" encoding="utf-8"?>
<feed xmlns="http://www.w3.org/2005/Atom"><title>Changelog</title><id>urn:x</id>
<updated>2024-04-02T00:00:00Z</updated>
<entry><title>Release 2.0</title><id>urn:r2</id><link href="/releases/2.0.html"/>
  <published>2024-04-01T12:00:00Z</published><updated>2024-04-02T09:15:00+02:00</updated>
  <content type="html">&lt;p&gt;Version 2.0 adds &lt;code&gt;search&lt;/code&gt;.&lt;/p&gt;</content></entry>
<entry><title>Release 1.0</title><id>{base}/releases/1.0.html</id>
  <updated>2024-01-01T00:00:00Z</updated><summary>First release.</summary></entry>
</feed>"""


@pytest.fixture
def server(tmp_path: Path):
    with serve_dir(tmp_path) as srv:
        (tmp_path / "feed.rss").write_text(RSS.format(base=srv.base_url), encoding="utf-8")
        (tmp_path / "atom.xml").write_text(ATOM.format(base=srv.base_url), encoding="utf-8")
        yield srv


def _feed(server: LocalServer, path: str, settings: CrawlSettings = FAST) -> FeedSource:
    cfg = SourceConfig(name="news", kind="feed", location=server.url(path), tags=("blog",))
    source = open_source(cfg, settings)
    assert isinstance(source, FeedSource)
    return source


def _crawl(source: FeedSource, known=None, conditional=False) -> dict[str, Fetched]:
    return {f.url: f for f in source.crawl(known or {}, conditional)}


def test_rss_entries_become_documents(server: LocalServer):
    source = _feed(server, "/feed.rss")
    results = _crawl(source)
    assert source.complete
    assert list(results) == [server.url("/posts/1.html"), server.url("/posts/2.html?ref=rss")]
    first = results[server.url("/posts/1.html")].document
    assert first.id == "news:/posts/1.html" and first.title == "First post"
    assert first.text == "## Details\n\nThe full text of the first post."
    assert first.published == datetime(2024, 3, 5, 10, tzinfo=UTC)
    assert first.tags == ("blog",) and first.lang == "en" and first.source == "news"
    second = results[server.url("/posts/2.html?ref=rss")].document
    assert second.id == "news:/posts/2.html?ref=rss" and second.text == "Only a summary here."
    assert second.published == datetime(2024, 3, 6, 7, 30, tzinfo=UTC)
    assert server.counts["/posts/1.html"] == 0  # entry links are not fetched


def test_atom_entries_with_relative_links_and_dates(server: LocalServer):
    results = _crawl(_feed(server, "/atom.xml"))
    release = results[server.url("/releases/2.0.html")].document
    assert release.title == "Release 2.0" and release.text == "Version 2.0 adds search."
    assert release.published == datetime(2024, 4, 1, 12, tzinfo=UTC)
    assert release.modified == datetime(2024, 4, 2, 7, 15, tzinfo=UTC)
    old = results[server.url("/releases/1.0.html")].document
    assert old.text == "First release." and old.modified == datetime(2024, 1, 1, tzinfo=UTC)


def test_conditional_crawl_skips_unchanged_entries(server: LocalServer, tmp_path: Path):
    source = _feed(server, "/feed.rss")
    first = _crawl(source)
    known = {u: Validator(f.etag, f.last_modified) for u, f in first.items()}
    assert {f.status for f in _crawl(source, known, conditional=True).values()} == {"not_modified"}
    (tmp_path / "feed.rss").write_text(
        RSS.format(base=server.base_url).replace("Only a", "Now a longer"), encoding="utf-8")
    again = _crawl(source, known, conditional=True)
    assert again[server.url("/posts/1.html")].status == "not_modified"
    changed = again[server.url("/posts/2.html?ref=rss")]
    assert changed.status == "ok" and changed.document.text == "Now a longer summary here."
    assert {f.status for f in _crawl(source, known, conditional=False).values()} == {"ok"}


def test_feed_failures_are_root_errors(server: LocalServer, tmp_path: Path):
    server.status_for["/feed.rss"] = 500
    source = _feed(server, "/feed.rss")
    results = list(source.crawl({}, False))
    assert [(f.status, f.url) for f in results] == [("error", server.url("/feed.rss"))]
    assert "HTTP 500 after 2 attempts" in results[0].error and not source.complete
    assert server.counts["/feed.rss"] == 2
    results = list(_feed(server, "/missing.rss").crawl({}, False))
    assert results[0].status == "error" and results[0].http_status == 404
    (tmp_path / "page.html").write_text("<html><body><p>not a feed</p></body></html>", encoding="utf-8")
    source = _feed(server, "/page.html")
    results = list(source.crawl({}, False))
    assert results[0].status == "error" and "not a feed" in results[0].error
    assert not source.complete


def test_slow_feed_times_out(server: LocalServer):
    server.delay_for["/feed.rss"] = 1.0
    source = _feed(server, "/feed.rss", CrawlSettings(retries=0, timeout_s=0.2))
    results = list(source.crawl({}, False))
    assert results[0].status == "error" and "timed out" in results[0].error
    assert not source.complete


def test_feed_location_must_be_http():
    cfg = SourceConfig(name="news", kind="feed", location="/tmp/feed.xml")
    with pytest.raises(ConfigError, match="not an http"):
        open_source(cfg, FAST)
