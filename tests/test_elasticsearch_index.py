"""ElasticsearchIndex: the shared lexical suite on a real server (``RAG_TEST_ES_URL``, e.g.
``http://127.0.0.1:9200`` after ``scripts/elasticsearch.sh start``), connection and
credential errors, mapping conflicts, and index generations (rebuild, crash, cleanup)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from elasticsearch import Elasticsearch

from rag.errors import BackendError, BackendTimeout, BackendUnavailable, SchemaMismatch
from rag.lexical import es_mapping
from rag.lexical.elasticsearch import ElasticsearchIndex
from tests.backend_suite import LexicalIndexSuite, make_corpus
from tests.fixtures.elasticsearch import drop_everything

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def es_url() -> str:
    url = os.environ.get("RAG_TEST_ES_URL")
    if not url:
        pytest.skip("RAG_TEST_ES_URL is not set (start a server with scripts/elasticsearch.sh start)")
    return url


@pytest.fixture
def raw(es_url: str) -> Iterator[Elasticsearch]:
    client = Elasticsearch(es_url)
    yield client
    client.close()


@pytest.fixture
def alias(raw: Elasticsearch, request: pytest.FixtureRequest) -> Iterator[str]:
    """An alias named after the test; it and every ``-v*`` index are dropped before and after."""
    raw_name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")
    name = f"t_{raw_name[:80]}_{zlib.crc32(request.node.nodeid.encode()):08x}"
    drop_everything(raw, name)
    yield name
    drop_everything(raw, name)


@pytest.fixture
def make(es_url: str, alias: str) -> Iterator[Callable[..., ElasticsearchIndex]]:
    made: list[ElasticsearchIndex] = []

    def factory(**kwargs: object) -> ElasticsearchIndex:
        made.append(ElasticsearchIndex(es_url, alias, **kwargs))
        return made[-1]

    yield factory
    for idx in made:
        idx.close()


class TestElasticsearch(LexicalIndexSuite):
    @pytest.fixture
    def index(self, make: Callable[..., ElasticsearchIndex]) -> ElasticsearchIndex:
        return make(refresh=True)  # the other tests use the default, wait_for


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_init_is_lazy() -> None:
    url = f"http://elastic:secret@127.0.0.1:{_closed_port()}"
    idx = ElasticsearchIndex(url, "anything", max_retries=0)
    assert idx._client is None
    with pytest.raises(BackendUnavailable) as err:
        idx.count()
    message = str(err.value)
    assert message.startswith(f"cannot reach Elasticsearch at http://127.0.0.1:{url.rsplit(':', 1)[1]}: ")
    assert "\n" not in message and "secret" not in message
    with pytest.raises(BackendUnavailable):
        idx.search("anything")
    idx.close()


def test_no_answer_is_a_timeout() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        idx = ElasticsearchIndex(f"http://127.0.0.1:{silent.getsockname()[1]}", request_timeout=0.3,
                                 max_retries=0)
        with pytest.raises(BackendTimeout, match=r"did not answer within 0\.3 s"):
            idx.count()
        idx.close()


class _Refusing(BaseHTTPRequestHandler):
    """Answers like Elasticsearch with security on and a wrong password."""

    status = 401

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        reason = "unable to authenticate user [elastic] for REST request [/]"
        body = json.dumps({"error": {"root_cause": [{"type": "security_exception", "reason": reason}],
                                     "type": "security_exception", "reason": reason},
                           "status": self.status}).encode()
        self.send_response(self.status)
        self.send_header("X-Elastic-Product", "Elasticsearch")
        self.send_header("WWW-Authenticate", 'Basic realm="security", charset="UTF-8"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer  # http.server's names

    def log_message(self, format: str, *args: object) -> None:  # signature of the base
        pass


@pytest.mark.parametrize("status", [401, 403])
def test_wrong_credentials(status: int) -> None:
    handler = type("Handler", (_Refusing,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        idx = ElasticsearchIndex(f"http://127.0.0.1:{server.server_port}", username="elastic", password="wrong")
        with pytest.raises(BackendUnavailable, match="refused the credentials") as err:
            idx.upsert(make_corpus(1))
        assert f"HTTP {status}" in str(err.value) and "security_exception" in str(err.value)
        assert "\n" not in str(err.value) and "wrong" not in str(err.value)
        idx.close()
    finally:
        server.shutdown()
        server.server_close()


_OTHER_MAPPING = {"properties": {"id": {"type": "keyword"}, "source": {"type": "text"}}}


@pytest.mark.parametrize("layout", ["generation", "concrete", "aliased"])
def test_other_mapping_is_refused_and_kept(raw: Elasticsearch, alias: str,
                                           make: Callable[..., ElasticsearchIndex], layout: str) -> None:
    name = {"generation": f"{alias}-v1", "concrete": alias, "aliased": f"{alias}-v7"}[layout]
    raw.indices.create(index=name, mappings=_OTHER_MAPPING,
                       aliases={alias: {}} if layout == "aliased" else None)
    raw.index(index=name, id="keep", document={"id": "keep", "source": "theirs"}, refresh=True)
    idx = make()
    with pytest.raises(SchemaMismatch, match=r"'source' is text, expected keyword") as err:
        idx.upsert(make_corpus(2))
    assert repr(name) in str(err.value) and "\n" not in str(err.value)
    for call in (lambda: idx.search("common"), idx.cleanup, lambda: idx.delete_documents(["keep"])):
        with pytest.raises(SchemaMismatch):
            call()
    assert raw.get(index=name, id="keep")["_source"] == {"id": "keep", "source": "theirs"}
    assert raw.count(index=name)["count"] == 1
    assert raw.indices.exists_alias(name=alias) == (layout == "aliased")


def test_first_use_creates_a_generation_behind_the_alias(raw: Elasticsearch, alias: str,
                                                          make: Callable[..., ElasticsearchIndex]) -> None:
    idx = make()
    assert idx.count() == 0
    assert _aliased(raw, alias) == {f"{alias}-v1": {"is_write_index": True}}
    mapping = raw.indices.get_mapping(index=alias)[f"{alias}-v1"]["mappings"]
    assert mapping["dynamic"] == "strict" and es_mapping.is_ours(mapping, alias)
    assert make().count() == 0  # a second adapter finds the same alias


def test_failed_items_are_reported(make: Callable[..., ElasticsearchIndex]) -> None:
    idx = make()
    good, bad = make_corpus(2)
    with pytest.raises(BackendError, match=r"1 of 2 failed .* chunk 'c001': document_parsing_exception"):
        idx.upsert([good, replace(bad, tenant="x" * 40_000)])  # a keyword term over Lucene's limit
    assert idx.chunk_ids() == {good.id}


def test_rebuild_while_queries_run(es_url: str, raw: Elasticsearch, alias: str,
                                   make: Callable[..., ElasticsearchIndex]) -> None:
    idx, corpus = make(), make_corpus(60)
    idx.upsert(corpus)
    sizes: list[int] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def query() -> None:
        reader = ElasticsearchIndex(es_url, alias)
        while not stop.is_set():
            try:
                sizes.append(len(reader.search("common", k=100)))
            except Exception as exc:  # noqa: BLE001 - every failure is what this test looks for
                errors.append(exc)
        reader.close()

    thread = threading.Thread(target=query)
    thread.start()
    try:
        _wait_for(lambda: len(sizes) >= 5)
        new = idx.begin_rebuild()
        assert new.index == f"{alias}-v2" and new.count() == 0
        for i in range(0, 60, 15):
            new.upsert([replace(c, text=c.text + " rebuilt") for c in corpus[i:i + 15]])
        assert new.count() == 60 and idx.search("rebuilt") == []
        before = len(sizes)
        idx.commit_rebuild(new)
        _wait_for(lambda: len(sizes) >= before + 5)
    finally:
        stop.set()
        thread.join()
    assert errors == [] and len(sizes) > 10 and set(sizes) == {60}
    assert _aliased(raw, alias) == {f"{alias}-v2": {"is_write_index": True}}
    assert not raw.indices.exists(index=f"{alias}-v1")
    assert len(idx.search("rebuilt", k=100)) == 60
    idx.upsert([replace(corpus[0], text="incremental after the swap")])
    assert idx.search("incremental")[0].chunk_id == corpus[0].id and idx.count() == 60


_CRASHING_REBUILD = """
import sys, time
from rag.lexical.elasticsearch import ElasticsearchIndex
from tests.backend_suite import make_corpus
new = ElasticsearchIndex(sys.argv[1], sys.argv[2]).begin_rebuild()
new.upsert(make_corpus(40)[:20])
print(new.index, flush=True)
time.sleep(300)
"""


def test_crashed_rebuild_is_cleaned_up(es_url: str, raw: Elasticsearch, alias: str,
                                       make: Callable[..., ElasticsearchIndex]) -> None:
    idx, corpus = make(), make_corpus(40)
    idx.upsert(corpus)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _CRASHING_REBUILD, es_url, alias], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        orphan = proc.stdout.readline().strip()
    finally:
        proc.kill()  # SIGKILL: no finally blocks, no atexit
        proc.wait(30)
        proc.stdout.close()
    assert orphan == f"{alias}-v2"
    raw.indices.refresh(index=orphan)  # a generation being built has no periodic refresh
    assert raw.count(index=orphan)["count"] == 20
    assert list(_aliased(raw, alias)) == [f"{alias}-v1"]
    assert idx.count() == 40 and idx.chunk_ids() == {c.id for c in corpus}
    assert idx.cleanup() == [orphan]
    assert not raw.indices.exists(index=orphan) and idx.cleanup() == []
    new = idx.begin_rebuild()
    new.upsert(corpus[:30])
    idx.commit_rebuild(new)
    assert idx.count() == 30 and list(_aliased(raw, alias)) == [new.index]


def test_abort_rebuild(raw: Elasticsearch, alias: str, make: Callable[..., ElasticsearchIndex]) -> None:
    idx = make()
    idx.upsert(make_corpus(5))
    new = idx.begin_rebuild()
    new.upsert(make_corpus(2))
    with pytest.raises(BackendError, match="begin a rebuild"):
        new.begin_rebuild()
    idx.abort_rebuild(new)
    assert not raw.indices.exists(index=new.index) and idx.count() == 5
    with pytest.raises(BackendError, match="not begun by"):
        idx.commit_rebuild(idx)


def test_concrete_index_of_ours_is_used_then_replaced(raw: Elasticsearch, alias: str,
                                                      make: Callable[..., ElasticsearchIndex]) -> None:
    raw.indices.create(index=alias, mappings=es_mapping.mapping(alias))
    idx, corpus = make(), make_corpus(6)
    idx.upsert(corpus)
    idx.delete_documents(["doc0"])
    assert idx.count() == 3 and not raw.indices.exists_alias(name=alias)
    new = idx.begin_rebuild()
    new.upsert(corpus)
    idx.commit_rebuild(new)
    assert list(_aliased(raw, alias)) == [f"{alias}-v1"] and idx.count() == 6
    idx.upsert([replace(corpus[0], text="after the move")])
    assert idx.search("move")[0].chunk_id == corpus[0].id


def _aliased(raw: Elasticsearch, alias: str) -> dict[str, dict]:
    """The indexes behind ``alias`` and the alias's properties on each."""
    return {name: body["aliases"][alias] for name, body in raw.indices.get_alias(name=alias).body.items()}


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
