"""A reindex does not delete most of a source because its crawl came back nearly empty (an
unmounted volume, a broken site navigation), and a page with no text is an error, not a
deletion: real folder sources, the real pipeline, the hash embedder."""

from __future__ import annotations

from datetime import UTC, datetime

from click.testing import CliRunner

from ingest.pipeline import reindex
from ingest.services import open_services
from rag.metrics import REGISTRY
from ragqa.cli import cli
from tests.conftest import make_settings
from tests.corpus import index_notes

WHEN = datetime(2024, 5, 1, tzinfo=UTC)


def refused(source: str) -> float:
    return REGISTRY.get_sample_value("reindex_deletions_refused_total", {"source": source}) or 0.0


def test_a_run_that_would_delete_most_of_a_source_deletes_nothing_without_allow_mass_delete(tmp_path):
    services = index_notes(open_services(make_settings(tmp_path / "data")), tmp_path, {"notes": (range(6), WHEN)})
    files = sorted((tmp_path / "notes").iterdir())
    for path in files[:4]:  # 4 of 6: more than half
        path.unlink()
    before = refused("notes")
    with services.write_lock():
        report = reindex(services, "notes", "incremental")
    assert report.deleted == 0 and report.deletions_refused == 4 and report.deletions_skipped
    assert "--allow-mass-delete" in report.errors[-1]
    assert services.state.counts("notes")[0] == 6 and refused("notes") == before + 4
    assert len(services.lexical.search("note", k=50)) >= 6  # still answering from all six
    services.close()  # (its index writer) the CLI runs below in this process

    env = {"RAG_DATA_DIR": str(services.data_dir)}
    result = CliRunner().invoke(cli, ["reindex", "--source", "notes"], env=env)
    assert result.exit_code == 2 and "deletions refused: 4 documents kept" in result.output, result.output
    result = CliRunner().invoke(cli, ["reindex", "--source", "notes", "--allow-mass-delete", "--json"], env=env)
    assert result.exit_code == 0 and '"deleted": 4' in result.output, result.output


def test_a_few_deletions_go_through_and_the_share_is_a_setting(tmp_path):
    services = index_notes(open_services(make_settings(tmp_path / "data", crawl={"max_delete_fraction": 0.2})),
                           tmp_path, {"notes": (range(10), WHEN)})
    files = sorted((tmp_path / "notes").iterdir())
    files[0].unlink()
    files[1].unlink()  # 2 of 10: at the 20% limit
    with services.write_lock():
        assert reindex(services, "notes", "incremental").deleted == 2
    files[2].unlink()
    files[3].unlink()
    files[4].unlink()  # 3 of 8: over it
    with services.write_lock():
        report = reindex(services, "notes", "incremental")
    assert report.deleted == 0 and report.deletions_refused == 3
    services.close()


def test_a_page_with_no_text_is_an_error_and_its_old_version_stays(tmp_path):
    services = index_notes(open_services(make_settings(tmp_path / "data")), tmp_path, {"notes": (range(4), WHEN)})
    emptied = sorted((tmp_path / "notes").iterdir())[0]
    emptied.write_text("   \n", encoding="utf-8")
    with services.write_lock():
        report = reindex(services, "notes", "full")
    assert report.deleted == 0 and report.failed == 1 and "no text could be extracted" in report.errors[0]
    assert services.state.counts("notes")[0] == 4
    services.close()
