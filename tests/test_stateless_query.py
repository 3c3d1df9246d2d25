"""An API instance on the scale-out settings answers with no data directory.

Elasticsearch returns whole chunks, a Milvus server returns whole chunks and the vectors the
reranker needs, and Redis holds the answer cache; the ingestion state lives with the
ingesting process. So a serve process whose data directory does not exist answers with
citations, caches in Redis, sees a reindex made by the other process drop the answers it
changed, never opens the state and never creates the directory.

The unit tests at the top need no server. The rest need ``RAG_TEST_ES_URL``,
``RAG_TEST_MILVUS_URI`` and ``RAG_TEST_REDIS_URL`` (``scripts/test.sh`` starts all three).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient

from ingest.services import open_services
from rag.errors import ConfigError
from rag.retrieval.hybrid import HybridRetriever
from rag.services import Services
from serve.app import create_app
from tests.conftest import make_settings
from tests.corpus import OLD, doc_text, question, write_folder

ES_URL = os.environ.get("RAG_TEST_ES_URL")
MILVUS_URI = os.environ.get("RAG_TEST_MILVUS_URI")
REDIS_URL = os.environ.get("RAG_TEST_REDIS_URL")
ROOT = Path(__file__).resolve().parent.parent
servers = pytest.mark.skipif(
    not (ES_URL and MILVUS_URI and REDIS_URL),
    reason="RAG_TEST_ES_URL, RAG_TEST_MILVUS_URI and RAG_TEST_REDIS_URL are needed "
           "(scripts/test.sh starts Elasticsearch, a Milvus server and Redis)")


# -- which store answers, without servers --------------------------------------------------
@pytest.mark.parametrize(("uri", "cache", "expected"), [
    (None, None, True),                            # Milvus Lite: the local store is 30-50x faster
    ("http://milvus:19530", None, False),          # a server answers the fetch by id itself
    ("http://milvus:19530", True, True),           # the accelerator, asked for
    (None, False, False),
])
def test_the_local_vector_store_is_on_with_milvus_lite_and_off_beside_a_server(tmp_path, uri, cache, expected):
    vector = {"backend": "milvus", "uri": uri, "cache": cache}
    services = Services(make_settings(tmp_path / "data", vector=vector))
    assert services.local_vector_cache is expected
    assert services.backend_names()["vector_cache"] == ("numpy (vectors.db)" if expected else "off")
    assert not (tmp_path / "data").exists()  # deciding opens nothing


def scale_out(data_dir: Path, **overrides: object) -> dict[str, object]:
    return {"lexical": {"backend": "elasticsearch", "url": "http://127.0.0.1:9", "index": "unused"},
            "vector": {"backend": "milvus", "uri": "http://127.0.0.1:9"}, **overrides}


def test_on_servers_only_a_process_without_a_state_reads_none(tmp_path):
    opened = []
    settings = make_settings(tmp_path / "data", **scale_out(tmp_path))
    services = Services(settings, state=lambda s: opened.append(s) or SimpleNamespace())
    assert services.servers_only and services.query_state is None and not opened
    # the same settings with a state.db in the data directory (one instance doing both) read it
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "state.db").touch()
    assert services.query_state is not None and opened
    assert Services(settings).query_state is None  # built with no state at all: answering needs none


def test_a_shared_state_or_a_local_accelerator_keeps_the_state_in_the_query_path(tmp_path):
    shared = make_settings(tmp_path / "a", **scale_out(tmp_path), state={"url": "sqlite:////tmp/x.db"})
    assert Services(shared, state=lambda s: SimpleNamespace()).query_state is not None
    accelerated = make_settings(tmp_path / "b", **scale_out(tmp_path, vector={
        "backend": "milvus", "uri": "http://127.0.0.1:9", "cache": True}))
    services = Services(accelerated, state=lambda s: SimpleNamespace())
    assert not services.servers_only and services.query_state is not None


def test_auto_embedder_without_a_state_to_read_the_choice_is_a_clear_error(tmp_path):
    settings = make_settings(tmp_path / "data", **scale_out(tmp_path), embedder={"backend": "auto"})
    services = Services(settings, state=lambda s: SimpleNamespace())
    with pytest.raises(ConfigError, match="state.url"):
        _ = services.embedder_choice()


def test_a_milvus_server_is_read_at_bounded_consistency_except_right_after_own_writes(tmp_path):
    from rag.vectors.milvus import READ_YOUR_WRITES_S, MilvusVectorIndex

    server = MilvusVectorIndex("http://127.0.0.1:9", "c", dim=4)  # connects on first use: never here
    assert server._read_options() == {"consistency_level": "Bounded"}
    server.wrote()
    assert server._read_options() == {"consistency_level": "Strong"}
    server._wrote_at -= READ_YOUR_WRITES_S
    assert server._read_options() == {"consistency_level": "Bounded"}
    assert MilvusVectorIndex(str(tmp_path / "lite.db"), "c", dim=4)._read_options() == {}  # Milvus Lite


# -- a real instance on Elasticsearch, a Milvus server and Redis ---------------------------
@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Notes ingested by a separate ``ragqa`` process with its own data directory, and the
    settings of an API instance whose data directory cannot exist."""
    if not (ES_URL and MILVUS_URI and REDIS_URL):
        pytest.skip("needs Elasticsearch, a Milvus server and Redis")
    base = tmp_path_factory.mktemp("stateless")
    tag = uuid.uuid4().hex[:8]
    index, collection, prefix = f"ragqa-test-stateless-{tag}", f"ragqa_stateless_{tag}", f"ragqa-test:{tag}"
    env = {**os.environ, "RAG_LEXICAL__BACKEND": "elasticsearch", "RAG_LEXICAL__URL": ES_URL,
           "RAG_LEXICAL__INDEX": index, "RAG_VECTOR__BACKEND": "milvus", "RAG_VECTOR__URI": MILVUS_URI,
           "RAG_VECTOR__COLLECTION": collection, "RAG_EMBEDDER__BACKEND": "hash", "RAG_EMBEDDER__DIM": "256",
           "RAG_EMBEDDER__PROGRESS": "false", "RAG_CACHE__BACKEND": "redis", "RAG_CACHE__REDIS_URL": REDIS_URL,
           "RAG_CACHE__PREFIX": prefix, "RAG_RETRIEVAL__WEIGHTS": "[1.0, 1.0]",
           "RAG_STATE__URL": f"sqlite:///{base / 'shared' / 'state.db'}"}  # (a shared database)
    (base / "shared").mkdir()
    write_folder(base / "notes", range(12), OLD)

    def ingest() -> None:
        done = subprocess.run([sys.executable, "-m", "ragqa.cli", "--data-dir", str(base / "ingest-data"),
                               "ingest", str(base / "notes"), "--name", "notes"],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]

    ingest()
    data_dir = base / "absent" / "data"  # (the tests run as root: a read-only folder would not stop a write)
    settings = make_settings(
        data_dir, lexical={"backend": "elasticsearch", "url": ES_URL, "index": index},
        vector={"backend": "milvus", "uri": MILVUS_URI, "collection": collection},
        cache={"backend": "redis", "redis_url": REDIS_URL, "prefix": prefix},
        generator={"backend": "extractive"}, retrieval={"mode": "hybrid", "weights": (1.0, 1.0)},
        serve={"auth": False, "rate_limit_per_minute": 0, "qa_log": False, "redis_url": REDIS_URL})
    try:
        yield {"settings": settings, "data_dir": data_dir, "ingest": ingest, "notes": base / "notes",
               "state_url": env["RAG_STATE__URL"]}
    finally:
        cleanup = Services(make_settings(base / "cleanup", vector={
            "backend": "milvus", "uri": MILVUS_URI, "collection": collection}))
        cleanup.vector.drop()
        cleanup.close()
        # (by name: Elasticsearch refuses deleting by a wildcard, action.destructive_requires_name)
        names = httpx.get(f"{ES_URL}/_alias/{index}").json()
        if isinstance(names, dict) and names and "error" not in names:
            httpx.delete(f"{ES_URL}/{','.join(names)}").raise_for_status()
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{prefix}*"):
            client.delete(key)
        client.close()


