"""The Generator contract (tests/generator_suite.py) for the extractive, scripted and
OpenAI-compatible generators; the llama.cpp generator runs it in tests/test_llamacpp_generator.py.

The OpenAI-compatible generator talks to a loopback server in OpenAI's streaming wire format
that, like vLLM, produces the tokens of a fixed answer and applies ``max_tokens`` and the
stop strings itself (the client's part is to send them and relay what comes back).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rag.generators.extractive import ExtractiveGenerator
from rag.generators.openai_server import OpenAIGenerator
from rag.generators.scripted import ScriptedGenerator
from tests.generator_suite import GeneratorSuite

TOKENS = ["Paris", " is", " the", " capital", " of", " France", " [1]", "."]


def _generate(body: dict[str, Any]) -> tuple[list[str], str]:
    """The tokens vLLM would send for ``body``, and the finish reason."""
    out: list[str] = []
    for token in TOKENS:
        if len(out) == body.get("max_tokens", 16):
            return out, "length"
        text = "".join(out) + token
        hit = [text.index(s) for s in body.get("stop") or [] if s in text]
        if hit:  # the stop string ends the answer and is not sent
            kept = text[: min(hit)][len("".join(out)):]
            return out + ([kept] if kept else []), "stop"
        out.append(token)
    return out, "stop"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/v1/models":
            return self._json(404, {"error": {"message": "not found", "code": 404}})
        self._json(200, {"object": "list", "data": [{"id": "m", "object": "model", "created": 1,
                                                     "owned_by": "me", "max_model_len": 2048}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            return self._json(404, {"error": {"message": "not found", "code": 404}})
        tokens, reason = _generate(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
        events = [{**chunk, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}
                  for t in tokens]
        events += [{**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]},
                   {**chunk, "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": len(tokens),
                                                      "total_tokens": 30 + len(tokens)}}]
        try:
            for event in events:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        except (BrokenPipeError, ConnectionResetError):  # the client closed the stream early
            pass


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


class TestExtractive(GeneratorSuite):
    @pytest.fixture
    def generator(self) -> ExtractiveGenerator:
        return ExtractiveGenerator()


class TestScripted(GeneratorSuite):
    @pytest.fixture
    def generator(self) -> ScriptedGenerator:
        return ScriptedGenerator(TOKENS)

    @pytest.fixture
    def down(self) -> ScriptedGenerator:
        return ScriptedGenerator(TOKENS, fail_start=True)


class TestOpenAICompatible(GeneratorSuite):
    @pytest.fixture
    def generator(self, server_url: str) -> OpenAIGenerator:
        return OpenAIGenerator(server_url, timeout_s=10)

    @pytest.fixture
    def down(self) -> OpenAIGenerator:
        return OpenAIGenerator(closed_port_url(), timeout_s=2, connect_retries=0)
