"""Operations: ``GET /health`` (liveness), ``GET /ready`` (each backend), ``GET /metrics``.

``/ready`` is 200 when the indexes answer and the generator is up (``status: ready``), or
when one index is unavailable (answers come from the other, flagged degraded) or the generator
is down with the extractive fallback on (``status: degraded``); 503 when both indexes are
unavailable, or the generator is down without a fallback. Each other generator profile
(``profiles.*``) that has been started or tried is a ``profile:<name>`` backend, ``ready`` or
``down`` as its last start or answer found it; one that is down makes the status ``degraded``
(its answers fall back to the next profile, then extractive).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from serve.deps import State
from serve.metrics_scrape import scrape
from serve.schemas import ERRORS, BackendState, HealthResponse, ReadyResponse

__all__ = ["router"]

router = APIRouter(tags=["operations"])
CHECK_TIMEOUT_S = 5.0


@router.get("/health", response_model=HealthResponse, responses={500: ERRORS[500]}, summary="Liveness: the process answers")
async def health() -> HealthResponse:
    return HealthResponse()


async def _check(name: str, backend: str, count: Callable[[], int]) -> BackendState:
    try:
        n = await asyncio.wait_for(asyncio.to_thread(count), CHECK_TIMEOUT_S)
    except TimeoutError:
        return BackendState(state="unavailable", backend=backend, detail=f"no answer in {CHECK_TIMEOUT_S:g} s")
    except Exception as exc:  # noqa: BLE001 - any failure means not ready; say which
        return BackendState(state="unavailable", backend=backend, detail=" ".join(str(exc).split())[:300])
    return BackendState(state="ready", backend=backend, detail=f"{n} chunks")


@router.get("/ready", response_model=ReadyResponse,
            responses={500: ERRORS[500], 503: {"model": ReadyResponse, "description": "A backend is unavailable."}},
            summary="Readiness: the state of the lexical index, the vector index and the generator")
async def ready(state: State) -> Any:
    services = state.services
    names = services.backend_names()
    lexical, vector = await asyncio.gather(
        _check("lexical", names["lexical"], lambda: services.lexical.count()),
        _check("vector", names["vector"], lambda: services.vector.count()))
    gen = state.generator
    health = state.answerer.profiles.health()
    default_down = health.get("default", ("ready", None))[0] == "down"  # its last start failed
    generator = BackendState(state="ready" if gen.state == "ready" and not default_down else "down",
                             backend=state.answerer.generator.name,
                             detail=health["default"][1] if default_down else gen.detail)
    profiles = {f"profile:{name}": BackendState(state="ready" if up == "ready" else "down",
                                                 backend=state.answerer.profiles.describe(name)["model"] or name,
                                                 detail=detail)
                for name, (up, detail) in sorted(health.items()) if name != "default"}
    fallback = state.settings.generator.fallback
    indexes = (lexical.state, vector.state)
    if indexes == ("unavailable", "unavailable") or (generator.state == "down" and not fallback):
        status = "unavailable"
    elif "unavailable" in indexes or generator.state == "down" or any(
            p.state == "down" for p in profiles.values()):  # answers come from what is left
        status = "degraded"
    else:
        status = "ready"
    body = ReadyResponse(status=status, backends={"lexical": lexical, "vector": vector, "generator": generator,
                                                  **profiles})
    return JSONResponse(body.model_dump(mode="json"), status_code=503 if status == "unavailable" else 200)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics",
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text format."},
                       500: ERRORS[500]})
async def metrics(state: State) -> Response:
    body = await asyncio.to_thread(scrape, state.services)  # reads the state DB (and worker files)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
