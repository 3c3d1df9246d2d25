"""The FastAPI application: wiring only. Routes live in ``serve/routes_*.py``.

``create_app`` builds the app state (services, answerer, stream manager) and a lifespan
that loads the generator before the first request and aborts running streams on shutdown.
A generator that cannot start is reported by ``/ready``; answers then fall back to the
extractive answerer, unless ``generator.fallback`` is off, in which case start-up fails.

Example::

    app = create_app(Settings.load())
    uvicorn.run(app, host="127.0.0.1", port=8000)

    # several workers: uvicorn imports the factory (settings from RAG_* and RAG_CONFIG)
    uvicorn.run("serve.app:create_app", factory=True, workers=4)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

from ingest.services import open_services
from rag.admission import admission_for
from rag.answer import Answerer
from rag.config import Settings
from rag.errors import RagError
from rag.services import Services
from serve.auth import Gate, check_exposure
from serve.conversations import make_conversations
from serve.deps import AppState, GeneratorHealth
from serve.errors import install_handlers
from serve.limits import BodyLimit
from serve.metrics import RequestMetrics
from serve.metrics_scrape import worker_exit
from serve.qa_log import QALog
from serve.redis_streams import make_stream_store
from serve.routes_experiments import Experiments
from serve.schemas import ChatCompletionChunk
from serve.streams import StreamManager

__all__ = ["create_app"]

log = logging.getLogger("ragqa.serve")


def create_app(settings: Settings | None = None, services: Services | None = None,
               answerer: Answerer | None = None, *, with_scheduler: bool = False) -> FastAPI:
    """The service over ``services`` (built from ``settings`` when not given, and then closed
    at shutdown), answering with ``answerer`` (default: ``Answerer(services)``).

    ``with_scheduler`` also runs the crawl schedule in this process while the app runs (use
    it with one worker; with several, run it once beside them, as ``ragqa serve`` does).
    """
    owned = services is None and answerer is None
    if services is None:
        services = answerer.services if answerer is not None else open_services(settings or Settings.load())
    settings = settings or services.settings
    serve = settings.serve
    check_exposure(serve)  # before anything is loaded: no auth on a public address unless forced
    answerer = answerer or Answerer(services)
    if answerer.admission is None:
        answerer.admission = admission_for(settings)
    state = AppState(settings=settings, services=services, answerer=answerer,
                     streams=StreamManager(make_stream_store(serve), serve.disconnect_grace_s),
                     conversations=make_conversations(serve), gate=Gate(serve))
    state.qa_log = QALog.from_settings(settings)  # None when serve.qa_log is off

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await asyncio.to_thread(_warm, services)
        state.generator = await _start_generator(answerer, settings.generator.fallback)
        scheduler = _start_scheduler(services) if with_scheduler else None
        try:
            yield
        finally:
            if scheduler is not None:
                await asyncio.to_thread(scheduler.shutdown, True)  # waits for a running crawl
            await state.streams.close()
            await state.gate.aclose()
            if hasattr(state.streams.store, "aclose"):  # the Redis store's connections
                await state.streams.store.aclose()
            if hasattr(state.conversations, "aclose"):
                await state.conversations.aclose()
            if answerer.admission is not None and answerer.admission.global_slots is not None:
                await answerer.admission.global_slots.aclose()
            await answerer.close()
            if state.qa_log is not None:
                state.qa_log.close()
            await app.state.experiments.aclose()
            if owned:
                services.close()
            worker_exit()  # with several workers: this one's in-flight gauges leave the sums

    app = FastAPI(title="ragqa", version="0.1.0", lifespan=lifespan,
                  summary="Question answering over your documents, with citations. OpenAI-compatible.")
    app.state.ragqa = state
    app.state.experiments = Experiments(settings)  # the A/B split every worker follows, and answer records
    install_handlers(app)
    from serve import (
        routes_admin,
        routes_ask,
        routes_cache,
        routes_chat,
        routes_experiments,
        routes_feedback,
        routes_ops,
    )

    routers = [module.router for module in (routes_chat, routes_ask, routes_admin, routes_cache, routes_ops,
                                            routes_experiments, routes_feedback)]
    for router in routers:
        app.include_router(router)
    from serve import routes_page

    routes_page.install(app)  # the web chat page at / and its files at /static/
    app.add_middleware(BodyLimit, max_bytes=serve.max_body_bytes)
    app.add_middleware(RequestMetrics, routes=[route for router in routers for route in router.routes])
    _document_stream_schemas(app)
    return app


def _warm(services: Services) -> None:
    """Load the embedder and open the indexes now rather than on the first question."""
    for name in ("embedder", "lexical", "vector"):
        try:
            component = getattr(services, name)
            if name == "embedder" and hasattr(component, "load"):
                component.load()  # the model itself, not only the object
        except Exception as exc:  # noqa: BLE001 - reported by /ready and by the first question
            log.warning("%s not ready at start-up: %s", name, exc)


def _start_scheduler(services: Services) -> Any:
    from ingest import scheduler as sched

    scheduler = sched.build_scheduler(services)
    jobs = sched.start(scheduler, services)
    log.info("crawl schedule running: %s", ", ".join(jobs) or "no sources yet")
    return scheduler


async def _start_generator(answerer: Answerer, fallback: bool) -> GeneratorHealth:
    try:
        await answerer.warm()  # loads the model and reads the system messages once
    except RagError as exc:
        if not fallback:
            raise
        log.warning("generator %s unavailable, answers will be extractive: %s", answerer.generator.name, exc)
        return GeneratorHealth("down", str(exc))
    return GeneratorHealth("ready", None)


def _document_stream_schemas(app: FastAPI) -> None:
    """Add the streamed chunk's schema to the OpenAPI components (routes refer to it)."""
    default = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = default()
            extra = ChatCompletionChunk.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(extra.pop("$defs", {}))
            components["ChatCompletionChunk"] = extra
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
