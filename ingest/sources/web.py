"""Web sources: a site crawled by following links, and the pages listed in a sitemap.

Both fetch pages with up to ``crawl.concurrency`` requests in flight (a thread pool
around one ``httpx.Client``), obey robots.txt, and stay on the start URL's scheme and
host. The site crawl is breadth-first and level by level, so the same site gives the
same pages in the same order, and ``max_pages`` cuts it at the same place.

Example::

    source = SiteSource(SourceConfig(name="pydocs", kind="site",
                                     location="https://docs.python.org/3/index.html"),
                        CrawlSettings(concurrency=4))
    for item in source.crawl(known={}, conditional=False):
        print(item.status, item.url)
"""

from __future__ import annotations

import contextlib
import itertools
import posixpath
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from protego import Protego

from ingest.extract import kind_for
from ingest.extract_pool import ExtractPool, Handle, Job, Outcome
from ingest.normalize import parse_datetime
from ingest.sources.base import Fetched, Validator, build_document, path_allowed
from ingest.sources.fetcher import HttpFetcher, Reply, normalize_url
from rag.config import CrawlSettings, SourceConfig
from rag.errors import FetchError

__all__ = ["SiteSource", "WebSource", "doc_id_for_url"]

_BINARY = frozenset((
    ".png .jpg .jpeg .gif .svg .ico .webp .bmp .tif .tiff .css .js .mjs .map .json .zip "
    ".gz .tgz .bz2 .xz .7z .rar .tar .exe .msi .dmg .deb .rpm .whl .egg .jar .iso .bin "
    ".mp3 .mp4 .m4a .ogg .wav .avi .mov .webm .woff .woff2 .ttf .otf .eot .epub .mobi "
    ".doc .docx .xls .xlsx .ppt .pptx .odt .csv"
).split())
_ACCEPTED = ("html", "pdf")


def doc_id_for_url(name: str, url: str) -> str:
    """``"<source>:<path>[?query]"``: stable across runs and independent of the host."""
    parts = urlsplit(url)
    return f"{name}:{parts.path or '/'}" + (f"?{parts.query}" if parts.query else "")


@dataclass(frozen=True)
class _Page:
    fetched: Fetched | None  # None: nothing to report (not a document, or out of scope)
    links: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Reading:
    """A page handed to the extraction pool, with what its result needs from the reply."""

    handle: Handle
    url: str
    etag: str | None
    last_modified: str | None


