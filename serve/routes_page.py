"""The web chat page: ``GET /`` and its files under ``/static/`` (plain HTML, JS and CSS, no build step).

The page (``serve/static/app.js``) asks with ``fetch`` (``POST /v1/ask``, ``stream: true``)
and reads the SSE stream from the response body with a small parser of its own, since
``EventSource`` cannot send a POST. When the connection drops before the ``done`` or
``error`` event, it resumes with ``GET /v1/streams/{stream_id}`` and ``Last-Event-ID``, the
id of the last event it handled, with a growing pause between attempts; the server sends
only the events after it, and the page also ignores any event whose seq it has already
seen. The stop button aborts the fetch and does not come back, so the server aborts the
generation once ``serve.disconnect_grace_s`` has passed.

The sources filter is filled from ``GET /v1/sources``; where that is refused (a key
without the scope it needs) the page asks across all sources. An API key, if the server
wants one, is typed into the page and kept in the tab's ``sessionStorage``.

The page and its files need no key: they hold no data. Every response of the page sets a
content security policy allowing only this origin's scripts, styles and connections.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["STATIC", "install", "router"]

STATIC = Path(__file__).with_name("static")
# Answers and citations are untrusted text from crawled documents: the page only ever sets
# them as text, and this policy would stop an injected script or a foreign connection.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
       "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8", headers={
        "Cache-Control": "no-cache", "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer"})


def install(app: FastAPI) -> None:
    """Serve the page at ``/`` and its files at ``/static/``."""
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
