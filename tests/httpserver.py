"""A real HTTP server on 127.0.0.1 for crawler tests, serving a folder with knobs to misbehave.

Example::

    with serve_dir(tmp_path) as server:
        server.status_for["/broken.html"] = 500
        server.delay_for["/slow.html"] = 2.0
        httpx.get(server.url("/index.html"))
        assert server.counts["/index.html"] == 1
"""

from __future__ import annotations

import mimetypes
import tarfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["LocalServer", "QuietServer", "running", "serve_dir", "unpack_pydocs", "minimal_pdf", "PYDOCS_DIR"]

PYDOCS_DIR = Path(__file__).resolve().parent / "data" / "crawl-pydocs311"
_TYPES = {".html": "text/html; charset=utf-8", ".xml": "application/xml", ".txt": "text/plain",
          ".md": "text/markdown", ".pdf": "application/pdf", ".gz": "application/gzip",
          ".rss": "application/rss+xml", ".atom": "application/atom+xml"}


@dataclass
class LocalServer:
    """The state of a running server. Tests change the knobs while it runs.

    - ``force_status``: answer every request (robots.txt too) with this status.
    - ``status_for`` / ``delay_for``: a status, or seconds to wait before answering, per path.
    - ``fail_first``: answer the first N requests for a path with ``fail_status``.
    - ``retry_after``: a ``Retry-After`` header sent with the error statuses above.
    - ``unsized``: paths sent without ``Content-Length`` (the body ends when the connection does).
    - ``conditional``: send ``ETag``/``Last-Modified`` and answer 304 to a matching
      ``If-None-Match``/``If-Modified-Since``.
    - ``counts`` and ``requests``: what was asked, per path and in order (path, headers).
    - ``max_in_flight``: the most requests that were being answered at the same time.
    """

    root: Path
    port: int = 0
    force_status: int | None = None
    status_for: dict[str, int] = field(default_factory=dict)
    delay_for: dict[str, float] = field(default_factory=dict)
    fail_first: dict[str, int] = field(default_factory=dict)
    fail_status: int = 500
    retry_after: str | None = None
    unsized: set[str] = field(default_factory=set)
    conditional: bool = True
    counts: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "/") -> str:
        return self.base_url + "/" + path.lstrip("/")

    def reset_counts(self) -> None:
        with self.lock:
            self.counts.clear()
            self.requests.clear()
            self.max_in_flight = 0


class _Handler(BaseHTTPRequestHandler):
    server_version = "ragqa-test"
    state: LocalServer  # set on the subclass made per server

    def log_message(self, format: str, *args: object) -> None:  # signature of the base
        pass

    def do_GET(self) -> None:  # the name http.server dispatches to
        state = self.state
        with state.lock:
            state.in_flight += 1
            state.max_in_flight = max(state.max_in_flight, state.in_flight)
        try:
            self._get()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test); nothing to answer
        finally:
            with state.lock:
                state.in_flight -= 1

    def _get(self) -> None:
        state = self.state
        path = unquote(urlsplit(self.path).path)
        with state.lock:
            state.counts[path] += 1
            count = state.counts[path]
            state.requests.append((path, dict(self.headers.items())))
        if delay := state.delay_for.get(path):
            time.sleep(delay)
        status = state.force_status or state.status_for.get(path)
        if count <= state.fail_first.get(path, 0):
            status = state.fail_status
        if status:
            extra = {"Retry-After": state.retry_after} if state.retry_after and status >= 429 else {}
            return self._send(status, f"status {status}\n".encode(), "text/plain", extra)
        file = (state.root / path.lstrip("/")).resolve()
        if file.is_dir():
            file = file / "index.html"
        if not file.is_file() or state.root.resolve() not in file.parents:
            return self._send(404, b"not found\n", "text/plain")
        stat = file.stat()
        etag = f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'
        modified = formatdate(stat.st_mtime, usegmt=True)
        headers = {"ETag": etag, "Last-Modified": modified} if state.conditional else {}
        if state.conditional and self._not_modified(etag, int(stat.st_mtime)):
            return self._send(304, b"", None, headers)
        kind = _TYPES.get(file.suffix.lower()) or mimetypes.guess_type(file.name)[0]
        self._send(200, file.read_bytes(), kind or "application/octet-stream", headers,
                   sized=path not in state.unsized)

    def _not_modified(self, etag: str, mtime: int) -> bool:
        if tags := self.headers.get("If-None-Match"):
            return tags.strip() == "*" or etag in (t.strip() for t in tags.split(","))
        if since := self.headers.get("If-Modified-Since"):
            try:
                return mtime <= parsedate_to_datetime(since).timestamp()
            except (TypeError, ValueError):
                return False
        return False

    def _send(self, status: int, body: bytes, content_type: str | None,
              headers: dict[str, str] | None = None, sized: bool = True) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        if sized and status != 304:
            self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(body)


class QuietServer(ThreadingHTTPServer):
    """A threading server whose handler threads never hold up exit, and that does not print
    the errors of clients hanging up mid-answer (expected in these tests)."""

    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # tests look at what was recorded instead


@contextmanager
def running(server: ThreadingHTTPServer) -> Iterator[None]:
    """Serve requests on a thread for the duration of the ``with`` block, then close ``server``."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="test-http", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@contextmanager
def serve_dir(root: Path) -> Iterator[LocalServer]:
    """Serve ``root`` on 127.0.0.1 at a free port for the duration of the ``with`` block."""
    state = LocalServer(root=Path(root))
    handler = type("Handler", (_Handler,), {"state": state})
    server = QuietServer(("127.0.0.1", 0), handler)
    state.port = server.server_address[1]
    with running(server):
        yield state


_UNPACKED: dict[str, Path] = {}
_UNPACK_LOCK = threading.Lock()


def unpack_pydocs(version: str, base: Path) -> Path:
    """The HTML pages of pydocs ``version`` ("v1" or "v2") unpacked under ``base``; returns
    the ``site`` folder. Unpacked once per process, later calls reuse the first folder."""
    with _UNPACK_LOCK:
        if version not in _UNPACKED:
            dest = base / version
            dest.mkdir(parents=True, exist_ok=True)
            with tarfile.open(PYDOCS_DIR / f"{version}.tar.xz") as tar:
                for member in tar:  # one pass: an xz stream cannot seek back cheaply
                    if member.isfile() and member.name.endswith(".html"):
                        tar.extract(member, dest, filter="data")
            _UNPACKED[version] = dest / "site"
        return _UNPACKED[version]


def minimal_pdf(lines: list[str], title: str | None = None,
                created: str = "D:20240102030405Z") -> bytes:
    """A valid one-page PDF showing ``lines`` in Helvetica (ASCII text only)."""
    def esc(text: str) -> str:
        return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")

    shown = " 0 -16 Td ".join(f"({esc(line)}) Tj" for line in lines)
    stream = f"BT /F1 12 Tf 72 720 Td {shown} ET".encode("latin-1")
    info = f"<< /CreationDate ({created})" + (f" /Title ({esc(title)})" if title else "") + " >>"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        info.encode("latin-1"),
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 6 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)
    return bytes(out)
