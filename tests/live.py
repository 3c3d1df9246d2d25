"""Serving in tests: a real uvicorn server on loopback, SSE parsing, the service's test
settings, and a generator with knobs for streams that must still be running (or fail) on cue.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import uvicorn

from rag.config import Settings
from rag.errors import BackendUnavailable, GeneratorError
from rag.generators.extractive import ExtractiveGenerator
from rag.types import GenerationDelta, GenerationParams, Prompt
from tests.conftest import make_settings

MAX_BODY = 20_000


def serve_settings(data_dir: Path, **serve: object) -> Settings:
    """Auth and rate limits off (on loopback), as the demo runs; they are tested in test_serve_auth.py."""
    return make_settings(data_dir, generator={"backend": "extractive"}, retrieval={"mode": "hybrid"},
                         serve={"max_body_bytes": MAX_BODY, "max_messages": 8, "max_question_chars": 500,
                                "auth": False, "rate_limit_per_minute": 0, **serve})


@contextlib.contextmanager
def live(app) -> Iterator[str]:
    """Run ``app`` under uvicorn on a free loopback port in a thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def sse_events(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    event: dict[str, str] = {}
    for line in lines:
        if not line:
            if event:
                yield event
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            event[name] = event.get(name, "") + value.removeprefix(" ") if name == "data" else value.strip()


class Gated(ExtractiveGenerator):
    """The extractive generator, with knobs: hold before piece ``hold_at`` until ``gate`` is
    set, fail after ``fail_after`` pieces, or be down (``down``) before the first token."""

    name = "gated-extractive"

    def __init__(self) -> None:
        super().__init__()
        self.reset()

    def reset(self) -> None:
        self.hold_at: int | None = None
        self.gate = threading.Event()
        self.fail_after: int | None = None
        self.down = False
        self.closed_early = False

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        if self.down:
            raise BackendUnavailable("http://127.0.0.1:9/v1: connection refused")
        sent = 0
        try:
            async for delta in super().stream(prompt, params):
                if delta.text:
                    if sent == self.fail_after:
                        raise GeneratorError("the model server closed the stream")
                    if sent == self.hold_at:
                        while not self.gate.is_set():
                            await asyncio.sleep(0.01)
                    sent += 1
                yield delta
        except (GeneratorExit, asyncio.CancelledError):
            self.closed_early = True
            raise


def comparable(chunk) -> dict:  # an openai chunk, without what differs between two runs
    out = chunk.model_dump(exclude={"id", "created"})
    if isinstance(out.get("ragqa"), dict):
        out["ragqa"] = {k: v for k, v in out["ragqa"].items() if k != "answer_id"}  # new on every answer
    return out


def wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def run(agen) -> list:
    """Every event of an async stream (an answer's), collected on a fresh event loop."""
    async def collect():
        return [event async for event in agen]
    return asyncio.run(collect())
