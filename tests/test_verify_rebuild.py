"""``verify`` and ``rebuild`` end to end, on the embedded backends and on Elasticsearch +
Milvus Lite, including a rebuild killed with SIGKILL half way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingest.pipeline import reindex
from ingest.rebuild import rebuild
from ingest.registry import source_from_argument
from ingest.services import open_services
from ingest.verify import verify
from rag.metrics import INDEX_DRIFT_CHUNKS
from rag.search import search
from rag.services import Services
from tests.conftest import ROOT, make_settings

ES_URL = os.environ.get("RAG_TEST_ES_URL")


def _write_corpus(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        body = "\n\n".join(f"Topic {i} paragraph {j}: the gizmo number {i * 10 + j} calibrates flux." for j in range(6))
        (folder / f"doc{i:04d}.md").write_text(f"# Document {i}\n\n{body}\n")


def _backends(tmp_path: Path, kind: str) -> dict[str, object]:
    if kind == "embedded":
        return {}
    alias = f"test-verify-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    return {
        "lexical": {"backend": "elasticsearch", "url": ES_URL, "index": alias},
        "vector": {"backend": "milvus", "uri": str(tmp_path / "milvus.db"), "collection": "verify_chunks"},
    }


@pytest.fixture(params=["embedded", pytest.param("scaleout", marks=pytest.mark.integration)])
def indexed(request, tmp_path):
    if request.param == "scaleout" and not ES_URL:
        pytest.skip("RAG_TEST_ES_URL is not set (scripts/test.sh starts Elasticsearch)")
    folder = tmp_path / "corpus"
    _write_corpus(folder, 12)
    services = open_services(make_settings(tmp_path / "data", **_backends(tmp_path, request.param)))
    services.state.add_source(source_from_argument(str(folder), name="corpus"))
    report = reindex(services, "corpus", "full")
    assert report.added == 12 and report.failed == 0
    yield services
    if request.param == "scaleout":
        from elasticsearch import Elasticsearch

        from tests.fixtures.elasticsearch import drop_everything

        services.vector.drop()
        with Elasticsearch(ES_URL) as raw:
            drop_everything(raw, services.settings.lexical.index)
    services.close()


def test_verify_finds_and_repairs_drift(indexed: Services):
    s = indexed
    assert verify(s).drift == 0
    chunks = list(s.state.iter_chunks("corpus"))
    doc = chunks[0].doc_id
    doc_chunks = [c.id for c in chunks if c.doc_id == doc]
    s.lexical.delete_chunks(doc_chunks[:1])          # an index lost a chunk
    s.vector.delete_documents([doc])                 # another lost a whole document
    stray = chunks[1]
    s.state.delete_documents([stray.doc_id])         # an index holds a document the state dropped

    report = verify(s)
    by_index = {d.index: d for d in report.indexes}
    assert by_index["lexical"].missing == doc_chunks[:1]
    assert set(by_index["vector"].missing) == set(doc_chunks)
    stray_ids = {c.id for c in chunks if c.doc_id == stray.doc_id}
    assert set(by_index["lexical"].extra) == stray_ids == set(by_index["vector"].extra)
    assert report.drift == 1 + len(doc_chunks) + 2 * len(stray_ids) + (
        len(stray_ids) if "vector_cache" in by_index else 0)
    assert INDEX_DRIFT_CHUNKS.labels("lexical")._value.get() == 1 + len(stray_ids)

    repaired = verify(s, repair=True)
    assert repaired.repaired == report.drift
    assert verify(s).drift == 0
    hits = search(s, "gizmo number calibrates flux Topic 0", k=3)
    assert any(h.doc_id == doc for h in hits)


def test_rebuild_switches_to_a_complete_new_index(indexed: Services):
    s = indexed
    before = s.lexical.count()
    report = rebuild(s)
    assert report.chunks == before == s.lexical.count() == s.vector.count()
    assert report.chunks_embedded == 0  # every vector came from the cache
    assert verify(s).drift == 0
    assert search(s, "gizmo number 53", k=1)[0].doc_id == "corpus:doc0005.md"


@pytest.mark.slow
def test_killed_rebuild_leaves_the_old_index_serving(tmp_path):
    folder = tmp_path / "corpus"
    _write_corpus(folder, 2500)
    data = tmp_path / "data"
    env = {**os.environ, "RAG_DATA_DIR": str(data), "RAG_EMBEDDER__BACKEND": "hash",
           "RAG_VECTOR__BACKEND": "numpy", "RAG_CONFIG": ""}
    cmd = [sys.executable, "-m", "ragqa.cli"]
    subprocess.run([*cmd, "ingest", str(folder), "--name", "corpus"], env=env, check=True,
                   capture_output=True, cwd=ROOT)

    def query() -> list[dict]:
        out = subprocess.run([*cmd, "search", "Topic 123 Document 123", "--json", "--k", "3"], env=env,
                             check=True, capture_output=True, text=True, cwd=ROOT)
        return json.loads(out.stdout)["hits"]

    assert query()[0]["doc_id"] == "corpus:doc0123.md"
    proc = subprocess.Popen([*cmd, "rebuild"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (data / "lexical" / "gen-1").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proc.poll() is None, "the rebuild finished before it could be interrupted"
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    assert query()[0]["doc_id"] == "corpus:doc0123.md"  # the old index still answers
    out = subprocess.run([*cmd, "rebuild", "--json"], env=env, check=True, capture_output=True,
                         text=True, cwd=ROOT)
    report = json.loads(out.stdout)
    assert report["chunks"] == 2500 and report["removed_orphans"]  # one chunk per document
    assert query()[0]["doc_id"] == "corpus:doc0123.md"
    out = subprocess.run([*cmd, "verify", "--json"], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and json.loads(out.stdout)["drift"] == 0
