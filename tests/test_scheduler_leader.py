"""One scheduler runs the jobs per state: a second one started on the same state (SQLite with
its file lock, or a real PostgreSQL with its advisory lock) waits as standby and takes over
when the first stops; two ``ragqa schedule`` processes on one PostgreSQL run each job once."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ingest import scheduler as sched
from ingest.services import open_services
from ingest.state import StateDB
from rag.config import SourceConfig
from rag.services import Services
from tests.conftest import make_settings
from tests.fixtures.postgres import NO_POSTGRES, POSTGRES_URL, STATE_DATABASES, fresh_schema, state_database


@pytest.fixture(params=STATE_DATABASES)
def state_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from state_database(request, tmp_path)


def wait_until(check: Callable[[], bool], timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def instance(tmp_path: Path, name: str, state_url: str) -> Services:
    """One instance: a data directory of its own, the shared state."""
    return open_services(make_settings(tmp_path / name, state={"url": state_url},
                                       schedule={"standby_poll_s": 0.2, "incremental_cron": "0 * * * *"}))


def test_a_second_scheduler_waits_as_standby_and_takes_over(tmp_path: Path, state_url: str) -> None:
    first, second = instance(tmp_path, "a", state_url), instance(tmp_path, "b", state_url)
    first.state.add_source(SourceConfig(name="docs", kind="folder", location=str(tmp_path)))  # type: ignore[attr-defined]
    leader, standby = sched.build_scheduler(first), sched.build_scheduler(second)
    try:
        assert sched.start(leader, first) == ["docs:full", "docs:incremental"]
        assert sched.start(standby, second) == ["docs:full", "docs:incremental"]
        assert leader.leading.is_set() and not standby.leading.is_set()
        time.sleep(0.5)  # several of the standby's checks: the lease stays with the leader
        assert leader.leading.is_set() and not standby.leading.is_set()
        next_run = leader.get_job("docs:incremental").next_run_time
        leader.shutdown()
        assert wait_until(standby.leading.is_set, timeout=10)
        assert sorted(j.id for j in standby.get_jobs()) == ["docs:full", "docs:incremental"]
        if state_url.startswith("postgresql"):  # one job store: the stored schedule carries over
            assert standby.get_job("docs:incremental").next_run_time == next_run
    finally:
        standby.shutdown()
        first.close()
        second.close()


@pytest.mark.integration
def test_two_schedule_processes_on_one_postgresql_run_each_job_once(tmp_path: Path) -> None:
    if not POSTGRES_URL:
        pytest.skip(NO_POSTGRES)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nAlpha text.\n")
    with fresh_schema("two_schedulers") as url:
        state = StateDB(url)
        state.add_source(SourceConfig(name="docs", kind="folder", location=str(folder)))
        env = {**os.environ, "RAG_STATE__URL": url, "RAG_EMBEDDER__BACKEND": "hash", "RAG_EMBEDDER__DIM": "256",
               "RAG_VECTOR__BACKEND": "numpy", "RAG_CACHE__BACKEND": "off",
               "RAG_SCHEDULE__INCREMENTAL_CRON": "*/1 * * * * *", "RAG_SCHEDULE__STANDBY_POLL_S": "0.3"}
        logs = [tmp_path / f"instance{n}.log" for n in range(2)]
        procs = []
        for n, log in enumerate(logs):
            with log.open("w") as err:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "ragqa.cli", "-v", "--data-dir", str(tmp_path / f"data{n}"), "schedule"],
                    env=env, stdout=subprocess.DEVNULL, stderr=err))

        def ran(n: int) -> int:
            return logs[n].read_text().count("incremental run of docs:")

        def finished_runs() -> list[dict]:
            return [r for r in state.runs("docs", limit=100) if r["status"] != "running"]

        try:
            assert wait_until(lambda: len(finished_runs()) >= 3, timeout=60), [p.read_text() for p in logs]
            counts = [ran(0), ran(1)]
            assert sorted(counts)[0] == 0 and sorted(counts)[1] >= 2, counts  # one instance ran them all
            lead = counts.index(max(counts))
            assert "this instance runs the jobs" in logs[lead].read_text()
            assert "standby" in logs[1 - lead].read_text()

            procs[lead].send_signal(signal.SIGTERM)
            procs[lead].wait(timeout=30)
            assert wait_until(lambda: ran(1 - lead) >= 2, timeout=30), logs[1 - lead].read_text()
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(timeout=30)
        runs = sorted(finished_runs(), key=lambda r: r["started_at"])
        state.close()
    assert all(r["status"] == "ok" for r in runs)
    # Never two runs at once, across both instances: each began after the previous one ended.
    assert all(b["started_at"] >= a["finished_at"] for a, b in itertools.pairwise(runs))
