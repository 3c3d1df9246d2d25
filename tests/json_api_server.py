"""What the tests' HTTP API servers share: a JSON handler on 127.0.0.1, the knobs that make it
misbehave, and running it for the duration of a block.

A server's state is a dataclass with :class:`Knobs`' fields; its handler subclasses
:class:`JsonHandler`, calls :meth:`JsonHandler.receive` first (the request is recorded, and
says whether it must fail) and answers with :meth:`JsonHandler.send`.

Example (``tests/cohere_server.py``)::

    with serve(_Handler, CohereServer(api_key="k")) as state:
        httpx.post(f"http://127.0.0.1:{state.port}/v2/embed", json={...}, headers=...)
        assert state.calls("/v2/embed")
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any, Generic, TypeVar

from tests.httpserver import QuietServer, running

__all__ = ["ApiFailure", "Knobs", "JsonHandler", "serve"]


class ApiFailure(Exception):
    """An endpoint's refusal: answered with ``status`` and the server's own error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


@dataclass
class Knobs:
    """Misbehaviour that tests switch on while the server runs, and the requests it received.

    ``fail_status``/``fail_message`` fail the next ``fail_count`` requests (all when None);
    ``delay_s`` waits before answering (a hang); ``retry_after`` is a header on failures.
    """

    port: int = 0
    fail_status: int | None = None
    fail_message: str = "internal server error"
    fail_count: int | None = None
    retry_after: str | None = None
    delay_s: float = 0.0
    requests: list[tuple[str, dict[str, str], Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def calls(self, path: str) -> list[Any]:
        """The JSON bodies of the requests received for ``path``, in order."""
        with self.lock:
            return [body for p, _, body in self.requests if p == path]


State = TypeVar("State", bound=Knobs)


class _Server(QuietServer, Generic[State]):
    state: State


class JsonHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server[Any]

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def receive(self, fallible: bool = True) -> tuple[Any, bool]:
        """Read and record the request: its JSON body (None when it is not JSON) and whether it
        fails by the knobs (only a ``fallible`` request counts against ``fail_count``); a
        failing or fallible request waits ``delay_s`` first."""
        state = self.server.state
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with state.lock:
            state.requests.append((self.path, dict(self.headers), body))
            failing = fallible and state.fail_status is not None and (state.fail_count is None or state.fail_count > 0)
            if failing and state.fail_count is not None:
                state.fail_count -= 1
        if fallible and state.delay_s:
            time.sleep(state.delay_s)
        return body, failing

    def send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status >= 400 and self.server.state.retry_after is not None:
                self.send_header("Retry-After", self.server.state.retry_after)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
            self.close_connection = True


@contextmanager
def serve(handler: type[JsonHandler], state: State) -> Iterator[State]:
    """Serve ``handler`` on a free port of 127.0.0.1 (set as ``state.port``) for the block."""
    httpd: _Server[State] = _Server(("127.0.0.1", 0), handler)
    state.port = httpd.server_address[1]
    httpd.state = state
    with running(httpd):
        yield state
