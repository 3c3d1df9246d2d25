"""The ``ragqa`` command line.

Every command takes ``--config FILE`` (or ``RAG_CONFIG``) and ``--data-dir DIR`` (or
``RAG_DATA_DIR``). Errors print one line on stderr and exit non-zero; progress goes to
stderr, results to stdout (``--json`` for machines).

Example::

    ragqa ingest ./docs --name docs --trust high
    ragqa reindex --mode incremental --json
    ragqa search "how do I verify certificates" --k 5
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import wraps
from typing import Any

import click

from rag.errors import ConfigError, RagError

__all__ = ["main", "cli"]


class Context:
    def __init__(self, config: str | None, data_dir: str | None, log_json: bool, verbose: int) -> None:
        self.config, self.data_dir, self.log_json, self.verbose = config, data_dir, log_json, verbose
        self._services: Any = None

    @property
    def services(self):  # noqa: ANN201
        if self._services is None:
            from rag.config import Settings
            from rag.logs import setup_logging
            from rag.services import Services

            overrides: dict[str, Any] = {}
            if self.data_dir:
                overrides["data_dir"] = self.data_dir
            if self.log_json:
                overrides["log_json"] = True
            settings = Settings.load(self.config, **overrides)
            setup_logging(json_logs=settings.log_json, verbose=self.verbose)
            self._services = Services(settings)
        return self._services

    def close(self) -> None:
        if self._services is not None:
            self._services.close()


def _handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RagError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug: still one line, with a way to get the traceback
            if os.environ.get("RAG_DEBUG"):
                raise
            _fail(f"unexpected {type(exc).__name__}: {exc} (set RAG_DEBUG=1 for a traceback)")
    return wrapper


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def _emit(data: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False, default=str))
    else:
        click.echo(text(data))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "-c", envvar="RAG_CONFIG", type=click.Path(dir_okay=False),
              help="YAML settings file (env RAG_CONFIG).")
@click.option("--data-dir", "-d", envvar="RAG_DATA_DIR", type=click.Path(file_okay=False),
              help="Where all state lives (env RAG_DATA_DIR, default ./.ragqa).")
@click.option("--log-json", is_flag=True, help="Log JSON lines on stderr (env RAG_LOG_JSON).")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.version_option(package_name="ragqa")
@click.pass_context
def cli(ctx: click.Context, config: str | None, data_dir: str | None, log_json: bool, verbose: int) -> None:
    """ragqa: retrieval-augmented question answering over your documents, with citations.

    Register a folder, web site, sitemap or feed with `ingest`; `reindex` and `schedule`
    keep it fresh, re-embedding only what changed; `search` checks what is indexed.
    """
    ctx.obj = Context(config, data_dir, log_json, verbose)
    ctx.call_on_close(ctx.obj.close)


@cli.command()
@click.argument("source")
@click.option("--name", "-n", help="Source name (default: folder name or host).")
@click.option("--kind", type=click.Choice(["folder", "site", "sitemap", "feed"]),
              help="Override the kind guessed from SOURCE.")
@click.option("--trust", type=click.Choice(["high", "normal", "low"]), default="normal", show_default=True)
@click.option("--tag", "tags", multiple=True, help="Tag every document (repeatable).")
@click.option("--tenant", help="Bind the documents to a tenant.")
@click.option("--json", "as_json", is_flag=True, help="Print the run report as JSON.")
@click.pass_obj
@_handle_errors
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
    _emit(report.as_dict(), as_json, _report_text)


@cli.command()
@click.option("--source", "-s", "source_name", help="Only this source (default: all).")
@click.option("--mode", "-m", type=click.Choice(["full", "incremental"]), default="incremental",
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per source.")
@click.pass_obj
@_handle_errors
def reindex(obj: Context, source_name: str | None, mode: str, as_json: bool) -> None:
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
            report = run(services, name, mode, progress=not as_json)  # type: ignore[arg-type]
            failed |= report.failed > 0
            _emit(report.as_dict(), as_json, _report_text)
    sys.exit(2 if failed else 0)


def _report_text(r: dict[str, Any]) -> str:
    line = (f"{r['source']} ({r['mode']}): fetched {r['fetched']}, unchanged {r['unchanged']}, "
            f"changed {r['changed']}, added {r['added']}, deleted {r['deleted']}, failed {r['failed']}; "
            f"embedded {r['chunks_embedded']} chunks in {r['seconds']:.1f}s")
    if r.get("deletions_skipped"):
        line += "\n  deletions skipped: the crawl had errors or could not see the whole source"
    for err in r.get("errors", [])[:5]:
        line += f"\n  ! {err}"
    return line


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@_handle_errors
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
            },
            "next_full": next_runs["full"], "next_incremental": next_runs["incremental"],
        })
    data = {"data_dir": str(services.data_dir), "backends": services.backend_names(), "sources": sources}
    _emit(data, as_json, _status_text)


def _ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _status_text(d: dict[str, Any]) -> str:
    lines = [f"data dir: {d['data_dir']}"]
    lines += [f"{k}: {v}" for k, v in d["backends"].items()]
    if not d["sources"]:
        lines.append("no sources yet: `ragqa ingest PATH_OR_URL`")
    for s in d["sources"]:
        last = s["last_run"]
        last_txt = f"{last['mode']} {last['status']} at {last['finished_at']}" if last else "never"
        lines.append(f"- {s['name']} [{s['kind']}, trust {s['trust']}] {s['location']}\n"
                     f"    {s['documents']} documents, {s['chunks']} chunks; last run: {last_txt}; "
                     f"next incremental {s['next_incremental']:%Y-%m-%d %H:%M}, "
                     f"next full {s['next_full']:%Y-%m-%d %H:%M}")
    return "\n".join(lines)


@cli.command()
@click.option("--run-now", is_flag=True, help="Run an incremental crawl of every source first.")
@click.pass_obj
@_handle_errors
def schedule(obj: Context, run_now: bool) -> None:
    """Run the scheduler in the foreground until interrupted (Ctrl-C)."""
    from ingest import scheduler as sched

    services = obj.services
    if run_now:
        for src in services.state.sources():
            sched._SERVICES = services
            sched.run_job(src.name, "incremental")
    scheduler = sched.build_scheduler(services)
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


@cli.command()
@click.argument("query")
@click.option("--k", "-k", default=5, show_default=True, type=click.IntRange(1, 1000))
@click.option("--source", "-s", "sources", multiple=True, help="Only these sources.")
@click.option("--since", help="Only documents modified on or after this ISO date.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@_handle_errors
def search(obj: Context, query: str, k: int, sources: tuple[str, ...], since: str | None,
           as_json: bool) -> None:
    """Search the indexed chunks (BM25 candidates reordered by vector similarity)."""
    from rag.filters import parse_filters
    from rag.search import search as run

    filters = parse_filters({"source": list(sources) or None, "modified_from": since})
    started = time.perf_counter()
    hits = run(obj.services, query, k=k, filters=filters)
    ms = (time.perf_counter() - started) * 1000
    rows = [{
        "rank": i + 1, "score": round(h.score, 4), "chunk_id": h.chunk_id, "doc_id": h.doc_id,
        "title": h.chunk.title if h.chunk else "", "url": h.chunk.url if h.chunk else "",
        "heading": h.chunk.heading if h.chunk else "", "text": h.chunk.text if h.chunk else "",
        "scores": {key: round(v, 4) for key, v in h.explain.items()},
    } for i, h in enumerate(hits)]
    _emit({"query": query, "ms": round(ms, 1), "hits": rows}, as_json, _search_text)


def _search_text(d: dict[str, Any]) -> str:
    if not d["hits"]:
        return f"no results for {d['query']!r}"
    out = []
    for h in d["hits"]:
        snippet = " ".join(h["text"].split())[:200]
        scores = ", ".join(f"{k} {v}" for k, v in h["scores"].items())
        out.append(f"[{h['rank']}] {h['title'] or h['doc_id']}  ({scores})\n    {h['url']}\n    {snippet}")
    out.append(f"({len(d['hits'])} results in {d['ms']} ms)")
    return "\n".join(out)


@cli.command("sources")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@_handle_errors
def sources_cmd(obj: Context, as_json: bool) -> None:
    """List registered sources."""
    rows = [s.model_dump(mode="json") for s in obj.services.state.sources()]
    _emit(rows, as_json, lambda rs: "\n".join(f"{r['name']}\t{r['kind']}\t{r['location']}" for r in rs)
          or "no sources")


def main() -> None:
    cli(prog_name="ragqa")


if __name__ == "__main__":  # pragma: no cover
    main()
