"""``ragqa serve`` (the HTTP service) and ``ragqa ask`` (the same answer pipeline, no HTTP)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from typing import Any

import click

from ragqa.cli.common import Context, handle_errors

__all__ = ["ask", "serve"]


@click.command()
@click.option("--host", "-H", help="Address to listen on (default: serve.host, 127.0.0.1).")
@click.option("--port", "-p", type=click.IntRange(0, 65535), help="Port (default: serve.port, 8000; 0 picks one).")
@click.option("--workers", "-w", type=click.IntRange(1, 64), help="Worker processes (default: serve.workers, 1).")
@click.option("--with-scheduler", is_flag=True, help="Also run the crawl schedule (as `ragqa schedule` does).")
@click.option("--no-auth", is_flag=True, help="No API keys (serve.auth: false); loopback only unless --allow-insecure.")
@click.option("--allow-insecure", is_flag=True, help="Serve on a non-loopback host with auth off anyway.")
@click.option("--loop", type=click.Choice(["auto", "asyncio", "uvloop"]), default="auto", show_default=True,
              help="Event loop; auto is uvloop when installed (uvicorn[standard]).")
@click.option("--http", type=click.Choice(["auto", "h11", "httptools"]), default="auto", show_default=True,
              help="HTTP/1.1 parser; auto is httptools when installed (uvicorn[standard]).")
@click.pass_obj
@handle_errors
def serve(obj: Context, host: str | None, port: int | None, workers: int | None, with_scheduler: bool,
          no_auth: bool, allow_insecure: bool, loop: str, http: str) -> None:
    """Serve the OpenAI-compatible and native question-answering API until interrupted.

    Requests need an API key from serve.api_keys (`ragqa keys create`) unless auth is off.
    The event loop and HTTP parser in use are named on stderr at start-up.
    """
    services = obj.services
    cfg = services.settings.serve
    host, port, workers = host or cfg.host, cfg.port if port is None else port, workers or cfg.workers
    # Set before anything loads prometheus_client, so this process's scheduler writes there too.
    metrics_dir = _multiprocess_metrics_dir() if workers > 1 else None
    try:
        import uvicorn

        from serve.auth import check_exposure

        # The worker count goes into the settings too: each worker reads serve.workers (the QA log
        # then takes a file per process, qa-{pid}.jsonl, since each rotates its own).
        forced = {"host": host, "auth": cfg.auth and not no_auth,
                  "allow_insecure_public": cfg.allow_insecure_public or allow_insecure, "workers": workers}
        check_exposure(cfg.model_copy(update=forced))  # one line, before anything is loaded or bound
        settings = services.settings.model_copy(update={"serve": cfg.model_copy(update=forced)})
        level = "warning" if obj.verbose == 0 else "info" if obj.verbose == 1 else "debug"
        impl = {"loop": loop, "http": http}
        if workers == 1:  # the schedule runs in the app's lifespan, so it stops before the process does
            from serve.app import create_app

            app = create_app(settings, services=services, with_scheduler=with_scheduler)
            _listening_server(uvicorn.Config(app, host=host, port=port, log_level=level,
                                             timeout_graceful_shutdown=10, **impl)).run()  # type: ignore[arg-type]
            return
        _serve_workers(obj, settings, forced, workers, with_scheduler, host, port, level, impl)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _multiprocess_metrics_dir() -> str:
    """A fresh directory for prometheus_client's multiprocess mode, set in the environment that
    the workers inherit: every process writes its metrics there and a scrape of any worker sums
    them (serve/metrics_scrape.py). Fresh per start, so no count survives from an earlier server;
    under $PROMETHEUS_MULTIPROC_DIR when that is set (e.g. a tmpfs), else the temp directory."""
    import tempfile

    parent = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
    if parent:
        os.makedirs(parent, exist_ok=True)
    path = tempfile.mkdtemp(prefix="ragqa-metrics-", dir=parent)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def _serve_workers(obj: Context, settings: Any, forced: dict[str, Any], workers: int, with_scheduler: bool,
                   host: str, port: int, level: str, impl: dict[str, str]) -> None:
    import uvicorn

    services = obj.services
    # Each worker builds its own app from the same settings, passed on in the environment.
    if obj.config:
        os.environ["RAG_CONFIG"] = str(obj.config)
    os.environ["RAG_DATA_DIR"] = str(services.data_dir)
    for name, value in forced.items():
        os.environ[f"RAG_SERVE__{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    resume = "any worker" if settings.serve.redis_url else "the worker that started them"
    click.echo(f"ragqa: starting {workers} workers; streams resume on {resume}, "
               "and /metrics sums every worker's metrics", err=True)
    scheduler = None
    if with_scheduler:  # once, in this supervising process, not in every worker
        from ingest import scheduler as sched

        scheduler = sched.build_scheduler(services)
        sched.start(scheduler, services)
    try:
        _announce(host, port, impl["loop"], impl["http"])
        uvicorn.run("serve.app:create_app", factory=True, host=host, port=port, workers=workers,
                    log_level=level, timeout_graceful_shutdown=10, **impl)  # type: ignore[arg-type]
    finally:
        if scheduler is not None:
            scheduler.shutdown(wait=True)


def _announce(host: str, port: int, loop: str, http: str) -> None:
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"ragqa is serving on http://{shown}:{port} - point a browser at http://{shown}:{port}/ "
               f"to chat (API docs: /docs; OpenAI-compatible base URL: http://{shown}:{port}/v1)")
    sys.stdout.flush()
    click.echo(f"ragqa: event loop {_resolve(loop, 'uvloop', 'asyncio')}, "
               f"HTTP {_resolve(http, 'httptools', 'h11')}", err=True)


def _resolve(choice: str, fast: str, fallback: str) -> str:
    """What uvicorn's ``auto`` picks: ``fast`` when it can be imported (uvicorn.loops.auto,
    uvicorn.protocols.http.auto), else ``fallback``."""
    if choice != "auto":
        return choice
    import importlib.util

    return fast if importlib.util.find_spec(fast) is not None else f"{fallback} ({fast} is not installed)"


def _listening_server(config: Any) -> Any:
    """A uvicorn server that says where to point a browser once it listens (with the real port)."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started and self.servers:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                _announce(host, port, self.config.loop, self.config.http)  # type: ignore[arg-type]

    return Server(config)


