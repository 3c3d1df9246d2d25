"""Admission control through a real server: past ``serve.max_in_flight`` answers being
generated and ``serve.max_queued`` waiting, a question gets a fast 503 with ``Retry-After`` in
OpenAI's error shape, counted; a cached answer is served anyway; the held answers finish."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid

import httpx
import pytest

from rag.admission import Admission, GlobalSlots
from rag.answer import Answerer
from rag.cache import make_answer_cache
from rag.config import CacheSettings, ServeSettings
from rag.errors import Overloaded
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


# -- the global bound, shared through Redis --------------------------------------------------------
REDIS_URL = os.environ.get("RAG_TEST_REDIS_URL")
needs_redis = pytest.mark.skipif(not REDIS_URL, reason="RAG_TEST_REDIS_URL is not set (scripts/test.sh starts "
                                 "a throwaway Redis and sets it)")


@needs_redis
def test_two_instances_share_the_global_bound_through_redis(corpus, knobs, http):
    """Two servers (two apps, two event loops) on one Redis with serve.max_in_flight_global 1:
    while A generates, B refuses at once with a 503 naming the global bound; then B answers."""
    settings = corpus.settings.model_copy(update={"serve": corpus.settings.serve.model_copy(update={
        "max_in_flight": 4, "max_queued": 4, "redis_url": REDIS_URL, "max_in_flight_global": 1})})
    key = f"ragqa-test:admission:{uuid.uuid4().hex[:8]}"
    apps = []
    for _ in range(2):
        app = create_app(settings, services=corpus, answerer=Answerer(corpus, generator=knobs))
        app.state.ragqa.answerer.admission.global_slots.key = key
        apps.append(app)
    with live(apps[0]) as url_a, live(apps[1]) as url_b:
        knobs.hold_at = 0
        held: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: held.append(http.post(
            f"{url_a}/v1/ask", json={"question": question(2), "no_cache": True})))
        thread.start()
        try:
            wait_for(lambda: gauge("answers_in_flight") >= 1, 30)
            before = gauge("answers_rejected_global_total")
            refused = http.post(f"{url_b}/v1/ask", json={"question": question(3), "no_cache": True})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "overloaded"
            assert "serve.max_in_flight_global 1" in refused.json()["error"]["message"]
            assert gauge("answers_rejected_global_total") == before + 1
        finally:
            knobs.gate.set()
            thread.join(60)
        assert [r.status_code for r in held] == [200]
        assert http.post(f"{url_b}/v1/ask", json={"question": question(3), "no_cache": True}).status_code == 200


@needs_redis
def test_a_dead_workers_global_slot_expires_after_its_lease():
    async def scenario() -> None:
        slots = GlobalSlots(REDIS_URL, 1, lease_s=0.5, key=f"ragqa-test:admission:{uuid.uuid4().hex[:8]}")
        assert await slots.acquire() is not None  # and never released: its worker died
        with pytest.raises(Overloaded):
            await slots.acquire()
        await asyncio.sleep(0.6)
        token = await slots.acquire()
        assert token is not None and await slots.held() == 1
        await slots.release(token)
        assert await slots.held() == 0
        await slots.aclose()

    asyncio.run(scenario())


def test_with_redis_unreachable_the_global_bound_is_skipped_and_the_workers_bound_holds():
    async def scenario() -> None:
        admission = Admission(1, 0, global_slots=GlobalSlots("redis://127.0.0.1:9/0", 1))
        assert admission.global_slots is not None
        skipped = gauge("admission_global_skipped_total")
        async with admission.slot():
            with pytest.raises(Overloaded, match="serve.max_in_flight 1"):
                async with admission.slot():
                    pass
        async with admission.slot():
            pass
        assert gauge("admission_global_skipped_total") == skipped + 2
        await admission.global_slots.aclose()

    asyncio.run(scenario())


def test_a_global_bound_without_redis_is_a_settings_error():
    with pytest.raises(ValueError, match="max_in_flight_global needs serve.redis_url"):
        ServeSettings(max_in_flight_global=4)