@servers
def test_an_instance_with_no_data_directory_answers_with_citations(deployment):
    settings, data_dir = deployment["settings"], deployment["data_dir"]
    services = open_services(settings)  # the state factory the server uses; it is never called
    with TestClient(create_app(settings, services=services)) as client:
        ready = client.get("/ready").json()
        assert ready["status"] == "ready", ready
        assert ready["backends"]["vector"]["detail"] == "12 chunks"

        first = client.post("/v1/ask", json={"question": question(3)})
        assert first.status_code == 200, first.text
        body = first.json()
        assert not body["degraded"], body["warnings"]
        assert body["citations"] and body["citations"][0]["title"] == doc_text(3)[0]
        assert doc_text(3)[1].split(".")[0] in body["answer"]

        again = client.post("/v1/ask", json={"question": question(3)}).json()
        assert again["cache"] == "hit" and again["answer"] == body["answer"]  # from Redis

        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": question(4)}]})
        assert chat.status_code == 200 and doc_text(4)[1].split(".")[0] in chat.json()["choices"][0]["message"]["content"]
        assert client.get("/metrics").status_code == 200  # freshness and drift are the ingesting side's

        # the reranker's cosines come from the vectors Milvus returns by id
        hits = HybridRetriever.from_services(services).retrieve(question(5), k=3)
        assert hits[0].chunk is not None and hits[0].chunk.title == doc_text(5)[0]
        assert all(-1.0 < h.explain["cosine"] <= 1.0 for h in hits)

        # a reindex by the ingesting process drops the answers it changed from the shared cache
        (deployment["notes"] / "d03.md").write_text("# Note changed\n\nThe zordaith note now says nothing.\n")
        deployment["ingest"]()
        after = client.post("/v1/ask", json={"question": question(3)}).json()
        assert after["cache"] == "miss"

    assert "state" not in services.__dict__  # the state was never opened
    assert services.vector_cache is None
    assert not data_dir.parent.exists()  # nothing was created


