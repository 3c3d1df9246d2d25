"""Keeps every source fresh: a daily full crawl and an hourly incremental one per source.

Jobs live in ``<data_dir>/jobs.db`` (APScheduler's SQLAlchemy job store), so a restart
resumes the schedule, and a run missed while the process was down happens once (missed
runs coalesce) if it is still within ``misfire_grace_s``. One worker thread runs jobs, so
two runs of a source never overlap. Each job only calls :func:`ingest.pipeline.reindex`.

Cron expressions have five fields (minute hour day month weekday) or six with a leading
seconds field.

Example::

    scheduler = build_scheduler(services)
    start(scheduler, services)   # runs jobs in a background thread
"""

from __future__ import annotations

import logging
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.cron import CronTrigger

from ingest.services import state_db
from rag.errors import ConfigError, DataDirLocked, RagError
from rag.services import Services

__all__ = ["build_scheduler", "start", "parse_cron", "run_job", "sync_jobs"]

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


def sync_jobs(scheduler: BaseScheduler, services: Services) -> list[str]:
    """Make the stored jobs match the registered sources, keeping their next run times."""
    cfg = services.settings.schedule
    wanted: dict[str, tuple[str, str, CronTrigger]] = {}
    for src in state_db(services).sources():
        wanted[f"{src.name}:full"] = (src.name, "full", parse_cron(cfg.full_cron, cfg.timezone))
        wanted[f"{src.name}:incremental"] = (
            src.name, "incremental", parse_cron(cfg.incremental_cron, cfg.timezone))
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


def build_scheduler(services: Services) -> BackgroundScheduler:
    """A scheduler whose jobs persist in the data directory; call ``start()`` on it."""
    global _SERVICES
    _SERVICES = services
    services.data_dir.mkdir(parents=True, exist_ok=True)
    cfg = services.settings.schedule
    kwargs: dict[str, Any] = {
        "jobstores": {"default": SQLAlchemyJobStore(url=f"sqlite:///{services.data_dir / 'jobs.db'}")},
        "executors": {"default": ThreadPoolExecutor(max_workers=1)},
        "job_defaults": {"coalesce": True, "max_instances": 1, "misfire_grace_time": cfg.misfire_grace_s},
        "timezone": cfg.timezone,
    }
    return BackgroundScheduler(**kwargs)


def start(scheduler: BaseScheduler, services: Services) -> list[str]:
    """Start paused (the job store is readable only once started), reconcile, resume."""
    scheduler.start(paused=True)
    ids = sync_jobs(scheduler, services)
    scheduler.resume()
    return ids
