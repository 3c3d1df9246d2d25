"""The vector backend, a real Milvus server, goes down while the service answers.

The server (``RAG_TEST_MILVUS_URI``; ``scripts/test.sh`` starts one) sits behind a loopback
proxy that refuses connections (a server that is down) or holds them without an answer (a
hung one). The lexical leg is tantivy.

- With ``vector.cache`` off, Milvus is in the query path (``rrf``: its search is the vector
  leg): answers go on from BM25 alone, flagged degraded with the reason, ``/ready`` says the
  vector index is unavailable, a metric counts it, and the service recovers by itself.
- With ``vector.cache`` on (the default), queries read only the local exact store beside
  Milvus, so an outage leaves answers whole; ``/ready`` still reports Milvus down, since
  writes go to it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from ingest.services import open_services
from rag.metrics import REGISTRY
from serve.app import create_app
from tests.conftest import make_settings
from tests.corpus import index_notes, question
from tests.faultproxy import FaultProxy
from tests.live import live, wait_for

MILVUS_URI = os.environ.get("RAG_TEST_MILVUS_URI")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not MILVUS_URI, reason="RAG_TEST_MILVUS_URI is not set "
                                 "(scripts/test.sh starts a Milvus server)")]


@pytest.fixture(scope="module")
def proxy() -> Iterator[FaultProxy]:
    target = urlsplit(MILVUS_URI)
    with FaultProxy(target.hostname or "127.0.0.1", target.port or 19530) as p:
        yield p


def serve(base: Path, proxy: FaultProxy, *, cache: bool) -> Iterator[str]:
    """A live service on notes indexed into tantivy and into Milvus through the proxy."""
    collection = f"ragqa_degraded_{uuid.uuid4().hex[:8]}"
    settings = make_settings(
        base / "data", generator={"backend": "extractive"}, retrieval={"mode": "rrf"},
        vector={"backend": "milvus", "uri": proxy.url, "collection": collection, "cache": cache},
        serve={"auth": False, "rate_limit_per_minute": 0})
    services = index_notes(open_services(settings), base, {"notes": (range(12), datetime(2024, 5, 1, tzinfo=UTC))})
    try:
        with live(create_app(settings, services=services)) as url:
            yield url
    finally:
        proxy.set("pass")
        services.vector.drop()
        services.close()


@pytest.fixture(scope="module")
def uncached(tmp_path_factory: pytest.TempPathFactory, proxy: FaultProxy) -> Iterator[str]:
    yield from serve(tmp_path_factory.mktemp("milvus-uncached"), proxy, cache=False)


@pytest.fixture(scope="module")
def cached(tmp_path_factory: pytest.TempPathFactory, proxy: FaultProxy) -> Iterator[str]:
    yield from serve(tmp_path_factory.mktemp("milvus-cached"), proxy, cache=True)


def ask(url: str, i: int = 3) -> dict:
    response = httpx.post(f"{url}/v1/ask", json={"question": question(i), "no_cache": True}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def ready(url: str) -> dict:
    response = httpx.get(f"{url}/ready", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def leg_down(leg: str) -> float:
    return REGISTRY.get_sample_value("retrieval_leg_down_total", {"leg": leg}) or 0.0


@pytest.mark.parametrize("fault", ["refuse", "hang"])
def test_a_milvus_outage_degrades_answers_to_bm25_and_heals_by_itself(uncached, proxy, fault):
    healthy = ask(uncached)
    assert not healthy["degraded"] and healthy["citations"]
    before = leg_down("vector")
    proxy.set(fault)
    try:
        began = time.monotonic()
        answer = ask(uncached)
        first_s = time.monotonic() - began
        assert answer["degraded"] and answer["citations"], answer  # from BM25
        assert any(w.startswith("vector unavailable: Milvus at") for w in answer["warnings"]), answer["warnings"]
        assert first_s < 10, f"the first answer without Milvus took {first_s:.1f} s"
        began = time.monotonic()
        again = ask(uncached, 4)  # skipped at once while the leg is down
        assert again["degraded"] and again["citations"] and time.monotonic() - began < 2
        status = ready(uncached)
        assert status["status"] == "degraded", status
        assert status["backends"]["vector"]["state"] == "unavailable"
        assert status["backends"]["lexical"]["state"] == "ready"
        assert leg_down("vector") >= before + 2
    finally:
        proxy.set("pass")
    wait_for(lambda: not ask(uncached)["degraded"], 60)  # tried again after a few seconds: back
    assert ready(uncached)["status"] == "ready"


def test_with_the_local_vector_cache_answers_never_read_milvus(cached, proxy):
    assert not ask(cached)["degraded"]
    before = leg_down("vector")
    proxy.set("refuse")
    try:
        answer = ask(cached)
        assert not answer["degraded"] and answer["citations"] and not answer["warnings"], answer
        assert leg_down("vector") == before
        status = ready(cached)
        assert status["status"] == "degraded" and status["backends"]["vector"]["state"] == "unavailable"
    finally:
        proxy.set("pass")
    wait_for(lambda: ready(cached)["status"] == "ready", 60)
