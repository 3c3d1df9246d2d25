"""Commands that register sources and keep them indexed: ingest, reindex, status, schedule, sources."""

from __future__ import annotations

import signal
import sys
import threading
from datetime import UTC, datetime
from typing import Any

import click

from rag.errors import ConfigError, RagError
from ragqa.cli.common import Context, emit, handle_errors

__all__ = ["ingest", "reindex", "status", "schedule", "sources_cmd"]


@click.command()
@click.argument("source")
@click.option("--name", "-n", help="Source name (default: folder name or host).")
@click.option("--kind", type=click.Choice(["folder", "site", "sitemap", "feed"]),
              help="Override the kind guessed from SOURCE.")
@click.option("--trust", type=click.Choice(["high", "normal", "low"]), default="normal", show_default=True)
@click.option("--tag", "tags", multiple=True, help="Tag every document (repeatable).")
@click.option("--tenant", help="Bind the documents to a tenant.")
@click.option("--json", "as_json", is_flag=True, help="Print the run report as JSON.")
@click.pass_obj
@handle_errors
def ingest(obj: Context, source: str, name: str | None, kind: str | None, trust: str,
           tags: tuple[str, ...], tenant: str | None, as_json: bool) -> None:
    """Register SOURCE (a folder, a site or sitemap URL, or a feed URL) and crawl it fully."""
    from ingest.pipeline import reindex
    from ingest.registry import source_from_argument

    services = obj.services
    cfg = source_from_argument(source, name=name, kind=kind, trust=trust, tags=tags, tenant=tenant)
    with services.write_lock():
        existed = any(s.name == cfg.name for s in services.state.sources())
        services.state.add_source(cfg)
        report = reindex(services, cfg.name, "full", progress=not as_json)
        if not existed and report.fetched == 0 and report.failed > 0:
            services.state.remove_source(cfg.name)
            raise RagError(f"cannot crawl {source}: {report.errors[0] if report.errors else 'no pages'}")
    emit(report.as_dict(), as_json, _report_text)


@click.command()
@click.option("--source", "-s", "source_name", help="Only this source (default: all).")
@click.option("--mode", "-m", type=click.Choice(["full", "incremental"]), default="incremental",
              show_default=True)
@click.option("--allow-mass-delete", is_flag=True,
              help="Delete the documents the crawl no longer saw even when they are more than "
                   "crawl.max_delete_fraction (half) of the source.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per source.")
@click.pass_obj
@handle_errors
def reindex(obj: Context, source_name: str | None, mode: str, allow_mass_delete: bool, as_json: bool) -> None:
    """Crawl now and update the indexes; only changed documents are re-embedded."""
    from ingest.pipeline import reindex as run

    services = obj.services
    names = [source_name] if source_name else [s.name for s in services.state.sources()]
    if source_name:
        services.state.source(source_name)  # unknown source: one clear error
    if not names:
        raise ConfigError("no sources registered; add one with `ragqa ingest PATH_OR_URL`")
    failed = False
    with services.write_lock():
        for name in names:
            report = run(services, name, mode, progress=not as_json,  # type: ignore[arg-type]
                         allow_mass_delete=allow_mass_delete)
            failed |= report.failed > 0 or report.deletions_refused > 0
            emit(report.as_dict(), as_json, _report_text)
    sys.exit(2 if failed else 0)