@click.command()
@click.argument("question")
@click.option("--source", "-s", "sources", multiple=True, help="Only these sources.")
@click.option("--since", help="Only documents modified on or after this ISO date.")
@click.option("--k", "-k", "top_k", type=click.IntRange(1, 200), help="Passages to retrieve (default: retrieval.top_k).")
@click.option("--stream", is_flag=True, help="Print the answer as it is generated (with --json: one event per line).")
@click.option("--json", "as_json", is_flag=True, help="Print the answer, citations and timings as JSON.")
@click.pass_obj
@handle_errors
def ask(obj: Context, question: str, sources: tuple[str, ...], since: str | None, top_k: int | None,
        stream: bool, as_json: bool) -> None:
    """Answer QUESTION from the indexed documents, with numbered citations ('-' reads stdin)."""
    from rag.filters import parse_filters

    if question == "-":
        question = sys.stdin.read()
    if not question.strip():
        raise click.UsageError("the question is empty")
    filters = parse_filters({"source": list(sources) or None, "modified_from": since})
    asyncio.run(_ask(obj, question.strip(), filters, top_k, stream, as_json))


async def _ask(obj: Context, question: str, filters: Any, top_k: int | None, stream: bool, as_json: bool) -> None:
    from rag.answer import Answerer
    from rag.errors import GeneratorError

    answerer = Answerer(obj.services)
    parts: list[str] = []
    try:
        async for event in answerer.stream(question, filters=filters, top_k=top_k):
            if stream and as_json:
                click.echo(json.dumps(_event_dict(event), ensure_ascii=False, default=str))
            elif event.kind == "delta":
                parts.append(event.text)
                if stream and not as_json:
                    click.echo(event.text, nl=False)
                    sys.stdout.flush()
            if event.kind == "error":
                raise GeneratorError(event.error or "generation failed")
            if event.kind == "done" and not (stream and as_json):
                _print_done(question, "".join(parts).strip(), event, as_json, printed=stream)
    finally:
        await answerer.close()


def _event_dict(event: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"event": event.kind}
    if event.kind == "delta":
        out["text"] = event.text
    elif event.kind in ("sources", "done"):
        out["citations"] = [_citation(c) for c in event.citations]
        out["degraded"] = event.degraded
        out["warnings"] = list(event.warnings)
    if event.kind == "done":
        out.update(finish_reason=event.finish_reason, usage=event.usage, timings=event.timings,
                   cache=event.cache or "miss")
    if event.kind == "error":
        out["error"] = event.error
    return out


def _citation(c: Any) -> dict[str, Any]:
    return {"label": c.label, "chunk_id": c.chunk_id, "doc_id": c.doc_id, "title": c.title, "url": c.url,
            "modified": c.modified.isoformat() if c.modified else None, "snippet": c.snippet}


def _print_done(question: str, text: str, done: Any, as_json: bool, printed: bool) -> None:
    if as_json:
        click.echo(json.dumps({"question": question, "answer": text, "citations": [_citation(c) for c in done.citations],
                               "timings": done.timings, "cache": done.cache or "miss", "degraded": done.degraded,
                               "warnings": list(done.warnings), "finish_reason": done.finish_reason, "usage": done.usage}, ensure_ascii=False))
        return
    if printed:
        click.echo()
    else:
        click.echo(text)
    if done.citations:
        click.echo("\nSources:")
        for c in done.citations:
            click.echo(f"[{c.label}] {c.title or c.doc_id}  {c.url}")
    for warning in done.warnings:
        click.echo(f"note: {warning}", err=True)
