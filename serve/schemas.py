"""Request and response models of the HTTP API (they are also its OpenAPI schema).

The chat models follow OpenAI's chat completions API, so its clients work unchanged. Two
extensions, both optional: the request's ``rag`` object (filters, top_k, no_cache), and
``citations`` on the answer: on ``choices[0].message`` of a completion, and on
``choices[0].delta`` of the streamed chunk that carries ``finish_reason``. Unknown fields of
``rag`` and of its ``filters`` are refused (422 naming the field); other unknown top-level
fields are ignored, as OpenAI-compatible servers usually do.

Example::

    ChatCompletionRequest.model_validate({"model": "ragqa", "messages": [{"role": "user", "content": "Hi"}],
                                          "rag": {"filters": {"source": "docs"}, "top_k": 4}})
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag.errors import FilterError, RequestError
from rag.filters import parse_filters
from rag.types import Citation, Filters
from serve.errors import filter_param

__all__ = [
    "ErrorDetail", "ErrorResponse", "RagFilters", "RagOptions", "ChatMessage", "ChatCompletionRequest",
    "CitationOut", "ChatCompletion", "ChatCompletionChunk", "Usage", "AskRequest", "AskResponse",
    "HealthResponse", "ReadyResponse", "BackendState", "SourceOut", "DocumentOut", "ReindexResponse",
    "ModelList", "ERRORS",
]

Strings = str | list[str] | None


# -- errors ------------------------------------------------------------------------------
class ErrorDetail(BaseModel):
    message: str = Field(description="What went wrong, in one line meant for a person.")
    type: str = Field(description="invalid_request_error, not_found_error, conflict_error, "
                      "service_unavailable_error, timeout_error, server_error, ...")
    param: str | None = Field(description="The request field at fault, e.g. `rag.filters.colour`, `messages`.")
    code: str | None = Field(description="A stable machine-readable code, e.g. `unknown_field`, `too_large`.")


class ErrorResponse(BaseModel):
    """OpenAI's error shape; every non-2xx answer has it."""

    error: ErrorDetail


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("The body could not be decoded (not UTF-8, or JSON nested too deeply)."),
    401: _error("No API key, or an unknown one (`Authorization: Bearer <key>` or `X-API-Key`)."),
    403: _error("The key lacks this route's scope, or its filters name another tenant."),
    413: _error("The body is larger than `serve.max_body_bytes`."),
    422: _error("A field is invalid or unknown, or a limit is exceeded; `param` names the field."),
    429: _error("Too many requests for this key in the last minute; `Retry-After` says when to retry."),
    500: _error("A server bug or a configuration error."),
    503: _error("A backend (index, embedder, model) is unavailable."),
    504: _error("A backend did not answer in time."),
}
# the answer routes resume a stream named by Last-Event-ID
RESUME_ERRORS = {**ERRORS, 404: _error("`Last-Event-ID` names an unknown or expired stream.")}


# -- the rag extension ---------------------------------------------------------------------
class RagFilters(BaseModel):
    """Metadata filters; dates are ISO 8601 (or epoch seconds), ranges are inclusive."""

    model_config = ConfigDict(extra="forbid")

    source: Strings = Field(default=None, description="Only these sources.")
    tenant: str | None = None
    tags: Strings = Field(default=None, description="Documents with any of these tags.")
    lang: Strings = Field(default=None, description="Only these languages (en, zh, ...).")
    published_from: str | float | None = None
    published_to: str | float | None = None
    modified_from: str | float | None = None
    modified_to: str | float | None = None
    min_trust: str | int | None = Field(default=None, description="low, normal or high.")

    def parse(self, prefix: str) -> Filters:
        """Validate the values; a bad one raises ``FilterError`` with ``param`` set."""
        try:
            return parse_filters(self.model_dump(exclude_none=True))
        except FilterError as exc:
            exc.param = filter_param(exc, prefix)  # type: ignore[attr-defined]
            raise


class RagOptions(BaseModel):
    """ragqa's extension of the chat request."""

    model_config = ConfigDict(extra="forbid")

    filters: RagFilters | None = None
    top_k: int | None = Field(default=None, ge=1, le=200, description="Passages to retrieve.")
    no_cache: bool = Field(default=False, description="Skip the answer cache (no lookup, no store).")


