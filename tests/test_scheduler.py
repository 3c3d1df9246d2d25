"""The scheduler: jobs per source, persisted in the data dir, coalesced, never overlapping."""

from __future__ import annotations

import itertools
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ingest import scheduler as sched
from ingest.registry import source_from_argument
from ingest.services import open_services
from rag.errors import ConfigError
from rag.services import Services
from tests.conftest import make_settings


def _services(tmp_path: Path, every: str) -> Services:
    settings = make_settings(
        tmp_path / "data",
        schedule={"incremental_cron": every, "full_cron": "0 3 * * *", "misfire_grace_s": 4 * 3600},
    )
    return open_services(settings)


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir(exist_ok=True)
    (folder / "a.md").write_text("# A\n\nAlpha text.\n")
    return folder


def _wait_for_runs(services: Services, source: str, n: int, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = [r for r in services.state.runs(source) if r["status"] != "running"]
        if len(runs) >= n:
            return runs
        time.sleep(0.1)
    return [r for r in services.state.runs(source) if r["status"] != "running"]


def test_jobs_run_on_schedule_and_persist(tmp_path):
    services = _services(tmp_path, "*/1 * * * * *")  # every second (six fields: seconds first)
    services.state.add_source(source_from_argument(str(_folder(tmp_path)), name="docs"))
    scheduler = sched.build_scheduler(services)
    ids = sched.start(scheduler, services)
    try:
        assert ids == ["docs:full", "docs:incremental"]
        runs = _wait_for_runs(services, "docs", 2)
    finally:
        scheduler.shutdown(wait=True)
    assert len(runs) >= 2 and {r["mode"] for r in runs} == {"incremental"}
    assert all(r["status"] == "ok" for r in runs)
    assert services.state.counts("docs")[0] == 1
    # Runs of one source never overlap: each started after the previous one finished.
    ordered = sorted(runs, key=lambda r: r["started_at"])
    assert all(b["started_at"] >= a["finished_at"] for a, b in itertools.pairwise(ordered))
    assert (services.data_dir / "jobs.db").exists()
    services.close()


def test_restart_resumes_and_missed_runs_coalesce(tmp_path):
    services = _services(tmp_path, "0 * * * *")  # hourly
    services.state.add_source(source_from_argument(str(_folder(tmp_path)), name="docs"))
    scheduler = sched.build_scheduler(services)
    sched.start(scheduler, services)
    stored = scheduler.get_job("docs:incremental").next_run_time
    scheduler.shutdown(wait=True)

    restarted = sched.build_scheduler(services)
    restarted.start(paused=True)
    sched.sync_jobs(restarted, services)
    # The stored schedule survived the restart.
    assert restarted.get_job("docs:incremental").next_run_time == stored
    # Had the process been down for three hours, three hourly runs would have been missed.
    down_since = datetime.now(UTC) - timedelta(hours=3, minutes=1)
    restarted.modify_job("docs:incremental", next_run_time=down_since)
    restarted.resume()
    try:
        _wait_for_runs(services, "docs", 1)
        time.sleep(1.5)  # room for more catch-up runs, had the missed runs not coalesced
        runs = services.state.runs("docs")
        next_run = restarted.get_job("docs:incremental").next_run_time
    finally:
        restarted.shutdown(wait=True)
    assert len(runs) == 1 and runs[0]["mode"] == "incremental"
    assert next_run > datetime.now(UTC)
    services.close()


def test_removed_sources_lose_their_jobs(tmp_path):
    services = _services(tmp_path, "0 * * * *")
    services.state.add_source(source_from_argument(str(_folder(tmp_path)), name="docs"))
    scheduler = sched.build_scheduler(services)
    sched.start(scheduler, services)
    services.state.remove_source("docs")
    assert sched.sync_jobs(scheduler, services) == []
    assert scheduler.get_jobs() == []
    scheduler.shutdown()
    services.close()


@pytest.mark.parametrize("expr", ["* * *", "61 * * * *", "bogus cron expr here now"])
def test_bad_cron_is_a_config_error(expr):
    with pytest.raises(ConfigError, match="invalid cron expression"):
        sched.parse_cron(expr)
