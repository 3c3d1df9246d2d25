"""A real HTTP server on 127.0.0.1 that misbehaves on purpose, for the crawler's fault tests.

Every page of the site lives under ``/docs/``; ``/docs/index.html`` links to all of them.
``healthy`` pages are plain HTML. The others each fail in one way a real site does:

- ``hang``: sends nothing (the read timeout); ``drip``: one byte every 50 ms, for ever
  (only the page deadline stops it); ``e500``: HTTP 500 every time;
- ``truncated``: promises 20,000 bytes, sends 100, and closes;
- ``loop-a`` → ``loop-b`` → ``loop-a``: a redirect loop;
- ``huge``: 50 MB with a ``Content-Length``; ``huge-unsized``: 50 MB without one, ending when the connection does;
- ``bomb``: 1 GB of zeros, gzip-compressed to about 1 MB, sent as ``Content-Encoding: gzip``;
- ``latin1``: Latin-1 bytes declared as UTF-8; ``gbk``: GBK bytes with no charset at all;
- ``binary``: a PNG served as ``text/html``; ``empty``: 200 with an empty body;
- ``private/secret``: disallowed by robots.txt (and counted if anyone asks for it);
- ``cal/2026-01``: a calendar whose every month links to its 28 days and to the next month.

``broken`` names healthy pages that answer 500 from now on (a site that breaks after a
first good crawl).

Example::

    with hostile_site() as site:
        url = site.url("/docs/index.html")
        ...
        assert site.counts["/docs/private/secret.html"] == 0
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["HostileSite", "hostile_site", "HEALTHY", "HOSTILE"]

HEALTHY = tuple(f"p{i}" for i in range(8))
HOSTILE = ("hang", "drip", "e500", "truncated", "loop-a", "huge", "huge-unsized", "bomb", "latin1",
           "gbk", "binary", "empty", "private/secret", "cal/2026-01")
_MB = 1024 * 1024
_PNG = (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f"
        b"\x15\xc4\x89\x00\x00\x00\rIDATx\x9cc\xf8\x0f\x00\x00\x01\x01\x00\x05\x18\xd8N\x00\x00\x00\x00"
        b"IEND\xaeB`\x82")


@cache
def _bomb() -> bytes:
    """1 GiB of zeros as one gzip member (about 1 MB), made once per test session."""
    out = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(16 * _MB)
    parts = [out.compress(zeros) for _ in range(64)]
    return b"".join(parts) + out.flush()


def _page(title: str, body: str, links: tuple[str, ...] = ()) -> str:
    anchors = "".join(f'<li><a href="{href}">{href}</a></li>' for href in links)
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{title}</title></head>"
            f"<body><main><h1>{title}</h1><p>{body}</p><ul>{anchors}</ul></main></body></html>")


@dataclass
class HostileSite:
    port: int = 0
    broken: set[str] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


class _Handler(BaseHTTPRequestHandler):
    site: HostileSite
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        self.site.counts[path] += 1
        name = path.removeprefix("/docs/").removesuffix(".html")
        try:
            self._route(path, name)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the crawler gave up on this page, as it should

    def _route(self, path: str, name: str) -> None:
        if path == "/robots.txt":
            return self._send(200, b"User-agent: *\nDisallow: /docs/private/\n", "text/plain")
        if path == "/docs/index.html":
            links = tuple(f"{n}.html" for n in HEALTHY + HOSTILE)
            return self._send(200, _page("Index", "The hostile site.", links).encode())
        if name in self.site.broken or name == "e500":
            return self._send(500, b"internal error")
        if name in HEALTHY:
            return self._send(200, _page(f"Page {name}", f"Healthy page {name} about topic {name}.").encode())
        if name == "private/secret":
            return self._send(200, _page("Secret", "Nobody should have crawled this.").encode())
        if name.startswith("cal/"):
            return self._calendar(name)
        if name == "hang":
            self.site.stop.wait(30)
            return None
        if name == "drip":
            return self._drip()
        if name == "truncated":
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", "20000")
            self.end_headers()
            self.wfile.write(b"<html><body><p>" + b"x" * 85)
            self.wfile.flush()
            self.close_connection = True
            return None
        if name in ("loop-a", "loop-b"):
            target = "loop-b.html" if name == "loop-a" else "loop-a.html"
            return self._send(302, b"", headers={"Location": target})
        if name == "huge":
            return self._stream(50 * _MB, sized=True)
        if name == "huge-unsized":
            return self._stream(50 * _MB, sized=False)
        if name == "bomb":
            return self._send(200, _bomb(), headers={"Content-Encoding": "gzip"})
        if name == "latin1":
            body = _page("Café", "Un café crème à la française, déjà payé.").encode("latin-1")
            return self._send(200, body)  # the page and the header both say UTF-8
        if name == "gbk":
            body = _page("检索", "检索增强生成的答案必须引用来源文档。").replace("<meta charset=utf-8>", "")
            return self._send(200, body.encode("gbk"), "text/html")
        if name == "binary":
            return self._send(200, _PNG * 50)
        if name == "empty":
            return self._send(200, b"")
        return self._send(404, b"not found")

    def _calendar(self, name: str) -> None:
        year, month = (int(x) for x in name.removeprefix("cal/").split("-")[:2])
        following = f"{year + month // 12}-{month % 12 + 1:02d}"
        days = tuple(f"{year}-{month:02d}-{day:02d}.html" for day in range(1, 29))
        if name.count("-") == 2:  # a day
            return self._send(200, _page(f"Day {name}", f"Nothing happens on {name}.").encode())
        return self._send(200, _page(f"Month {name}", f"The month {name}.", (*days, f"{following}.html")).encode())

    def _drip(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html><body><p>")
        while not self.site.stop.wait(0.05):
            self.wfile.write(b"z")
            self.wfile.flush()
        self.close_connection = True

    def _stream(self, size: int, *, sized: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        if sized:
            self.send_header("Content-Length", str(size))
        self.end_headers()
        block = b"<p>" + b"y" * (64 * 1024 - 7) + b"</p>\n"
        for _ in range(size // len(block)):
            self.wfile.write(block)
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a crawler hanging up on a bomb or a drip is the point, not an error


@contextmanager
def hostile_site() -> Iterator[HostileSite]:
    site = HostileSite()
    _bomb()  # about 2 s to make, not while a crawler waits for it
    handler = type("Handler", (_Handler,), {"site": site})
    server = _Server(("127.0.0.1", 0), handler)
    site.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield site
    finally:
        site.stop.set()
        server.shutdown()
        server.server_close()
        time.sleep(0)  # let handler threads see the stop
