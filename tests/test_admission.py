"""Admission control through a real server: past ``serve.max_in_flight`` answers being
generated and ``serve.max_queued`` waiting, a question gets a fast 503 with ``Retry-After`` in
OpenAI's error shape, counted; a cached answer is served anyway; the held answers finish."""

from __future__ import annotations

import threading

import httpx

from rag.answer import Answerer
from rag.cache import make_answer_cache
from rag.config import CacheSettings
from rag.metrics import REGISTRY
from serve.app import create_app
from tests.corpus import question
from tests.live import live, wait_for


def gauge(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_a_full_queue_gets_a_fast_503_and_cached_answers_still_flow(corpus, knobs, http):
    settings = corpus.settings.model_copy(update={"serve": corpus.settings.serve.model_copy(
        update={"max_in_flight": 1, "max_queued": 1, "retry_after_s": 3})})
    cache = make_answer_cache(corpus, settings=CacheSettings(backend="memory"), salt=knobs.name)
    app = create_app(settings, services=corpus, answerer=Answerer(corpus, generator=knobs, cache=cache))
    with live(app) as url:
        assert http.post(f"{url}/v1/ask", json={"question": question(1)}).status_code == 200  # now cached
        knobs.hold_at = 0  # every generation waits before its first piece
        held: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda i=i: held.append(http.post(
            f"{url}/v1/ask", json={"question": question(i), "no_cache": True}))) for i in (2, 3)]
        for t in threads:
            t.start()
        wait_for(lambda: gauge("answers_in_flight") == 1 and gauge("answers_queued") == 1, 30)
        rejected = gauge("answers_rejected_total")
        try:
            refused = http.post(f"{url}/v1/ask", json={"question": question(4), "no_cache": True})
            assert refused.status_code == 503 and refused.headers["Retry-After"] == "3"
            error = refused.json()["error"]
            assert error["type"] == "service_unavailable_error" and error["code"] == "overloaded"
            assert "serve.max_in_flight" in error["message"]
            chat = http.post(f"{url}/v1/chat/completions", json={
                "model": "ragqa", "stream": True, "messages": [{"role": "user", "content": question(5)}]})
            assert chat.status_code == 503 and chat.json()["error"]["code"] == "overloaded"
            cached = http.post(f"{url}/v1/ask", json={"question": question(1)})
            assert cached.status_code == 200 and cached.json()["cache"] == "hit"  # no slot needed
            assert gauge("answers_rejected_total") == rejected + 2
        finally:
            knobs.gate.set()
            for t in threads:
                t.join(60)
        assert [r.status_code for r in held] == [200, 200]
        assert gauge("answers_in_flight") == 0 and gauge("answers_queued") == 0
        assert http.post(f"{url}/v1/ask", json={"question": question(6), "no_cache": True}).status_code == 200
