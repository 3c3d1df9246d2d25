"""The pages listed in a sitemap (``<urlset>``), following sitemap indexes, gzip or not.

Example::

    source = SitemapSource(SourceConfig(name="blog", kind="sitemap",
                                        location="https://example.org/sitemap.xml"),
                           CrawlSettings())
    for item in source.crawl(known={}, conditional=True):
        print(item.status, item.url)
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping

import lxml.etree

from ingest.sources.base import Fetched, Validator
from ingest.sources.fetcher import HttpFetcher, normalize_url
from ingest.sources.web import WebSource
from rag.errors import FetchError

__all__ = ["SitemapSource", "parse_sitemap"]

_MAX_SITEMAPS = 1000


def parse_sitemap(data: bytes, max_bytes: int) -> tuple[str, list[str]]:
    """``("urlset" | "sitemapindex", [loc, ...])`` of a sitemap, gunzipping it if needed.

    Raises ``ValueError`` for anything that is not a sitemap.
    """
    if data[:2] == b"\x1f\x8b":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            data = inflater.decompress(data, max_bytes + 1)
        except zlib.error as exc:
            raise ValueError(f"bad gzip data: {exc}") from exc
        if len(data) > max_bytes:
            raise ValueError(f"larger than {max_bytes} bytes once decompressed")
    parser = lxml.etree.XMLParser(resolve_entities=False, no_network=True, remove_comments=True,
                                  remove_pis=True)
    try:
        root = lxml.etree.fromstring(data, parser=parser)
    except lxml.etree.XMLSyntaxError as exc:
        raise ValueError(f"not XML: {exc}") from exc
    kind = lxml.etree.QName(root).localname
    if kind not in ("urlset", "sitemapindex"):
        raise ValueError(f"not a sitemap (root element <{kind}>)")
    entry = "url" if kind == "urlset" else "sitemap"
    locs = []
    for node in root:
        if isinstance(node.tag, str) and lxml.etree.QName(node).localname == entry:
            for child in node:
                if isinstance(child.tag, str) and lxml.etree.QName(child).localname == "loc":
                    if child.text and child.text.strip():
                        locs.append(child.text.strip())
    return kind, locs


class SitemapSource(WebSource):
    """Fetches every page a sitemap lists on the sitemap's own scheme and host.

    Links are not followed. The crawl is complete when every sitemap could be read and
    ``max_pages`` was not reached; page errors are reported but do not hide pages.

    Example::

        source = SitemapSource(cfg, CrawlSettings(max_pages=100))
        pages = [f for f in source.crawl({}, conditional=False) if f.status == "ok"]
    """

    def crawl(self, known: Mapping[str, Validator], conditional: bool) -> Iterator[Fetched]:
        self._complete = False
        with self._http() as http, self._extraction():
            if (failure := self._start(http)) is not None:
                yield failure
                return
            urls: list[str] = []
            listed = True
            for item in self._read_sitemaps(http, urls):
                if item.url == self.start:
                    yield item
                    return
                listed = False
                yield item
            pages = [u for u in dict.fromkeys(urls) if self.in_scope(u) and self.allowed(u)]
            truncated = len(pages) > self.max_pages
            self.planned = min(len(pages), self.max_pages)
            reported: set[str] = set()
            for _, page in self._fetch_all(http, pages[: self.max_pages], known, conditional):
                if page.fetched is not None and page.fetched.url not in reported:
                    reported.add(page.fetched.url)
                    yield page.fetched
        self._complete = listed and not truncated

    def _read_sitemaps(self, http: HttpFetcher, urls: list[str]) -> Iterator[Fetched]:
        """Append the page URLs of the sitemap tree to ``urls``; yield an error per
        unreadable sitemap."""
        queue, visited = [self.start], {self.start}
        while queue and len(visited) <= _MAX_SITEMAPS:
            url = queue.pop(0)
            try:
                reply = http.get(url)
                if reply.status != 200:
                    raise FetchError(url, f"HTTP {reply.status}", reply.status)
                kind, locs = parse_sitemap(reply.content, self.settings.max_bytes)
            except FetchError as exc:
                yield Fetched(url, "error", error=str(exc), http_status=exc.status, error_kind=exc.kind)
                continue
            except ValueError as exc:
                yield Fetched(url, "error", error=f"{url}: {exc}", http_status=reply.status)
                continue
            for loc in locs:
                loc = normalize_url(loc)
                if kind == "urlset":
                    urls.append(loc)
                elif loc not in visited and self.same_origin(loc):
                    visited.add(loc)
                    queue.append(loc)
