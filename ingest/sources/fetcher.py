"""HTTP for the web sources: retries with backoff, a byte limit, conditional requests.

Example::

    with HttpFetcher(settings.crawl) as http:
        reply = http.get("https://example.org/docs/", Validator(etag='"v1"', last_modified=None))
        if reply.status == 304:
            ...
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

import httpx

from ingest.sources.base import Validator
from rag.config import CrawlSettings
from rag.errors import FetchError

__all__ = ["HttpFetcher", "Reply", "normalize_url", "RETRY_AFTER_CAP_S"]

RETRY_AFTER_CAP_S = 60.0
_MAX_REDIRECTS = 10
_READ = 64 * 1024  # inflated bytes produced per step
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504}) | frozenset(range(520, 530))


@dataclass(frozen=True)
class Reply:
    """A complete response: final ``url`` after redirects, status, headers and body.

    Example::

        reply = http.get(url)
        kind = kind_for(url, reply.content_type)
        text = decode(reply.content, reply.charset)
    """

    url: str
    status: int
    headers: httpx.Headers
    content: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    @property
    def charset(self) -> str | None:
        for part in self.content_type.split(";")[1:]:
            key, _, value = part.partition("=")
            if key.strip().lower() == "charset" and value.strip():
                return value.strip().strip("\"'")
        return None


def normalize_url(url: str) -> str:
    """Lower-case scheme and host, drop default ports and the fragment, ``/`` for no path."""
    parts = urlsplit(url.strip())
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    netloc = host if port is None or (scheme, port) in (("http", 80), ("https", 443)) else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


class HttpFetcher:
    """Fetches URLs politely and turns every failure into a :class:`FetchError`.

    5xx, 429, timeouts and connection errors are retried ``crawl.retries`` times with
    exponential backoff (``backoff_s * 2**attempt``, or ``Retry-After`` when the server
    sends one, capped at :data:`RETRY_AFTER_CAP_S`). Other statuses, 304 included, are
    returned as they are. ``transport`` and ``sleep`` are for tests.

    A hostile or broken server cannot hold more than ``crawl.max_bytes`` of a page in memory,
    however it sends it: the size is checked on the decompressed bytes as they are inflated
    (a gzip bomb stops at the limit, not after its first 64 KB expanded a thousandfold), and a
    page that trickles in a byte at a time is cut at ``crawl.page_deadline_s``.

    Example::

        http = HttpFetcher(CrawlSettings(retries=1, timeout_s=5))
        reply = http.get("http://127.0.0.1:8000/index.html")
        http.close()
    """

    def __init__(self, crawl: CrawlSettings, *, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._crawl = crawl
        self._sleep = sleep
        self._client = httpx.Client(
            transport=transport,
            timeout=httpx.Timeout(crawl.timeout_s),
            follow_redirects=True,
            max_redirects=_MAX_REDIRECTS,
            # Only encodings this fetcher inflates itself, within max_bytes (see _body).
            headers={"User-Agent": crawl.user_agent, "Accept-Encoding": "gzip, deflate"},
            limits=httpx.Limits(max_connections=crawl.concurrency + 1),
        )

    def __enter__(self) -> HttpFetcher:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._client.close()

    def get(self, url: str, validator: Validator | None = None) -> Reply:
        """GET ``url``, conditionally when ``validator`` is given. Raises ``FetchError``."""
        headers = {}
        if validator is not None and validator.etag:
            headers["If-None-Match"] = validator.etag
        if validator is not None and validator.last_modified:
            headers["If-Modified-Since"] = validator.last_modified
        attempts = self._crawl.retries + 1
        tries = f"{attempts} attempt" + ("s" if attempts > 1 else "")
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                reply = self._once(url, headers)
            except httpx.TimeoutException as exc:
                if last:
                    raise FetchError(url, f"timed out after {self._crawl.timeout_s:g} s "
                                          f"({tries})", kind="timeout") from exc
                self._sleep(self._backoff(attempt, None))
                continue
            except httpx.TransportError as exc:
                if last:
                    raise FetchError(url, f"{type(exc).__name__}: {exc} ({tries})",
                                     kind="connection") from exc
                self._sleep(self._backoff(attempt, None))
                continue
            except httpx.TooManyRedirects as exc:
                raise FetchError(url, f"more than {_MAX_REDIRECTS} redirects ({exc})",
                                 kind="redirects") from exc
            except (httpx.HTTPError, httpx.InvalidURL) as exc:  # a bad URL, a bad header
                raise FetchError(url, f"{type(exc).__name__}: {exc}") from exc
            if reply.status in _RETRY_STATUS:
                if last:
                    raise FetchError(url, f"HTTP {reply.status} after {tries}",
                                     reply.status, kind="http")
                self._sleep(self._backoff(attempt, reply.headers.get("retry-after")))
                continue
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(self, url: str, headers: dict[str, str]) -> Reply:
        limit = self._crawl.max_bytes
        with self._client.stream("GET", url, headers=headers) as response:
            declared = response.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise FetchError(url, f"larger than {limit} bytes (Content-Length {declared})",
                                 response.status_code, kind="too_large")
            deadline = time.monotonic() + self._crawl.page_deadline_s
            body = bytearray()
            for chunk in _body(response, url):
                body += chunk
                if len(body) > limit:
                    raise FetchError(url, f"larger than {limit} bytes", response.status_code,
                                     kind="too_large")
                if time.monotonic() > deadline:
                    raise FetchError(url, f"still arriving after {self._crawl.page_deadline_s:g} s "
                                          f"({len(body)} bytes so far)", response.status_code, kind="slow")
            return Reply(str(response.url), response.status_code, response.headers, bytes(body))

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        delay = self._crawl.backoff_s * 2**attempt
        if retry_after:
            value = retry_after.strip()
            if value.isdigit():
                delay = float(value)
            else:
                try:
                    delay = parsedate_to_datetime(value).timestamp() - time.time()
                except (TypeError, ValueError, IndexError):
                    pass
        return min(max(delay, 0.0), RETRY_AFTER_CAP_S)


def _body(response: httpx.Response, url: str) -> Iterator[bytes]:
    """The response body, inflated ``_READ`` bytes at a time for gzip and deflate.

    httpx inflates each network read in one call, so 64 KB of a gzip bomb becomes tens of
    megabytes before anyone can count them. Here ``zlib`` is asked for at most ``_READ``
    bytes per step, and the caller stops at ``max_bytes``.
    """
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        yield from response.iter_raw()
        return
    if encoding not in ("gzip", "x-gzip", "deflate"):
        yield from response.iter_bytes()  # not asked for; httpx decodes what it knows
        return
    # gzip, or deflate in its zlib wrapper (the standard), or raw deflate (what some
    # servers send as "deflate"), told apart by the zlib header's check bits.
    inflater = None
    try:
        for data in response.iter_raw():
            if inflater is None:
                wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
                wbits = 16 + zlib.MAX_WBITS if "gzip" in encoding else (
                    zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
                inflater = zlib.decompressobj(wbits)
            while data:
                out = inflater.decompress(data, _READ)
                data = inflater.unconsumed_tail
                if out:
                    yield out
        if inflater is not None and (tail := inflater.flush()):
            yield tail
    except zlib.error as exc:
        raise FetchError(url, f"corrupt {encoding} body: {exc}", response.status_code) from exc
