"""The answer cache (admin): ``GET /v1/cache`` and ``POST /v1/cache/purge``, as ``ragqa cache``.

The stats are this server's cache (with ``cache.backend: memory``, this worker's); a purge is
logged in the state database, so every server on the data directory applies it at its next
question, and applied here at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field, model_validator

from ingest.services import state_db
from rag.errors import ConfigError, RequestError
from serve.deps import AdminCaller, State
from serve.errors import NotFound
from serve.schemas import ERRORS

__all__ = ["router"]

router = APIRouter(tags=["cache"])


class CacheStats(BaseModel):
    backend: str = Field(description="memory, redis or off.")
    entries: int = 0
    bytes: int = Field(0, description="What the entries take (memory: their JSON and vectors; redis: MEMORY USAGE).")
    generation: int = Field(0, description="The store's clock: it moves at every applied change.")
    lookups: dict[str, int] = Field(default_factory=dict, description="hit, semantic, miss.")
    rechecks: dict[str, int] = Field(
        default_factory=dict, description="Answers checked again after their sources gained documents: kept, stale.")
    dropped: int = Field(0, description="Answers dropped because their passages changed, or by purges.")
    changes: dict[str, Any] = Field(description="The state database's change log over the last 24 hours.")


class PurgeRequest(BaseModel):
    model_config = {"extra": "forbid"}

    source: str | None = Field(None, description="Drop the answers built from this source.")
    all: bool = Field(False, description="Drop every cached answer.")

    @model_validator(mode="after")
    def _one(self) -> PurgeRequest:
        if bool(self.source) == self.all:
            raise ValueError("give one of source or all: true")
        return self


class PurgeResult(BaseModel):
    purged: str = Field(description="The source, or all.")
    change: int = Field(description="The purge's number in the change log.")
    dropped: int = Field(description="Answers this server's cache dropped.")


@router.get("/v1/cache", response_model=CacheStats, responses=ERRORS, summary="Answer cache statistics (admin)")
async def cache_stats(state: State, caller: AdminCaller) -> CacheStats:
    layer = state.answerer.cache
    changes = state_db(state.services).change_summary()
    if layer is None:
        return CacheStats(backend="off", changes=changes)
    stats = await asyncio.to_thread(layer.stats)
    return CacheStats(**{k: v for k, v in stats.items() if k in CacheStats.model_fields}, changes=changes)


@router.post("/v1/cache/purge", response_model=PurgeResult,
             responses={**ERRORS, 404: {"description": "No such source."}}, summary="Drop cached answers (admin)")
async def cache_purge(body: PurgeRequest, state: State, caller: AdminCaller) -> PurgeResult:
    db = state_db(state.services)
    if body.source:
        try:
            db.source(body.source)
        except ConfigError as exc:
            raise NotFound("source", str(exc)) from None
    layer = state.answerer.cache
    if layer is None:
        raise RequestError("cache", "the answer cache is off (cache.backend: off)")

    def run() -> PurgeResult:
        seq = db.log_purge(body.source)
        return PurgeResult(purged=body.source or "all", change=seq, dropped=layer.sync())

    return await asyncio.to_thread(run)