class WebSource:
    """What the site and sitemap crawlers share: robots.txt, scope, fetching one page.

    ``transport`` replaces the network (``httpx.MockTransport``) in tests.

    Example::

        class OnePage(WebSource):
            def crawl(self, known, conditional):
                with self._http() as http:
                    for _, page in self._fetch_all(http, [self.start], known, conditional):
                        if page.fetched is not None:
                            yield page.fetched
    """

    def __init__(self, cfg: SourceConfig, crawl: CrawlSettings, *,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.cfg = cfg
        self.settings = crawl
        self.start = normalize_url(cfg.location)
        parts = urlsplit(self.start)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"source {cfg.name!r}: not an http(s) URL: {cfg.location}")
        self.origin = (parts.scheme, parts.netloc)
        self.prefix = "/"
        self.max_pages = cfg.max_pages or crawl.max_pages
        self._transport = transport
        self._robots: Protego | None = None
        self._complete = False
        # Pages this crawl expects to read, for progress: a sitemap's pages once read; a site's
        # pages found so far (planned_grows: it grows as links are followed).
        self.planned: int | None = None
        self.planned_grows = False
        self._extractor: ExtractPool | None = None  # the running crawl's, see _extraction

    @property
    def complete(self) -> bool:
        return self._complete

    def _http(self) -> HttpFetcher:
        return HttpFetcher(self.settings, transport=self._transport)

    @contextlib.contextmanager
    def _extraction(self) -> Iterator[ExtractPool]:
        """The crawl's extraction pool (``crawl.extract_workers`` processes), closed with it."""
        with ExtractPool(self.settings.extract_workers) as pool:
            self._extractor = pool
            try:
                yield pool
            finally:
                self._extractor = None

    def _load_robots(self, http: HttpFetcher) -> None:
        """Read robots.txt; a 4xx means no rules. Raises ``FetchError`` when unreachable,
        which (as RFC 9309 asks) stops the crawl rather than ignoring the rules."""
        self._robots = None
        if not self.settings.respect_robots:
            return
        url = f"{self.origin[0]}://{self.origin[1]}/robots.txt"
        reply = http.get(url)
        if 400 <= reply.status < 500:
            return
        if reply.status != 200:
            raise FetchError(url, f"robots.txt answered HTTP {reply.status}", reply.status, kind="http")
        self._robots = Protego.parse(reply.content.decode("utf-8", errors="replace"))

    def same_origin(self, url: str) -> bool:
        parts = urlsplit(url)
        return (parts.scheme, parts.netloc) == self.origin

    def in_scope(self, url: str) -> bool:
        """Same scheme and host, under the path prefix, not an obvious binary file."""
        path = urlsplit(url).path
        if not self.same_origin(url) or not path.startswith(self.prefix):
            return False
        return posixpath.splitext(path)[1].lower() not in _BINARY

    def allowed(self, url: str) -> bool:
        """The source's include/exclude globs (on the URL path) and robots.txt."""
        if not path_allowed(urlsplit(url).path, self.cfg.include, self.cfg.exclude):
            return False
        return self._robots is None or self._robots.can_fetch(url, self.settings.user_agent)

    def _fetch_all(self, http: HttpFetcher, urls: list[str], known: Mapping[str, Validator],
                   conditional: bool) -> Iterator[tuple[str, _Page]]:
        """Fetch ``urls`` concurrently and read each, yielding in their order.

        The requests run in a thread pool; each page is then extracted by the crawl's
        :class:`ExtractPool` (worker processes, or this thread when ``crawl.extract_workers``
        is 0), up to ``2 * extract_workers`` pages ahead of the one yielded.
        """
        if not urls:
            return
        workers = min(self.settings.concurrency, len(urls))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"crawl-{self.cfg.name}")
        extractor = self._extractor or ExtractPool(0)
        window = 2 * extractor.workers
        validators = {u: known.get(u) if conditional else None for u in urls}
        queue = iter(urls)
        ahead: deque[tuple[str, Future[Reply | Fetched]]] = deque()
        reading: deque[tuple[str, _Page | _Reading]] = deque()

        def submit(url: str | None) -> None:
            if url is not None:
                ahead.append((url, pool.submit(self._get, http, url, validators[url])))

        def finish() -> tuple[str, _Page]:
            url, staged = reading.popleft()
            if isinstance(staged, _Reading):
                return url, self._finish(staged, extractor.result(staged.handle))
            return url, staged

        try:
            for url in itertools.islice(queue, 2 * workers):  # a bounded read-ahead
                submit(url)
            while ahead:
                url, future = ahead.popleft()
                submit(next(queue, None))
                reading.append((url, self._read(url, future.result(), validators[url], extractor)))
                while len(reading) > window or reading and isinstance(reading[0][1], _Page):
                    yield finish()
            while reading:
                yield finish()
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _get(http: HttpFetcher, url: str, validator: Validator | None) -> Reply | Fetched:
        try:
            return http.get(url, validator)
        except FetchError as exc:
            return Fetched(url, "error", error=str(exc), http_status=exc.status, error_kind=exc.kind)

    def _read(self, url: str, reply: Reply | Fetched, validator: Validator | None,
              extractor: ExtractPool) -> _Page | _Reading:
        """What a reply is: a finished :class:`_Page`, or a page submitted for extraction."""
        if isinstance(reply, Fetched):
            return _Page(reply)
        final = normalize_url(reply.url)
        if final != url and not (self.in_scope(final) and self.allowed(final)):
            return _Page(None)
        etag, modified = reply.headers.get("etag"), reply.headers.get("last-modified")
        if reply.status == 304:
            return _Page(Fetched(final, "not_modified", etag=etag or (validator.etag if validator else None),
                                 last_modified=modified or (validator.last_modified if validator else None),
                                 http_status=304))
        if reply.status in (404, 410):
            return _Page(Fetched(final, "gone", http_status=reply.status))
        if reply.status != 200:
            return _Page(Fetched(final, "error", error=f"{final}: HTTP {reply.status}",
                                 http_status=reply.status, error_kind="http"))
        kind = kind_for(urlsplit(final).path, reply.content_type)
        if kind not in _ACCEPTED:
            return _Page(None)
        stem = posixpath.splitext(posixpath.basename(urlsplit(final).path))[0]
        job = Job(reply.content, kind, final, reply.charset, stem, tuple(self.settings.boilerplate_patterns))
        return _Reading(extractor.submit(job), final, etag, modified)

    def _finish(self, reading: _Reading, outcome: Outcome) -> _Page:
        """The page once extracted: a document, ``gone`` under ``noindex``, or the page's error."""
        final = reading.url
        page = outcome.page
        if page is None:
            return _Page(Fetched(final, "error", error=outcome.error, http_status=200, error_kind=outcome.kind))
        links = tuple(normalize_url(link) for link in page.links if link.startswith("http"))
        if page.noindex:
            return _Page(Fetched(final, "gone", http_status=200), links)
        doc = build_document(self.cfg, doc_id=doc_id_for_url(self.cfg.name, final), url=final,
                             page=page, modified=parse_datetime(reading.last_modified))
        return _Page(Fetched(final, "ok", document=doc, etag=reading.etag, last_modified=reading.last_modified,
                             http_status=200), links)

    def _start(self, http: HttpFetcher) -> Fetched | None:
        """Load robots.txt and check the start URL; an error result when the crawl cannot start."""
        try:
            self._load_robots(http)
        except FetchError as exc:
            return Fetched(self.start, "error", error=str(exc), http_status=exc.status, error_kind=exc.kind)
        if self._robots is not None and not self._robots.can_fetch(self.start, self.settings.user_agent):
            return Fetched(self.start, "error", error=f"{self.start}: disallowed by robots.txt",
                           error_kind="robots")
        return None