# -- chat completions ----------------------------------------------------------------------
class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self, where: str) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        for j, part in enumerate(self.content):
            if part.type != "text":
                raise RequestError(f"{where}.content.{j}.type", f"only text content is supported, not {part.type!r}")
        return "".join(p.text or "" for p in self.content)


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat completion request, plus the optional ``rag`` object.

    The last message is the question and must come from the user; earlier user and
    assistant messages are the conversation. System messages are not passed on: ragqa's own
    system prompt keeps the answer to the retrieved sources.
    """

    model_config = ConfigDict(extra="ignore")

    model: str = Field(default="ragqa", description="Echoed back; the deployment has one model.")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = Field(default=None, description="Same as max_tokens (newer clients).")
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=1, description="Only 1.")
    user: str | None = Field(default=None, description="An end-user id, for logs.")
    rag: RagOptions | None = None

    def overrides(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p,
                "max_tokens": self.max_completion_tokens or self.max_tokens, "stop": self.stop, "seed": self.seed}


class CitationOut(BaseModel):
    """A numbered source; ``label`` is the ``[n]`` in the answer text."""

    label: int
    chunk_id: str
    doc_id: str
    title: str
    url: str
    modified: datetime | None = None
    snippet: str = ""
    inferred: bool = Field(default=False, description="The model did not write this label: ragqa added it after "
                           "a sentence that this passage supports (citations.infer).")

    @classmethod
    def of(cls, c: Citation) -> CitationOut:
        return cls(label=c.label, chunk_id=c.chunk_id, doc_id=c.doc_id, title=c.title, url=c.url,
                   modified=c.modified, snippet=c.snippet, inferred=c.inferred)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    citations: list[CitationOut] = Field(default_factory=list, description="Extension: the cited sources.")


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str = Field(description="The generator profile's model id when the deployment has profiles; else the "
                       "request's model, echoed.")
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None
    ragqa: dict[str, Any] | None = Field(default=None, description=(
        "Extension: the answer's versions (profile, model, quantization, prompt_version, route, arm) and its "
        "answer_id (POST /v1/feedback names it)."))


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    citations: list[CitationOut] | None = Field(default=None, description="Extension, on the last chunk.")
    cache: Literal["hit", "semantic", "miss"] | None = Field(
        default=None, description="Extension, on the last chunk: whether the answer came from the answer cache.")


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    """One streamed event (``data:`` line) of the chat route; the stream ends with ``[DONE]``."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    ragqa: dict[str, Any] | None = Field(default=None, description=(
        "Extension, on the chunk with finish_reason: the answer's versions and answer_id, as on a completion."))


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ragqa"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# -- native ask ----------------------------------------------------------------------------
class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1)
    filters: RagFilters | None = None
    conversation_id: str | None = Field(default=None, max_length=128,
                                        description="Continue this conversation (kept in memory).")
    stream: bool = False
    top_k: int | None = Field(default=None, ge=1, le=200)
    no_cache: bool = False


class AskResponse(BaseModel):
    answer: str
    citations: list[CitationOut]
    conversation_id: str
    timings: dict[str, float] = Field(description="Milliseconds per stage: embed_ms, retrieve_ms, rerank_ms, "
                                      "pack_ms, ttft_ms, generate_ms, total_ms, ...")
    cache: Literal["hit", "semantic", "miss"] = "miss"
    degraded: bool = Field(description="Part of the service was down (a retrieval index, the generator): "
                           "the answer came from what was left; `warnings` says what.")
    warnings: list[str] = Field(default_factory=list, description="What was missing from this answer, in words.")
    finish_reason: str | None = None
    usage: Usage
    answer_id: str | None = Field(default=None, description="This answer's id (POST /v1/feedback names it).")
    versions: dict[str, Any] | None = Field(default=None, description="The answer's provenance: profile (the generator profile that wrote it; extractive for the "
        "last fallback), model, quantization, prompt_version, route ({decision, reason} when routing chose the "
        "profile, else null) and arm (an experiment's, else null).")


# -- operations and admin ------------------------------------------------------------------
class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class BackendState(BaseModel):
    state: Literal["ready", "unavailable", "down"]
    backend: str
    detail: str | None = None


class ReadyResponse(BaseModel):
    status: Literal["ready", "degraded", "unavailable"]
    backends: dict[str, BackendState]


class SourceOut(BaseModel):
    name: str
    kind: str
    location: str
    trust: str
    tags: list[str]
    tenant: str | None
    documents: int
    chunks: int
    last_run: dict[str, Any] | None
    progress: dict[str, Any] | None = Field(default=None, description=(
        "While a reindex of the source runs: pages done and the total expected (total_grows: a site whose "
        "links are still being found), chunks embedded, chunks_per_s, elapsed_s and eta_s (null without a total)."))


class DocumentOut(BaseModel):
    id: str
    source: str
    url: str
    title: str | None
    lang: str | None
    modified: str | None
    published: str | None
    fetched_at: str | None
    text_hash: str | None
    chunks: list[dict[str, Any]]


class ReindexResponse(BaseModel):
    source: str
    mode: str
    fetched: int
    unchanged: int
    changed: int
    added: int
    deleted: int
    failed: int
    chunks_embedded: int
    chunks_reused: int
    chunks_deleted: int
    seconds: float
    complete: bool
    deletions_skipped: bool
    deletions_refused: int = 0
    answers_dropped: int = 0
    errors: list[str] = Field(description="The first 20 failures, each naming its URL.")
    error_kinds: dict[str, int] = Field(default_factory=dict, description=(
        "Every failed URL, by kind: timeout, slow, connection, http, too_large, redirects, robots, unreadable, "
        "no_text, io."))
