"""Every error the service returns has OpenAI's shape, from one place.

``{"error": {"message", "type", "param", "code"}}`` with a status code that says what to do:
fix the request (4xx) or try again later (503, 504). ``RagError`` subclasses map to codes in
:data:`STATUS`; pydantic validation errors name the field in ``param`` (``rag.filters.colour``);
anything unexpected is a 500 whose message hides the internals (the traceback is logged).

Example::

    raise NotFound("document", "document 'docs:a.md' not found")   # -> 404, param "document"
"""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rag.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    ConfigError,
    DataDirLocked,
    EmbedderError,
    FilterError,
    GeneratorError,
    IngestError,
    Overloaded,
    RagError,
    RequestError,
    RerankerError,
)
from rag.filters import FILTER_FIELDS

__all__ = ["NotFound", "ClientGone", "Refused", "Unauthorized", "Forbidden", "RateLimited", "error_body",
           "status_of", "install_handlers", "filter_param"]

log = logging.getLogger("ragqa.serve")


class NotFound(RagError):
    """A named thing (document, source, stream) does not exist; ``param`` names what."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class ClientGone(RagError):
    """The client disconnected before its answer was ready; the work was cancelled."""


class Refused(RagError):
    """A request the caller may not make (now): the base of the 401, 403 and 429 answers.

    ``code`` is the stable error code; ``headers`` go on the response (``WWW-Authenticate``,
    ``Retry-After``).
    """

    def __init__(self, message: str, code: str, headers: dict[str, str] | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.headers, self.param = code, headers or {}, param


class Unauthorized(Refused):
    """No API key, or one that is not configured (401)."""


class Forbidden(Refused):
    """A valid key without the scope, or asking for another tenant's documents (403)."""


class RateLimited(Refused):
    """The key (or client address) made too many requests in the window (429)."""


# Most specific first: the first class in an error's MRO that is listed wins.
STATUS: dict[type[RagError], tuple[int, str, str]] = {
    Unauthorized: (401, "invalid_request_error", "invalid_api_key"),
    Forbidden: (403, "permission_error", "forbidden"),
    RateLimited: (429, "rate_limit_exceeded", "rate_limit_exceeded"),
    NotFound: (404, "not_found_error", "not_found"),
    ClientGone: (499, "client_closed_request", "client_gone"),
    RequestError: (422, "invalid_request_error", "invalid_value"),
    FilterError: (422, "invalid_request_error", "invalid_filter"),
    DataDirLocked: (409, "conflict_error", "data_dir_locked"),
    Overloaded: (503, "service_unavailable_error", "overloaded"),
    BackendTimeout: (504, "timeout_error", "backend_timeout"),
    BackendUnavailable: (503, "service_unavailable_error", "backend_unavailable"),
    BackendError: (503, "service_unavailable_error", "backend_error"),
    GeneratorError: (503, "service_unavailable_error", "generator_error"),
    EmbedderError: (503, "service_unavailable_error", "embedder_error"),
    RerankerError: (503, "service_unavailable_error", "reranker_error"),
    IngestError: (502, "upstream_error", "ingest_error"),
    ConfigError: (500, "server_error", "config_error"),
    RagError: (500, "server_error", "internal_error"),
}


def error_body(message: str, type_: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def status_of(exc: RagError) -> tuple[int, str, str]:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return STATUS[RagError]


def filter_param(exc: FilterError, prefix: str) -> str:
    """``FilterError`` messages start with the field they are about; name it as a param."""
    text = str(exc)
    for name in FILTER_FIELDS:
        if text.startswith((name, f"unknown filter field '{name}'")):
            return f"{prefix}.{name}"
    if text.startswith("unknown filter field '"):
        return f"{prefix}.{text.split(chr(39))[1]}"
    return prefix


def rag_error_response(exc: RagError) -> JSONResponse:
    status, type_, code = status_of(exc)
    param = getattr(exc, "field", None) or getattr(exc, "param", None)
    if param is None and isinstance(exc, FilterError):
        param = filter_param(exc, "filters")
    if status in (500, 502):  # 503/504 are a backend's state, reported by /ready
        log.error("request failed: %s", exc)
    if isinstance(exc, Refused):
        return JSONResponse(error_body(str(exc), type_, param, exc.code), status_code=status, headers=exc.headers)
    if isinstance(exc, Overloaded):
        return JSONResponse(error_body(str(exc), type_, param, code), status_code=status,
                            headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})
    return JSONResponse(error_body(str(exc), type_, param, code), status_code=status)


def _loc(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts)


def validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": "value_error"}
    param = _loc(tuple(first.get("loc", ())))
    kind = first.get("type", "")
    if kind == "json_invalid":
        message, param = f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}", None  # type: ignore[assignment, union-attr]
    elif kind == "extra_forbidden":
        known = ""
        if ".filters." in f".{param}" or param.startswith("filters."):
            known = f"; known filter fields: {', '.join(FILTER_FIELDS)}"
        message = f"{param}: unknown field{known}"
    else:
        message = f"{param}: {first.get('msg', 'invalid')}" if param else str(first.get("msg", "invalid request"))
    if len(errors) > 1:
        message += f" (+{len(errors) - 1} more)"
    code = "unknown_field" if kind == "extra_forbidden" else kind or None
    return JSONResponse(error_body(message, "invalid_request_error", param or None, code), status_code=422)  # type: ignore[arg-type]


def _unparsable_body(exc: StarletteHTTPException) -> tuple[str, str] | None:
    """FastAPI's 400 for a JSON body it could not decode says only "There was an error
    parsing the body"; name the cause it chains (bad UTF-8, nesting too deep for the parser)."""
    cause = exc.__cause__
    if exc.status_code != 400 or cause is None:
        return None
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not valid UTF-8: {cause.reason} at byte {cause.start}", "invalid_encoding"
    if isinstance(cause, RecursionError):
        return "the body's JSON is nested too deeply to parse", "json_too_deep"
    return f"the body could not be parsed: {type(cause).__name__}", "invalid_body"


def install_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every failure into OpenAI's error shape."""

    @app.exception_handler(RagError)
    async def _rag(request: Request, exc: RagError) -> JSONResponse:
        return rag_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        type_ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message, code = _unparsable_body(exc) or (str(exc.detail), None)
        return JSONResponse(error_body(message, type_, None, code), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(error_body(f"internal error ({type(exc).__name__}); see the server log",
                                       "server_error", None, "internal_error"), status_code=500)
