"""End to end on two real releases of the Python docs (530 pages each).

Every page's bytes differ between the releases, but only five pages' text does. A reindex
must notice exactly those five, re-embed nothing else, reflect the new text in search,
delete removed pages, and delete nothing when the server fails.
"""

from __future__ import annotations

import pytest

from ingest.pipeline import reindex
from ingest.registry import source_from_argument
from ingest.services import open_services
from rag.services import Services
from tests.conftest import make_settings, publish

pytestmark = pytest.mark.slow


def _doc_id(page: str) -> str:
    return f"pydocs:/site/{page}"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, pydocs, static_server_factory):
    """One data dir and one served site shared by the ordered steps of this module."""
    served = tmp_path_factory.mktemp("served") / "site"
    publish(pydocs["v1"], served)
    server = static_server_factory(served.parent)
    services = open_services(make_settings(tmp_path_factory.mktemp("data")))
    cfg = source_from_argument(server.url("/site/index.html"), name="pydocs", trust="high")
    services.state.add_source(cfg)
    state = {"services": services, "server": server, "served": served, "reports": {}}
    yield state
    services.close()


def test_first_full_crawl_indexes_every_page(run, pydocs):
    s: Services = run["services"]
    report = reindex(s, "pydocs", "full")
    run["reports"]["v1"] = report
    docs, chunks = s.state.counts("pydocs")
    assert report.failed == 0 and report.complete
    assert report.added == docs
    # The docs' index and its links reach nearly every page of the release.
    assert docs >= 500, docs
    for page in pydocs["changed"]:
        assert s.state.document_row(_doc_id(page)) is not None, page
    assert report.chunks_embedded > 0
    assert s.lexical.count() == chunks == s.vector.count()


def test_same_release_again_reembeds_nothing(run):
    s: Services = run["services"]
    docs_before = s.state.counts("pydocs")
    for mode in ("incremental", "full"):
        report = reindex(s, "pydocs", mode)
        assert report.chunks_embedded == 0, (mode, report)
        assert report.changed == report.added == report.deleted == report.failed == 0, (mode, report)
        assert report.unchanged == docs_before[0], (mode, report)
    assert s.state.counts("pydocs") == docs_before


def test_new_release_reembeds_only_the_changed_pages(run, pydocs):
    s: Services = run["services"]
    before = {page: s.state.chunk_hashes(_doc_id(page)) for page in pydocs["changed"]}
    publish(pydocs["v2"], run["served"])  # every file is new to the server
    report = reindex(s, "pydocs", "incremental")
    assert report.failed == 0
    assert report.changed == len(pydocs["changed"]) == 5, report
    assert report.added == report.deleted == 0
    changed_chunk_total = sum(len(s.state.chunk_hashes(_doc_id(p))) for p in pydocs["changed"])
    assert 0 < report.chunks_embedded <= changed_chunk_total

    # The new text is searchable and the old text is gone from every index.
    new_seen = 0
    for page in pydocs["changed"]:
        after = s.state.chunk_hashes(_doc_id(page))
        gone_ids = set(before[page]) - set(after)
        assert not gone_ids & s.lexical.chunk_ids("pydocs")
        assert not gone_ids & s.vector.chunk_ids("pydocs")
        new_ids = [cid for cid, h in after.items() if h not in set(before[page].values())]
        for cid in new_ids[:1]:
            chunk = s.state.get_chunks([cid])[cid]
            hits = s.lexical.search(chunk.text[:300], k=5)
            assert cid in [h.chunk_id for h in hits], (page, chunk.text[:80])
            new_seen += 1
    assert new_seen >= 1


def test_removed_pages_are_deleted_everywhere(run, pydocs):
    s: Services = run["services"]
    removed = ["library/wave.html", "library/xdrlib.html", "library/telnetlib.html"]
    removed = [p for p in removed if s.state.document_row(_doc_id(p)) is not None]
    assert removed
    chunk_ids = {cid for p in removed for cid in s.state.chunk_hashes(_doc_id(p))}
    for page in removed:
        (run["served"] / page).unlink()
    report = reindex(s, "pydocs", "incremental")
    assert report.deleted == len(removed), report
    assert report.chunks_embedded == 0
    for page in removed:
        assert s.state.document_row(_doc_id(page)) is None
    assert not chunk_ids & s.lexical.chunk_ids()
    assert not chunk_ids & s.vector.chunk_ids()
    assert s.lexical.count() == s.state.counts()[1] == s.vector.count()


def test_server_failing_everywhere_deletes_nothing(run):
    s: Services = run["services"]
    server = run["server"]
    counts = s.state.counts("pydocs")
    lexical, vector = s.lexical.count(), s.vector.count()
    server.force_status = 500
    try:
        report = reindex(s, "pydocs", "full")
    finally:
        server.force_status = None
    assert report.failed >= 1 and not report.complete
    assert report.deleted == 0 and report.chunks_embedded == 0
    assert s.state.counts("pydocs") == counts
    assert (s.lexical.count(), s.vector.count()) == (lexical, vector)
    assert s.state.last_run("pydocs")["status"] == "partial"


def test_recovers_after_the_outage(run):
    s: Services = run["services"]
    report = reindex(s, "pydocs", "incremental")
    assert report.failed == 0 and report.chunks_embedded == 0 and report.deleted == 0
