"""The ``openai`` generator's failure rules against a scripted OpenAI-compatible server.

The real ``vllm serve`` runs in tests/test_vllm_generators.py (streaming, batching, a stalled
and a killed server, a prompt over the context). The answers a real server gives only when it
is in trouble (503 while loading, an error event inside a stream, a stream cut before its
finish reason, a token and then silence, a refused key) are scripted here, over HTTP on loopback, in the wire format of
OpenAI's API, so each rule of the module docstring is checked through the SDK.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rag.errors import BackendTimeout, BackendUnavailable, GeneratorError
from rag.generators.openai_server import OpenAIGenerator
from rag.types import GenerationDelta, GenerationParams, Prompt
from tests.fixtures.openai_wire import OpenAIHandler, chat_chunk, sse

PROMPT = Prompt(messages=({"role": "user", "content": "What is the capital of France?"},), stop=("\n\n",))


class Script:
    """What the server answers: ``plan`` is consumed one entry per chat request (the last entry
    repeats); ``bodies`` and ``auth`` (the Authorization headers) record what the client sent."""

    def __init__(self) -> None:
        self.plan: list[str] = ["stream"]
        self.models_status = 200
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []

    def next(self) -> str:
        return self.plan.pop(0) if len(self.plan) > 1 else self.plan[0]


def _handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(OpenAIHandler):
        owned_by = "me"

        def models_status(self) -> int:
            return script.models_status

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/v1/chat/completions":
                return self._error(404, "not found")  # /tokenize: not an OpenAI route
            script.bodies.append(body)
            script.auth.append(self.headers.get("Authorization"))
            step = script.next()
            if step == "stall":  # accepts the request, then says nothing until the client is gone
                time.sleep(2)
                self.close_connection = True
                return
            if step.isdigit():
                return self._error(int(step), f"scripted {step}: the prompt is too long")
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            events: list[object] = [chat_chunk({"role": "assistant", "content": ""}),
                                    chat_chunk({"content": "Paris"}), chat_chunk({"content": " [1]."})]
            if step == "stream-logprobs":  # vLLM's shape: the sampled tokens' log-probabilities per chunk
                for event, values in zip(events[1:], ([-0.5], [-0.1, -0.3]), strict=True):
                    event["choices"][0]["logprobs"] = {  # type: ignore[index]
                        "content": [{"token": "t", "logprob": v, "bytes": None, "top_logprobs": []} for v in values]}
                step = "stream"
            if step == "stall-after-token":  # a first token, then nothing (a frozen engine)
                for event in events[:2]:
                    self.wfile.write(sse(event))
                self.wfile.flush()
                time.sleep(3)
                self.close_connection = True
                return
            if step == "error-event":
                events = events[:2] + [{"error": {"message": "engine died", "code": 500}}]
            elif step == "stream":
                events += [chat_chunk({}, "stop"), {**chat_chunk({}), "choices": [],
                                                "usage": {"prompt_tokens": 11, "completion_tokens": 2,
                                                          "total_tokens": 13}}]
            for event in events:
                self.wfile.write(sse(event))
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

    return Handler


@pytest.fixture
def server() -> Iterator[tuple[str, Script]]:
    script = Script()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(script))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", script
    finally:
        httpd.shutdown()
        httpd.server_close()


def run(url: str, params: GenerationParams | None = None, into: list[GenerationDelta] | None = None,
        **kwargs: Any) -> list[GenerationDelta]:
    """The deltas of one answer; ``into`` also receives them as they come (kept on an error)."""
    got = into if into is not None else []

    async def go() -> list[GenerationDelta]:
        gen = OpenAIGenerator(url, **kwargs)
        await gen.start()
        try:
            async for delta in gen.stream(PROMPT, params or GenerationParams(max_tokens=8)):
                got.append(delta)
            return got
        finally:
            await gen.close()

    return asyncio.run(go())


def test_streams_deltas_then_the_finish_and_usage_with_vllm_parameters_in_the_body(server):
    url, script = server
    deltas = run(url, GenerationParams(max_tokens=8, seed=3, repetition_penalty=1.2, stop=("END",)),
                 api_key="sk-test")
    assert [d.text for d in deltas[:-1]] == ["Paris", " [1]."]
    assert (deltas[-1].finish_reason, deltas[-1].prompt_tokens, deltas[-1].completion_tokens) == ("stop", 11, 2)
    body = script.bodies[0]
    assert body["model"] == "m" and body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["repetition_penalty"] == 1.2 and body["seed"] == 3 and body["stop"] == ["END", "\n\n"]
    assert script.auth == ["Bearer sk-test"]


def test_the_sampled_tokens_log_probabilities_are_asked_for_and_reported_on_the_final_delta(server):
    url, script = server
    asked = GenerationParams(max_tokens=8, logprobs=True)
    script.plan = ["stream-logprobs"]
    final = run(url, asked)[-1]
    assert script.bodies[0]["logprobs"] is True and "top_logprobs" not in script.bodies[0]
    assert final.logprob == pytest.approx(-0.3) and final.min_logprob == -0.5
    script.plan = ["stream"]  # a server that sends none
    final = run(url, asked)[-1]
    assert final.logprob is None and final.min_logprob is None
    script.plan = ["stream"]  # not asked (no cascade, no eval run): the server is not made to compute them
    run(url)
    assert "logprobs" not in script.bodies[-1]


def test_the_model_card_sets_the_context_window_and_counting_falls_back_to_the_estimate(server):
    url, _ = server

    async def go() -> tuple[int, int, str | None]:
        gen = OpenAIGenerator(url)  # no model: the first served one
        await gen.start()
        await gen.close()
        return gen.context_window, gen.count_tokens("abcdef"), gen.model

    assert asyncio.run(go()) == (2048, 2, "m")


def test_a_server_still_loading_is_tried_again_then_unavailable(server):
    url, script = server
    script.plan = ["503", "503", "stream"]
    assert run(url, connect_retries=2)[-1].finish_reason == "stop"
    assert len(script.bodies) == 3
    script.plan = ["503"]
    with pytest.raises(BackendUnavailable, match=r"is not ready \(HTTP 503\): scripted 503"):
        run(url, connect_retries=1)


def test_a_rejected_request_is_a_generator_error_with_the_servers_message_and_no_retry(server):
    url, script = server
    script.plan = ["400"]
    with pytest.raises(GeneratorError, match=r"rejected the request \(HTTP 400\): scripted 400: the prompt is too long") as err:
        run(url, connect_retries=2)
    assert not isinstance(err.value, BackendUnavailable) and len(script.bodies) == 1


def test_an_error_event_after_the_first_token_is_a_generator_error(server):
    url, script = server
    script.plan = ["error-event"]
    got: list[GenerationDelta] = []
    with pytest.raises(GeneratorError, match="failed mid-answer: .*engine died"):
        run(url, model="m", into=got)
    assert [d.text for d in got] == ["Paris"]


def test_a_server_that_stalls_after_its_first_token_is_a_generator_error_after_timeout_s(server):
    url, script = server
    script.plan = ["stall-after-token"]
    got: list[GenerationDelta] = []
    began = time.monotonic()
    with pytest.raises(GeneratorError, match=r"no token for 0.5 s") as caught:
        run(url, model="m", timeout_s=0.5, into=got)
    assert not isinstance(caught.value, BackendUnavailable)  # mid-answer: not a fallback case
    assert [d.text for d in got] == ["Paris"] and time.monotonic() - began < 2.5


def test_a_stream_without_a_finish_reason_is_a_generator_error(server):
    url, script = server
    script.plan = ["cut"]
    with pytest.raises(GeneratorError, match="without a finish reason"):
        run(url, model="m")


def test_a_refused_key_is_backend_unavailable(server):
    url, script = server
    script.models_status = 401
    with pytest.raises(BackendUnavailable, match=r"refused the API key \(HTTP 401\)"):
        run(url, model="m", api_key="wrong")


def test_a_server_that_says_nothing_is_a_backend_timeout(server):
    url, script = server
    script.plan = ["stall"]
    began = time.monotonic()
    with pytest.raises(BackendTimeout, match=r"sent nothing in 0.5 s"):
        run(url, model="m", timeout_s=0.5, connect_retries=0)
    assert time.monotonic() - began < 2


def test_a_url_that_serves_no_model_list_is_backend_unavailable(server):
    url, _ = server
    wrong = url.removesuffix("/v1")  # forgot the /v1
    with pytest.raises(BackendUnavailable, match=rf"{wrong}/models gave no model list.*404"):
        run(wrong, model="m")
