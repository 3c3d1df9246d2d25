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
from http.server import ThreadingHTTPServer
from typing import Any

import pytest

from rag.generators.extractive import ExtractiveGenerator
from rag.generators.openai_server import OpenAIGenerator
from rag.generators.scripted import ScriptedGenerator
from tests.fixtures.openai_wire import OpenAIHandler, chat_chunk, sse
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


class _Handler(OpenAIHandler):
    owned_by = "me"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            return self._error(404, "not found")
        tokens, reason = _generate(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        events = [chat_chunk({"content": t}) for t in tokens]
        events += [chat_chunk({}, reason),
                   {**chat_chunk({}), "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": len(tokens),
                                                      "total_tokens": 30 + len(tokens)}}]
        try:
            for event in events:
                self.wfile.write(sse(event))
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
