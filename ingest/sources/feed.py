"""RSS and Atom feeds: each entry's own content becomes a document; links are not fetched.

The feed is fetched with the same retries, timeouts and byte limit as web pages, then
parsed with feedparser. An entry has no HTTP validator of its own, so its ``etag`` is a
hash of what the feed says about it: a conditional crawl skips entries whose hash is
unchanged without extracting them again.

Example::

    source = FeedSource(SourceConfig(name="news", kind="feed",
                                     location="https://example.org/feed.xml"),
                        CrawlSettings())
    for item in source.crawl(known={}, conditional=False):
        print(item.status, item.url, item.document and item.document.title)
"""

from __future__ import annotations

import calendar
import hashlib
import io
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import feedparser
import httpx

from ingest.extract import extract
from ingest.normalize import collapse_spaces, normalize_text
from ingest.sources.base import Fetched, Validator, build_document
from ingest.sources.fetcher import HttpFetcher, normalize_url
from ingest.sources.web import doc_id_for_url
from rag.config import CrawlSettings, SourceConfig
from rag.errors import FetchError

__all__ = ["FeedSource"]


class FeedSource:
    """Indexes the entries of one RSS or Atom feed.

    The crawl is complete when the feed could be fetched and parsed.

    Example::

        feed = FeedSource(cfg, CrawlSettings(timeout_s=10))
        docs = [f.document for f in feed.crawl({}, conditional=False) if f.status == "ok"]
    """

    def __init__(self, cfg: SourceConfig, crawl: CrawlSettings, *,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.cfg = cfg
        self.settings = crawl
        self.url = normalize_url(cfg.location)
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"source {cfg.name!r}: not an http(s) URL: {cfg.location}")
        self._transport = transport
        self._complete = False

    @property
    def complete(self) -> bool:
        return self._complete

    def crawl(self, known: Mapping[str, Validator], conditional: bool) -> Iterator[Fetched]:
        self._complete = False
        try:
            with HttpFetcher(self.settings, transport=self._transport) as http:
                reply = http.get(self.url)
            if reply.status != 200:
                raise FetchError(self.url, f"HTTP {reply.status}", reply.status)
        except FetchError as exc:
            yield Fetched(self.url, "error", error=str(exc), http_status=exc.status, error_kind=exc.kind)
            return
        parsed = feedparser.parse(io.BytesIO(reply.content), response_headers={
            "content-location": reply.url,
            "content-type": reply.headers.get("content-type", "application/xml"),
        })
        if not parsed.entries and (parsed.bozo or not parsed.version):
            reason = parsed.get("bozo_exception") or "no RSS or Atom feed found"
            yield Fetched(self.url, "error", error=f"{self.url}: not a feed: {reason}", http_status=200)
            return
        seen: set[str] = set()
        limit = self.cfg.max_pages or self.settings.max_pages
        for entry in parsed.entries:
            url = _entry_url(entry)
            if url is None or url in seen:
                continue
            if len(seen) >= limit:
                return
            seen.add(url)
            yield self._entry(entry, url, known.get(url) if conditional else None)
        self._complete = True

    def _entry(self, entry: Any, url: str, validator: Validator | None) -> Fetched:
        body, kind = _entry_body(entry)
        title = normalize_text(collapse_spaces(entry.get("title", "")))
        stamp = dict.get(entry, "updated") or dict.get(entry, "published")
        etag = '"' + hashlib.sha256("\x00".join((url, title, body, stamp or "")).encode()).hexdigest() + '"'
        if validator is not None and validator.etag == etag:
            return Fetched(url, "not_modified", etag=etag, last_modified=stamp)
        try:
            page = extract(body.encode(), kind, url=url, charset="utf-8", fallback_title=title,  # type: ignore[arg-type]
                           boilerplate=self.settings.boilerplate_patterns)
        except FetchError as exc:
            return Fetched(url, "error", error=str(exc), error_kind=exc.kind)
        page = replace(page, title=title or page.title,
                       published=_when(entry, "published_parsed") or page.published,
                       modified=_when(entry, "updated_parsed") or page.modified)
        doc = build_document(self.cfg, doc_id=doc_id_for_url(self.cfg.name, url), url=url, page=page)
        return Fetched(url, "ok", document=doc, etag=etag, last_modified=stamp)


def _entry_url(entry: Any) -> str | None:
    for candidate in (entry.get("link"), entry.get("id")):
        if candidate and candidate.startswith(("http://", "https://")):
            return normalize_url(candidate)
    return None


def _entry_body(entry: Any) -> tuple[str, str]:
    """The fullest text of an entry and its kind: ``content`` before ``summary``."""
    parts = [c for c in entry.get("content", []) if c.get("value")]
    html = [c for c in parts if "html" in c.get("type", "")]
    chosen = (html or parts or [None])[0]
    if chosen is None and entry.get("summary"):
        chosen = entry.get("summary_detail") or {"value": entry["summary"], "type": "text/html"}
    if chosen is None:
        return "", "text"
    return chosen["value"], "html" if "html" in chosen.get("type", "text/html") else "text"


def _when(entry: Any, key: str) -> datetime | None:
    value = dict.get(entry, key)
    if not value:
        return None
    return datetime.fromtimestamp(calendar.timegm(value), tz=UTC)
