"""``POST /v1/chat/completions``, OpenAI-compatible, and ``GET /v1/models``.

Streams are ``chat.completion.chunk`` events ending with ``data: [DONE]``; each has
``id: <stream_id>:<seq>``, and the completion id is ``chatcmpl-<stream_id>``. The first chunk
carries the role, the last one ``finish_reason`` and the extension ``delta.citations``;
with ``stream_options.include_usage`` a chunk with ``usage`` and no choices follows. An
error after the stream started is a ``data: {"error": {...}}`` event, then ``[DONE]``.

**Cache**: the response header ``X-Cache`` (and the extension ``delta.cache`` on the last
chunk) says whether the answer came from the answer cache: ``hit``, ``semantic`` or ``miss``.
``rag.no_cache: true`` skips the cache.

**Degraded**: when part of the service was down (a retrieval index, the generator) the answer
comes from what was left, and says so: the header ``X-Degraded`` (the reasons) on a
non-streamed answer, ``delta.degraded`` and ``delta.warnings`` on the last streamed chunk.

**Versions**: ``ragqa`` (an extension: on a completion, and on the streamed chunk with
``finish_reason``) holds the answer's versions (profile, model, quantization, prompt_version,
route, arm) and its ``answer_id``. With generator profiles configured, ``model`` is the model id
of the profile that answers (a cascade that escalates changes it on the later chunks); a
deployment with the one ``generator`` echoes the request's ``model``.

**Resume**: re-send the same request with the header ``Last-Event-ID: <stream_id>:<n>``,
where ``<n>`` is the number of events already received (``stream_id`` is the completion id
without ``chatcmpl-``, or the ``X-Stream-Id`` response header). With OpenAI's client::

    client.chat.completions.create(..., stream=True, extra_headers={"Last-Event-ID": f"{sid}:{n}"})

The body is validated but not used again: the stream continues where it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response

from rag.answer import AnswerEvent
from rag.config import ServeSettings
from rag.errors import RequestError
from rag.types import Filters
from serve.answers import (
    collect,
    counted,
    observed,
    resume,
    sse_response,
    until_disconnected,
)
from serve.deps import QueryCaller, State
from serve.errors import error_body
from serve.limits import check_messages, check_question
from serve.routes_experiments import Ab, chat_conversation
from serve.schemas import (
    ERRORS,
    RESUME_ERRORS,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionRequest,
    Choice,
    CitationOut,
    ModelCard,
    ModelList,
    Usage,
)
from serve.streams import Out

__all__ = ["router"]

router = APIRouter(tags=["chat"])
STARTED = int(time.time())

_STREAM_DOC = {
    "description": "A completion, or with `stream: true` an SSE stream of `chat.completion.chunk` objects "
                   "(each with `id: <stream_id>:<seq>`) ending with `data: [DONE]`.",
    "content": {"text/event-stream": {"schema": {"$ref": "#/components/schemas/ChatCompletionChunk"}}},
}


def conversation(body: ChatCompletionRequest, limits: ServeSettings) -> tuple[str, list[dict[str, str]]]:
    """The question (the last message, the user's) and the earlier user/assistant turns."""
    check_messages(len(body.messages), limits)
    last = len(body.messages) - 1
    if body.messages[last].role != "user":
        raise RequestError(f"messages.{last}.role", "the last message must be the user's question")
    question = body.messages[last].text(f"messages.{last}")
    check_question(question, limits, f"messages.{last}.content")
    history = [{"role": m.role, "content": m.text(f"messages.{i}")}
               for i, m in enumerate(body.messages[:last]) if m.role in ("user", "assistant")]
    return question, history


def _usage(event: AnswerEvent) -> dict[str, int]:
    prompt, completion = event.usage.get("prompt_tokens", 0), event.usage.get("completion_tokens", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _citations(event: AnswerEvent) -> list[dict[str, Any]]:
    return [CitationOut.of(c).model_dump(mode="json") for c in event.citations]


def _ragqa(event: AnswerEvent) -> dict[str, Any]:
    """The extension field: the answer's versions and id."""
    return {**(event.versions or {}), "answer_id": event.answer_id}


def _model(asked: str, event: AnswerEvent, profiles: bool) -> str:
    """With profiles, the answering profile's model id; else the request's model, echoed."""
    model = (event.versions or {}).get("model") if profiles else None
    return str(model) if model else asked


class ChunkRenderer:
    """Turns answer events into ``chat.completion.chunk`` SSE data lines."""

    def __init__(self, completion_id: str, model: str, include_usage: bool, profiles: bool = False) -> None:
        self.id, self.model, self.include_usage = completion_id, model, include_usage
        self.asked, self.profiles = model, profiles
        self.created = int(time.time())
        self.cache = "miss"
        self.started = False

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None,
               ragqa: dict[str, Any] | None = None) -> Out:
        body = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": choices, "usage": usage}
        if ragqa is not None:
            body["ragqa"] = ragqa
        return Out(json.dumps(body, ensure_ascii=False, separators=(",", ":")))

    def _delta(self, delta: dict[str, Any], finish_reason: str | None = None,
               ragqa: dict[str, Any] | None = None) -> Out:
        return self._chunk([{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}],
                           ragqa=ragqa)

    async def events(self, answer: AsyncIterator[AnswerEvent]) -> AsyncIterator[Out]:
        async for event in answer:
            if event.kind in ("sources", "done"):
                self.model = _model(self.asked, event, self.profiles)
            if event.kind == "sources":
                if self.started:  # a cascade's second context: the client has its role already
                    continue
                self.started = True
                self.cache = event.cache or "miss"
                yield self._delta({"role": "assistant", "content": ""})
            elif event.kind == "delta":
                yield self._delta({"content": event.text})
            elif event.kind == "done":
                extra = {"degraded": True, "warnings": list(event.warnings)} if event.degraded else {}
                yield self._delta({"citations": _citations(event), "cache": event.cache or "miss", **extra},
                                  event.finish_reason or "stop", ragqa=_ragqa(event))
                if self.include_usage:
                    yield self._chunk([], _usage(event))
                yield Out("[DONE]")
            elif event.kind == "error":
                for out in self.error(event.error or "generation failed", "generator_error"):
                    yield out

    def error(self, message: str, code: str) -> Sequence[Out]:
        type_ = "server_error" if code == "internal_error" else "service_unavailable_error"
        return [Out(json.dumps(error_body(message, type_, None, code), ensure_ascii=False)), Out("[DONE]")]


@router.post("/v1/chat/completions", response_model=ChatCompletion, responses={**RESUME_ERRORS, 200: _STREAM_DOC},
             summary="Answer the last user message from the indexed documents (OpenAI-compatible)")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, response: Response, state: State, caller: QueryCaller, ab: Ab,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", description=(
        "Resume a stream: `<stream_id>:<events received>`; the stream continues after that event."))] = None,
) -> Any:
    if body.stream and last_event_id:
        return await resume(state, last_event_id, "chat", caller)
    question, history = conversation(body, state.settings.serve)
    options = body.rag
    filters = options.filters.parse("rag.filters") if options and options.filters else Filters()
    arm = await ab.assign(request, caller, chat_conversation(question, history))
    answer = observed("chat", state, ab.recorded("chat", state.answerer.stream(
        question, history=history, filters=caller.restrict(filters), top_k=options.top_k if options else None,
        overrides=body.overrides(), no_cache=bool(options and options.no_cache), profile=arm.profile,
        arm=arm.arm), arm),
        question=question, caller=caller.key_id, history_turns=len(history), stream=body.stream,
        experiment=arm.experiment)
    if not body.stream:
        result = await until_disconnected(request, collect(answer))
        response.headers["X-Cache"] = result.done.cache or "miss"
        if result.done.degraded:
            response.headers["X-Degraded"] = "; ".join(result.done.warnings)[:1000] or "degraded"
        return ChatCompletion(
            id="chatcmpl-" + state.streams.new_id(), created=int(time.time()),
            model=_model(body.model, result.done, bool(state.settings.profiles)),
            choices=[Choice(message=AssistantMessage(content=result.text, citations=[
                CitationOut.of(c) for c in result.done.citations]), finish_reason=result.done.finish_reason)],
            usage=Usage(**_usage(result.done)), ragqa=_ragqa(result.done))
    stream_id = state.streams.new_id()
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    renderer = ChunkRenderer(f"chatcmpl-{stream_id}", body.model, include_usage, bool(state.settings.profiles))
    await state.streams.start(counted(renderer.events(answer)), renderer.error, kind="chat",
                              owner=caller.key_id, stream_id=stream_id)
    sse = sse_response(state, stream_id, 0, ping=False)
    sse.headers["X-Cache"] = renderer.cache
    return sse


@router.get("/v1/models", response_model=ModelList, responses=ERRORS, summary="The one model: ragqa")
async def models(state: State, caller: QueryCaller) -> ModelList:
    return ModelList(data=[ModelCard(id="ragqa", created=STARTED)])
