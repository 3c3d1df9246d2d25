"""A retrieval backend that goes down while the service answers: answers go on from the other
leg, flagged degraded with the reason, ``/ready`` says which index is down, a metric counts
it, and the service recovers by itself. The lexical index is a real Elasticsearch behind a
loopback proxy that refuses connections (a server that is down) or holds them without an
answer (a hung one); the vector leg is the local numpy store.

Needs ``RAG_TEST_ES_URL`` (``scripts/test.sh`` starts Elasticsearch).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import urlsplit

import httpx
import pytest

from ingest.services import open_services
from rag.config import LexicalSettings
from rag.metrics import REGISTRY
from serve.app import create_app
from tests.corpus import index_notes, question
from tests.faultproxy import FaultProxy
from tests.live import live, serve_settings, wait_for

ES_URL = os.environ.get("RAG_TEST_ES_URL")
pytestmark = pytest.mark.skipif(not ES_URL, reason="RAG_TEST_ES_URL is not set (scripts/test.sh starts Elasticsearch)")


@pytest.fixture(scope="module")
def proxy() -> Iterator[FaultProxy]:
    target = urlsplit(ES_URL)
    with FaultProxy(target.hostname or "127.0.0.1", target.port or 9200) as p:
        yield p


@pytest.fixture(scope="module")
def app_url(tmp_path_factory: pytest.TempPathFactory, proxy: FaultProxy) -> Iterator[str]:
    base = tmp_path_factory.mktemp("degraded")
    index = f"ragqa-test-degraded-{uuid.uuid4().hex[:8]}"
    lexical = LexicalSettings(backend="elasticsearch", url=proxy.url, index=index, query_timeout_s=1.0)
    settings = serve_settings(base / "data").model_copy(update={"lexical": lexical})
    services = index_notes(open_services(settings), base, {"notes": (range(12), datetime(2024, 5, 1, tzinfo=UTC))})
    try:
        with live(create_app(settings, services=services)) as url:
            yield url
    finally:
        proxy.set("pass")
        services.close()
        drop_indexes(index)


def drop_indexes(prefix: str) -> None:
    """Delete this test's indexes by name: Elasticsearch refuses wildcard deletes by default."""
    found = httpx.get(f"{ES_URL}/_cat/indices/{prefix}*", params={"format": "json", "h": "index",
                                                                   "expand_wildcards": "all"}).json()
    names = ",".join(row["index"] for row in found)
    if names:
        httpx.delete(f"{ES_URL}/{names}").raise_for_status()


def ask(url: str, i: int = 3) -> dict:
    response = httpx.post(f"{url}/v1/ask", json={"question": question(i), "no_cache": True}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def leg_down(leg: str) -> float:
    return REGISTRY.get_sample_value("retrieval_leg_down_total", {"leg": leg}) or 0.0


@pytest.mark.parametrize("fault", ["refuse", "hang"])
def test_an_elasticsearch_outage_degrades_answers_and_heals_by_itself(app_url, proxy, fault):
    healthy = ask(app_url)
    assert not healthy["degraded"] and healthy["citations"]
    before = leg_down("lexical")
    proxy.set(fault)
    try:
        answer = ask(app_url)
        assert answer["degraded"] and answer["citations"], answer  # from the vector leg
        assert any(w.startswith("lexical unavailable") for w in answer["warnings"]), answer["warnings"]
        if fault == "hang":  # one bounded try, not the client's default 30 s x 3
            assert "did not answer within 1 s" in answer["warnings"][0]
        again = ask(app_url, 4)  # skipped at once while the leg is down
        assert again["degraded"] and again["citations"]
        ready = httpx.get(f"{app_url}/ready", timeout=30)
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert ready.json()["backends"]["lexical"]["state"] == "unavailable"
        assert ready.json()["backends"]["vector"]["state"] == "ready"
        assert leg_down("lexical") >= before + 2
    finally:
        proxy.set("pass")
    wait_for(lambda: not ask(app_url)["degraded"], 30)  # tried again after a few seconds: back
    assert httpx.get(f"{app_url}/ready", timeout=30).json()["status"] == "ready"


def test_a_reindex_during_an_outage_writes_nothing_half_way_and_the_next_run_converges(tmp_path, proxy):
    from ingest.pipeline import reindex
    from ingest.verify import verify
    from rag.errors import BackendError
    from tests.conftest import make_settings

    index = f"ragqa-test-outage-{uuid.uuid4().hex[:8]}"
    lexical = LexicalSettings(backend="elasticsearch", url=proxy.url, index=index, query_timeout_s=1.0,
                              request_timeout_s=5.0, max_retries=0)
    services = index_notes(open_services(make_settings(tmp_path / "data", lexical=lexical.model_dump())), tmp_path,
                           {"notes": (range(6), datetime(2024, 5, 1, tzinfo=UTC))})
    try:
        notes = sorted((tmp_path / "notes").iterdir())
        before = {d.url: d.text_hash for d in services.state.documents("notes").values()}
        for path in notes[:2]:
            path.write_text(path.read_text(encoding="utf-8") + "\nA late addition about lighthouses.\n",
                            encoding="utf-8")
        proxy.set("refuse")
        try:
            with services.write_lock(), pytest.raises(BackendError):
                reindex(services, "notes", "incremental")
        finally:
            proxy.set("pass")
        assert services.state.runs("notes", limit=1)[0]["status"] == "error"
        assert {d.url: d.text_hash for d in services.state.documents("notes").values()} == before  # untouched
        with services.write_lock():
            report = reindex(services, "notes", "incremental")
        assert report.changed == 2 and report.failed == 0
        result = verify(services, "notes")
        assert result.drift == 0, result.as_dict()
    finally:
        services.close()
        drop_indexes(index)
