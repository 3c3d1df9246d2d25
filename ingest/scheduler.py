"""Keeps every source fresh: a daily full crawl and an hourly incremental one per source.

Jobs persist in APScheduler's SQLAlchemy job store, so a restart resumes the schedule, and a
run missed while the process was down happens once (missed runs coalesce) if it is still
within ``misfire_grace_s``. The store is ``<data_dir>/jobs.db`` on the embedded default, and the
state's own database when ``state.url`` names one (a PostgreSQL that several instances share).
One worker thread runs jobs, so two runs of a source never overlap. Each job only calls
:func:`ingest.pipeline.reindex`.

Only one scheduler runs jobs at a time per state: it holds a lease (:mod:`ingest.leader`, a
PostgreSQL advisory lock, or a file lock beside a SQLite state). Another started on the same
state waits as standby, checking every ``schedule.standby_poll_s``, and takes over when the
first stops or loses its database connection.

Cron expressions have five fields (minute hour day month weekday) or six with a leading
seconds field.

Example::

    scheduler = build_scheduler(services)
    start(scheduler, services)   # runs jobs in a background thread, or waits as standby
    scheduler.shutdown()
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.cron import CronTrigger

from ingest.leader import Lease, lease_for
from ingest.services import state_db
from ingest.state_sql import create_tables, make_engine
from rag.errors import ConfigError, DataDirLocked, RagError
from rag.services import Services

__all__ = ["LeaderScheduler", "build_scheduler", "start", "parse_cron", "run_job", "sync_jobs"]

log = logging.getLogger("ragqa.scheduler")

# The process-wide services a persisted job runs against; jobs store only their arguments.
_SERVICES: Services | None = None


def parse_cron(expr: str, timezone: str = "UTC") -> CronTrigger:
    fields = expr.split()
    try:
        if len(fields) == 5:
            return CronTrigger.from_crontab(expr, timezone=timezone)
        if len(fields) == 6:
            second, minute, hour, day, month, dow = fields
            return CronTrigger(second=second, minute=minute, hour=hour, day=day, month=month,
                               day_of_week=dow, timezone=timezone)
    except ValueError as exc:
        raise ConfigError(f"invalid cron expression {expr!r}: {exc}") from exc
    raise ConfigError(f"invalid cron expression {expr!r}: expected 5 or 6 fields")


def run_job(source: str, mode: str) -> dict[str, Any] | None:
    """The scheduled job. Errors are logged, never raised into the scheduler."""
    from ingest.pipeline import reindex

    if _SERVICES is None:  # pragma: no cover - only if a job fires before start-up
        log.error("scheduler job fired before services were set up")
        return None
    try:
        with _SERVICES.write_lock():
            report = reindex(_SERVICES, source, mode)  # type: ignore[arg-type]
    except DataDirLocked as exc:
        log.warning("skipped %s run of %s: %s", mode, source, exc)
        return None
    except RagError as exc:
        log.error("%s run of %s failed: %s", mode, source, exc)
        return None
    except Exception:
        log.exception("%s run of %s failed unexpectedly", mode, source)
        return None
    log.info("%s run of %s: %s", mode, source, report.as_dict())
    return report.as_dict()


def _same_trigger(a: CronTrigger, b: CronTrigger) -> bool:
    return str(a) == str(b) and str(a.timezone) == str(b.timezone)


def _wanted(services: Services) -> dict[str, tuple[str, str, CronTrigger]]:
    cfg = services.settings.schedule
    wanted: dict[str, tuple[str, str, CronTrigger]] = {}
    for src in state_db(services).sources():
        wanted[f"{src.name}:full"] = (src.name, "full", parse_cron(cfg.full_cron, cfg.timezone))
        wanted[f"{src.name}:incremental"] = (
            src.name, "incremental", parse_cron(cfg.incremental_cron, cfg.timezone))
    return wanted


def sync_jobs(scheduler: BaseScheduler, services: Services) -> list[str]:
    """Make the stored jobs match the registered sources, keeping their next run times."""
    wanted = _wanted(services)
    for job in scheduler.get_jobs():
        if job.id not in wanted:
            scheduler.remove_job(job.id)
    for job_id, (source, mode, trigger) in wanted.items():
        existing = scheduler.get_job(job_id)
        if existing is not None and _same_trigger(existing.trigger, trigger):
            continue
        scheduler.add_job(
            run_job, trigger=trigger, args=(source, mode), id=job_id,
            name=f"{mode} crawl of {source}", replace_existing=True,
        )
    return sorted(wanted)


class LeaderScheduler(BackgroundScheduler):
    """A background scheduler that runs jobs only while it holds the state's ``lease``;
    :func:`start` starts it, ``shutdown()`` stops it and hands the lease on."""

    def __init__(self, *, lease: Lease, standby_poll_s: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lease = lease
        self.standby_poll_s = standby_poll_s
        self.leading = threading.Event()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def take_lead(self, services: Services) -> bool:
        """Become the one running jobs if the lease is free; True when this one leads."""
        if not self.lease.try_acquire():
            return False
        sync_jobs(self, services)
        self.resume()
        self.leading.set()
        log.info("scheduler: this instance runs the jobs")
        return True

    def watch(self, services: Services) -> None:
        """Keep trying for the lease while standby; pause if the lead is lost."""
        def loop() -> None:
            while not self._stop.wait(self.standby_poll_s):
                try:
                    if not self.leading.is_set():
                        self.take_lead(services)
                    elif not self.lease.holds():
                        self.pause()
                        self.leading.clear()
                        log.warning("scheduler: lost the lease on the state database; standby until it is back")
                except Exception:  # the watcher must outlive a failed check
                    log.exception("scheduler: checking the lease failed")

        self._watcher = threading.Thread(target=loop, name="ragqa-scheduler-lease", daemon=True)
        self._watcher.start()

    def shutdown(self, wait: bool = True) -> None:
        self._stop.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        try:
            super().shutdown(wait)  # joins the scheduler's thread
        finally:
            self.leading.clear()
            self.lease.release()  # after the running job, so the next leader never overlaps it
            for store in self._jobstores.values():
                if isinstance(store, _JobStore):
                    store.engine.dispose()


class _JobStore(SQLAlchemyJobStore):
    """APScheduler's store, whose engine :meth:`LeaderScheduler.shutdown` closes only once the
    scheduler's thread has stopped: the store's own shutdown disposes of it while that thread
    may still be reading due jobs, leaving its connection open."""

    def shutdown(self) -> None:
        pass


def build_scheduler(services: Services) -> LeaderScheduler:
    """A scheduler whose jobs persist beside the state; call :func:`start` with it."""
    global _SERVICES
    _SERVICES = services
    services.data_dir.mkdir(parents=True, exist_ok=True)
    settings = services.settings
    cfg = settings.schedule
    if settings.state.url:
        engine = make_engine(settings.state_url)
        store = _JobStore(engine=engine)
        # Several instances start together on one database: create the table once, under the
        # state's creation lock, not in each job store's start().
        create_tables(engine, also=store.jobs_t)
    else:
        store = _JobStore(engine=make_engine(f"sqlite:///{services.data_dir / 'jobs.db'}"))
    kwargs: dict[str, Any] = {
        "jobstores": {"default": store},
        "executors": {"default": ThreadPoolExecutor(max_workers=1)},
        "job_defaults": {"coalesce": True, "max_instances": 1, "misfire_grace_time": cfg.misfire_grace_s},
        "timezone": cfg.timezone,
    }
    return LeaderScheduler(lease=lease_for(settings.state_url, services.data_dir),
                           standby_poll_s=cfg.standby_poll_s, **kwargs)


def start(scheduler: BaseScheduler, services: Services) -> list[str]:
    """Start paused (the job store is readable only once started), then run the jobs if this
    scheduler gets the lease, or wait as standby; returns the ids of the sources' jobs."""
    scheduler.start(paused=True)
    if not isinstance(scheduler, LeaderScheduler):
        ids = sync_jobs(scheduler, services)
        scheduler.resume()
        return ids
    if not scheduler.take_lead(services):
        log.info("scheduler: standby; another instance runs the jobs, this one takes over when it stops")
    scheduler.watch(services)
    return sorted(_wanted(services))
