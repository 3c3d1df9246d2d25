"""Progress a person can read: pages and chunks done, chunks/s and an ETA, on the tqdm bar, in
the state while a run lasts, in ``ragqa status`` and ``GET /v1/sources``."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from click.testing import CliRunner

import ingest.pipeline as pipeline
from ingest.progress import RunProgress, describe
from ingest.services import open_services
from rag.config import SourceConfig
from ragqa.cli import cli
from tests.conftest import make_settings
from tests.corpus import write_folder

WHEN = datetime(2024, 5, 1, tzinfo=UTC)


def test_the_eta_is_the_pages_left_times_the_time_per_page_so_far():
    progress = RunProgress("docs", "full", started=time.monotonic() - 20)
    for _ in range(10):
        progress.page(total=40)
    progress.embedded(300)
    assert 59 < progress.eta_s < 61  # 30 pages left at 2 s a page
    assert 14 < progress.chunks_per_s < 16
    line = describe(progress.as_dict())
    assert line.startswith("running (full): 10/40 pages, 300 chunks at 15.0/s, 20s so far, ETA 1m0")
    grows = RunProgress("site", "full", started=time.monotonic() - 5)
    for _ in range(5):
        grows.page(total=8, grows=True)
    assert "5/8+ pages" in describe(grows.as_dict()) and "ETA at least" in describe(grows.as_dict())
    assert RunProgress("x", "full").eta_s is None  # no pages yet: no ETA


def test_a_run_records_its_progress_while_it_lasts_and_status_shows_it(tmp_path, monkeypatch):
    services = open_services(make_settings(tmp_path / "data"))
    write_folder(tmp_path / "notes", range(30), WHEN)
    services.state.add_source(SourceConfig(name="notes", kind="folder", location=str(tmp_path / "notes")))
    recorded: list[dict] = []
    record = services.state.run_progress
    monkeypatch.setattr(pipeline, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(services.state, "run_progress", lambda run_id, p: (recorded.append(p), record(run_id, p)))
    with services.write_lock():
        report = pipeline.reindex(services, "notes", "full")
    assert report.added == 30 and len(recorded) == 30
    assert [p["pages"] for p in recorded] == list(range(1, 31))
    assert all(p["total"] == 30 and not p["total_grows"] for p in recorded)  # the folder, listed first
    assert recorded[1]["eta_s"] is None and all(p["eta_s"] is not None for p in recorded[2:])
    assert recorded[-1]["eta_s"] == 0 and recorded[-1]["chunks_embedded"] <= report.chunks_embedded
    assert services.state.last_run("notes")["progress"] is None  # finished: the report instead

    # A run in progress, as another process sees it
    run_id = services.state.start_run("notes", "incremental")
    services.state.run_progress(run_id, recorded[11])
    services.close()
    result = CliRunner().invoke(cli, ["status"], env={"RAG_DATA_DIR": str(services.data_dir)})
    assert result.exit_code == 0, result.output
    assert "last run: running (full): 12/30 pages," in result.output and "ETA" in result.output
    result = CliRunner().invoke(cli, ["status", "--json"], env={"RAG_DATA_DIR": str(services.data_dir)})
    assert '"pages": 12' in result.output
