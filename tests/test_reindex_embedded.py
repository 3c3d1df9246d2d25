"""The embedded default end to end, with nothing faked: the packaged MiniLM model,
Milvus Lite, tantivy, and a sitemap of real Python docs pages served on loopback."""

from __future__ import annotations

import pytest

from ingest.pipeline import reindex
from ingest.registry import source_from_argument
from ingest.services import open_services
from rag.config import Settings
from rag.search import search
from tests.conftest import publish, write_sitemap

pytestmark = pytest.mark.slow

# The five pages whose text changed between the releases, and some that did not.
UNCHANGED = ["library/json.html", "library/pathlib.html", "library/hashlib.html",
             "library/secrets.html", "library/base64.html", "tutorial/introduction.html",
             "library/functools.html", "library/heapq.html"]


@pytest.fixture(scope="module")
def site(tmp_path_factory, pydocs, static_server_factory):
    pages = list(pydocs["changed"]) + UNCHANGED
    served = tmp_path_factory.mktemp("www") / "site"
    publish(pydocs["v1"], served, pages)
    server = static_server_factory(served.parent)
    sitemap = write_sitemap(served, server.url("/site").rstrip("/"), pages)
    return {"served": served, "server": server, "sitemap": sitemap, "pages": pages}


def test_embedded_default_reindexes_only_changed_pages(tmp_path, site, pydocs):
    settings = Settings.load(None, data_dir=tmp_path / "data", embedder={"progress": False})
    assert settings.vector.backend == "milvus" and settings.embedder.backend == "auto"
    services = open_services(settings)
    try:
        services.state.add_source(source_from_argument(site["sitemap"], name="pydocs"))
        assert services.state.source("pydocs").kind == "sitemap"
        first = reindex(services, "pydocs", "full")
        # English pages: the first ingest chose the English MiniLM (int8), and recorded why.
        assert services.embedder_settings.backend == "onnx-int8"
        assert services.embedder_choice()["reason"].startswith("chosen at the first ingest: 0% of its first")
        n = len(site["pages"])
        assert (first.added, first.failed, first.deleted) == (n, 0, 0)
        docs, chunks = services.state.counts()
        assert docs == n and first.chunks_embedded == chunks
        assert services.vector.count() == services.lexical.count() == services.vector_cache.count() == chunks

        again = reindex(services, "pydocs", "incremental")
        assert again.chunks_embedded == 0 and again.unchanged == n

        publish(pydocs["v2"], site["served"], site["pages"])
        write_sitemap(site["served"], site["server"].url("/site").rstrip("/"), site["pages"])
        second = reindex(services, "pydocs", "incremental")
        assert second.changed == 5 and second.added == second.deleted == second.failed == 0
        changed_chunks = sum(len(services.state.chunk_hashes(f"pydocs:/site/{p}")) for p in pydocs["changed"])
        assert 0 < second.chunks_embedded <= changed_chunks
        assert services.vector.count() == services.state.counts()[1]

        # Search (BM25 candidates, reordered by MiniLM similarity) finds the right page.
        hits = search(services, "urllib.request urlopen HTTP handlers", k=3)
        assert hits and hits[0].doc_id == "pydocs:/site/library/urllib.request.html"
        assert hits[0].explain["cosine"] > 0.3
        hits = search(services, "JSON encoder and decoder", k=3)
        assert hits[0].doc_id == "pydocs:/site/library/json.html"
    finally:
        services.close()