class SiteSource(WebSource):
    """Crawls a site from ``cfg.location``, following ``<a href>`` links breadth-first.

    Only pages under the start URL's directory are visited (``/docs/index.html`` gives
    ``/docs/``). A page that errors may hide links, so any error makes the crawl
    incomplete, as do a failed start page and reaching ``max_pages``. In a conditional
    crawl a 304 page's links are not known; the previously known URLs are visited instead.

    Example::

        site = SiteSource(cfg, CrawlSettings())
        results = list(site.crawl(known={}, conditional=False))
        print(site.complete, len(results))
    """

    def __init__(self, cfg: SourceConfig, crawl: CrawlSettings, *,
                 transport: httpx.BaseTransport | None = None) -> None:
        super().__init__(cfg, crawl, transport=transport)
        path = urlsplit(self.start).path
        self.prefix = path if path.endswith("/") else posixpath.dirname(path).rstrip("/") + "/"

    def crawl(self, known: Mapping[str, Validator], conditional: bool) -> Iterator[Fetched]:
        self._complete = False
        with self._http() as http, self._extraction():
            if (failure := self._start(http)) is not None:
                yield failure
                return
            yield from self._bfs(http, known, conditional)

    def _bfs(self, http: HttpFetcher, known: Mapping[str, Validator],
             conditional: bool) -> Iterator[Fetched]:
        level, seen, reported = [self.start], {self.start}, set()
        depth, budget, errors, truncated, seeded = 0, self.max_pages, False, False, False
        self.planned_grows = True
        while level:
            if len(level) > budget:
                level, truncated = level[:budget], True
            budget -= len(level)
            following: list[str] = []
            for url, page in self._fetch_all(http, level, known, conditional):
                item = page.fetched
                if url == self.start and (item is None or item.status == "error"
                                          or item.status == "gone" and item.http_status != 200):
                    yield self._root_failure(item)
                    return
                if item is not None and item.url not in reported:
                    reported.add(item.url)
                    errors = errors or item.status == "error"
                    if url != self.start or self.allowed(url):
                        yield item
                if depth >= self.settings.max_depth:
                    continue
                candidates: Iterable[str] = page.links
                if item is not None and item.status == "not_modified" and not seeded:
                    seeded = True
                    candidates = [*page.links, *(normalize_url(u) for u in known)]
                for link in candidates:
                    if link not in seen and self.in_scope(link) and self.allowed(link):
                        seen.add(link)
                        following.append(link)
                self.planned = min(len(seen), self.max_pages)
            level, depth = following, depth + 1
        self._complete = not errors and not truncated

    def _root_failure(self, item: Fetched | None) -> Fetched:
        if item is None:
            return Fetched(self.start, "error",
                           error=f"{self.start}: the start page is not an HTML page in scope")
        if item.status == "gone":
            return Fetched(self.start, "error", http_status=item.http_status, error_kind="http",
                           error=f"{self.start}: the start page is gone (HTTP {item.http_status})")
        return item
