"""Sources and documents: ``GET /v1/sources``, ``POST /v1/sources/{name}/reindex`` (admin),
``GET /v1/documents/{doc_id}`` (admin, for debugging what was indexed).

A reindex runs :func:`ingest.pipeline.reindex` in a worker thread under the data
directory's write lock; while another run (the scheduler, a CLI ``reindex``) holds it, the
answer is 409.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, Query

from ingest.services import state_db
from rag.errors import ConfigError
from serve.deps import AdminCaller, QueryCaller, State
from serve.errors import NotFound
from serve.schemas import ERRORS, DocumentOut, ErrorResponse, ReindexResponse, SourceOut

__all__ = ["router"]

router = APIRouter(tags=["sources"])
_404 = {404: {"model": ErrorResponse, "description": "No such source or document."}}


def _ts(epoch: float | None) -> str | None:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds") if epoch else None


@router.get("/v1/sources", response_model=list[SourceOut], responses=ERRORS, summary="Registered sources")
def sources(state: State, caller: QueryCaller) -> list[SourceOut]:
    db = state_db(state.services)
    out = []
    for src in db.sources():
        if caller.tenant is not None and src.tenant != caller.tenant:
            continue
        docs, chunks = db.counts(src.name)
        last = db.last_run(src.name)
        out.append(SourceOut(
            name=src.name, kind=src.kind, location=src.location, trust=src.trust.name, tags=list(src.tags),
            tenant=src.tenant, documents=docs, chunks=chunks,
            last_run=None if last is None else {"mode": last["mode"], "status": last["status"],
                                                "finished_at": _ts(last["finished_at"])},
            progress=None if last is None else last.get("progress")))
    return out


@router.post("/v1/sources/{name}/reindex", response_model=ReindexResponse,
             responses={**ERRORS, **_404, 409: {"model": ErrorResponse,  # type: ignore[dict-item]
                                                "description": "Another reindex holds the data directory."}},
             summary="Crawl a source now and update the indexes (admin)")
async def reindex_source(name: str, state: State, caller: AdminCaller,
                         mode: Literal["full", "incremental"] = Query("incremental"),
                         allow_mass_delete: bool = Query(
                             False, description="Delete what the crawl no longer saw even when it is more than "
                             "crawl.max_delete_fraction of the source.")) -> dict[str, Any]:
    from ingest.pipeline import reindex

    services = state.services

    def run() -> dict[str, Any]:
        try:
            state_db(services).source(name)
        except ConfigError as exc:
            raise NotFound("name", str(exc)) from None
        with services.write_lock():
            return reindex(services, name, mode, allow_mass_delete=allow_mass_delete).as_dict()

    return await asyncio.to_thread(run)


@router.get("/v1/documents/{doc_id:path}", response_model=DocumentOut, responses={**ERRORS, **_404},  # type: ignore[dict-item]
            summary="One indexed document and its chunks (admin)")
def document(doc_id: str, state: State, caller: AdminCaller) -> DocumentOut:
    db = state_db(state.services)
    row = db.document_row(doc_id)
    if row is None:
        raise NotFound("doc_id", f"document {doc_id!r} not found")
    chunks = sorted(db.get_chunks(list(db.chunk_hashes(doc_id))).values(), key=lambda c: c.ordinal)
    return DocumentOut(
        id=row["id"], source=row["source"], url=row["url"], title=row.get("title"), lang=row.get("lang"),
        modified=row.get("modified"), published=row.get("published"), fetched_at=row.get("fetched_at"),
        text_hash=row.get("text_hash"),
        chunks=[{"id": c.id, "ordinal": c.ordinal, "heading": c.heading, "hash": c.hash, "lang": c.lang,
                 "tags": list(c.tags), "text": c.text} for c in chunks])