def _report_text(r: dict[str, Any]) -> str:
    line = (f"{r['source']} ({r['mode']}): fetched {r['fetched']}, unchanged {r['unchanged']}, "
            f"changed {r['changed']}, added {r['added']}, deleted {r['deleted']}, failed {r['failed']}; "
            f"embedded {r['chunks_embedded']} chunks in {r['seconds']:.1f}s")
    if r.get("deletions_refused"):
        line += (f"\n  deletions refused: {r['deletions_refused']} documents kept (more than "
                 "crawl.max_delete_fraction of the source; --allow-mass-delete deletes them)")
    elif r.get("deletions_skipped"):
        line += "\n  deletions skipped: the crawl had errors or could not see the whole source"
    for err in r.get("errors", [])[:5]:
        line += f"\n  ! {err}"
    return line


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def status(obj: Context, as_json: bool) -> None:
    """Show sources, document and chunk counts, last and next runs, and backends."""
    from ingest.scheduler import parse_cron

    services = obj.services
    state, sched = services.state, services.settings.schedule
    now = datetime.now(UTC)
    sources = []
    for src in state.sources():
        docs, chunks = state.counts(src.name)
        last = state.last_run(src.name)
        next_runs = {
            mode: parse_cron(expr, sched.timezone).get_next_fire_time(None, now)
            for mode, expr in (("full", sched.full_cron), ("incremental", sched.incremental_cron))
        }
        sources.append({
            "name": src.name, "kind": src.kind, "location": src.location, "trust": src.trust.name,
            "documents": docs, "chunks": chunks,
            "last_run": None if last is None else {
                "mode": last["mode"], "status": last["status"],
                "finished_at": _ts(last["finished_at"]) if last["finished_at"] else None,
                "progress": last.get("progress"),
            },
            "next_full": next_runs["full"], "next_incremental": next_runs["incremental"],
        })
    data = {"data_dir": str(services.data_dir), "backends": services.backend_names(), "sources": sources,
            "languages": state.languages(), "warnings": _language_warnings(services)}
    emit(data, as_json, _status_text)


def _language_warnings(services: Any) -> list[str]:
    """A warning per indexed language the embedder does not rank (its questions get mostly BM25)."""
    from rag.lang import LANG_NAMES, ranks

    embedder = services.embedder  # constructed, not loaded
    out = []
    for lang, n in sorted(services.state.languages().items()):
        if lang in LANG_NAMES and not ranks(embedder, lang):
            out.append(f"{n} {LANG_NAMES[lang]} documents, which the embedder {embedder.name} does not rank: "
                       f"{LANG_NAMES[lang]} questions use mostly keyword search. For vector search in "
                       f"{LANG_NAMES[lang]} too, index into a new data directory with RAG_EMBEDDER__BACKEND=use.")
    return out


def _ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _status_text(d: dict[str, Any]) -> str:
    from ingest.progress import describe

    lines = [f"data dir: {d['data_dir']}"]
    lines += [f"{k}: {v}" for k, v in d["backends"].items()]
    if d.get("languages"):
        lines.append("documents by language: " + ", ".join(f"{k} {v}" for k, v in sorted(d["languages"].items())))
    lines += [f"warning: {w}" for w in d.get("warnings", ())]
    if not d["sources"]:
        lines.append("no sources yet: `ragqa ingest PATH_OR_URL`")
    for s in d["sources"]:
        last = s["last_run"]
        last_txt = f"{last['mode']} {last['status']} at {last['finished_at']}" if last else "never"
        if last and last["status"] == "running":
            last_txt = describe(last["progress"]) if last.get("progress") else f"running ({last['mode']}), starting"
        lines.append(f"- {s['name']} [{s['kind']}, trust {s['trust']}] {s['location']}\n"
                     f"    {s['documents']} documents, {s['chunks']} chunks; last run: {last_txt}; "
                     f"next incremental {s['next_incremental']:%Y-%m-%d %H:%M}, "
                     f"next full {s['next_full']:%Y-%m-%d %H:%M}")
    return "\n".join(lines)


@click.command()
@click.option("--run-now", is_flag=True, help="Run an incremental crawl of every source first.")
@click.pass_obj
@handle_errors
def schedule(obj: Context, run_now: bool) -> None:
    """Run the scheduler in the foreground until interrupted (Ctrl-C)."""
    from ingest import scheduler as sched

    services = obj.services
    scheduler = sched.build_scheduler(services)  # also what run_job runs against
    if run_now:
        for src in services.state.sources():
            sched.run_job(src.name, "incremental")
    ids = sched.start(scheduler, services)
    for job in scheduler.get_jobs():
        click.echo(f"scheduled {job.id}: next run {job.next_run_time}", err=True)
    if not ids:
        click.echo("no sources registered yet; jobs are added when the scheduler restarts", err=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    click.echo("stopping scheduler (waiting for a running job to finish)", err=True)
    scheduler.shutdown(wait=True)


@click.command("sources")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def sources_cmd(obj: Context, as_json: bool) -> None:
    """List registered sources."""
    rows = [s.model_dump(mode="json") for s in obj.services.state.sources()]
    emit(rows, as_json, lambda rs: "\n".join(f"{r['name']}\t{r['kind']}\t{r['location']}" for r in rs)
          or "no sources")