@servers
def test_with_an_auto_embedder_and_no_state_ready_says_what_to_set(deployment):
    settings = deployment["settings"].model_copy(update={
        "embedder": deployment["settings"].embedder.model_copy(update={"backend": "auto"})})
    with TestClient(create_app(settings)) as client:
        ready = client.get("/ready").json()
        assert ready["backends"]["vector"]["state"] == "unavailable"
        assert "state.url" in ready["backends"]["vector"]["detail"]
    assert not deployment["data_dir"].parent.exists()


@servers
def test_an_instance_on_the_shared_state_reads_the_embedder_chosen_there(deployment):
    """``embedder.backend: auto`` with ``state.url``: the choice the first ingest recorded in the
    shared database decides the model (here the hash embedder stands in for the chosen one)."""
    from ingest.state import StateDB
    from rag.services import AUTO_META

    shared = StateDB(deployment["state_url"])
    shared.set_meta(AUTO_META, '{"backend": "hash", "reason": "recorded by the first ingest"}')
    shared.close()
    base = deployment["settings"]
    settings = base.model_copy(update={"embedder": base.embedder.model_copy(update={"backend": "auto"}),
                                       "state": base.state.model_copy(update={"url": deployment["state_url"]})})
    services = open_services(settings)
    with TestClient(create_app(settings, services=services)) as client:
        assert client.get("/ready").json()["status"] == "ready"
        body = client.post("/v1/ask", json={"question": question(6)}).json()
        assert body["citations"] and body["citations"][0]["title"] == doc_text(6)[0], body
    assert services.embedder.name.startswith("hash") and services.query_state is not None
    data_dir = deployment["data_dir"]
    assert not data_dir.exists() or not any(data_dir.iterdir())  # nothing written there
