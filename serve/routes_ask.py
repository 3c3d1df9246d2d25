"""``POST /v1/ask`` (native) and ``GET /v1/streams/{stream_id}`` (resume any stream).

With ``stream: true`` the answer is an SSE stream of named events, each with
``id: <stream_id>:<seq>``: ``sources`` (the packed passages' citations), ``delta`` (answer
text), then ``done`` (the whole :class:`~serve.schemas.AskResponse`) or ``error``.

**Resume** after a dropped connection: ``GET /v1/streams/{stream_id}`` with the header
``Last-Event-ID`` (what a browser's ``EventSource`` sends by itself) or ``?after=<seq>``, or
re-send the POST with ``Last-Event-ID``. Either way the events after that id follow, with
no gap and no repeat, while the generation runs or up to ``serve.stream_retention_s``
after it ended.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request

from rag.answer import AnswerEvent
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
from serve.limits import check_question
from serve.routes_experiments import Ab
from serve.schemas import (
    RESUME_ERRORS,
    AskRequest,
    AskResponse,
    CitationOut,
    ErrorResponse,
    Usage,
)
from serve.streams import Out

__all__ = ["router"]

router = APIRouter(tags=["ask"])

_SSE = {"text/event-stream": {"schema": {"type": "string"}, "example": (
    'id: Xq3...:1\nevent: sources\ndata: {"citations": [...], "degraded": false, "conversation_id": "conv-..."}\n\n'
    'id: Xq3...:2\nevent: delta\ndata: {"text": "Python 3.11 was released "}\n\n'
    'id: Xq3...:9\nevent: done\ndata: {"answer": "...", "citations": [...], "timings": {...}, ...}\n\n')}}
_LastEventId = Annotated[str | None, Header(alias="Last-Event-ID", description=(
    "Resume a stream: `<stream_id>:<seq>` of the last event received."))]


def _response(text: str, done: AnswerEvent, conversation_id: str) -> AskResponse:
    prompt, completion = done.usage.get("prompt_tokens", 0), done.usage.get("completion_tokens", 0)
    return AskResponse(answer=text, citations=[CitationOut.of(c) for c in done.citations],
                       conversation_id=conversation_id, timings=done.timings, cache=done.cache or "miss",
                       degraded=done.degraded, warnings=list(done.warnings), finish_reason=done.finish_reason,
                       usage=Usage(prompt_tokens=prompt, completion_tokens=completion,
                                   total_tokens=prompt + completion),
                       answer_id=done.answer_id, versions=done.versions)


def _out(event: str, data: Any) -> Out:
    return Out(json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str), event)


class AskRenderer:
    """Turns answer events into the native route's named SSE events."""

    def __init__(self, conversation_id: str, on_done: Callable[[str], Awaitable[None]]) -> None:
        self.conversation_id, self.on_done = conversation_id, on_done

    async def events(self, answer: AsyncIterator[AnswerEvent]) -> AsyncIterator[Out]:
        parts: list[str] = []
        async for event in answer:
            if event.kind == "sources":
                yield _out("sources", {"citations": [CitationOut.of(c).model_dump(mode="json") for c in event.citations],
                                       "degraded": event.degraded, "warnings": list(event.warnings),
                                       "conversation_id": self.conversation_id, "versions": event.versions})
            elif event.kind == "delta":
                parts.append(event.text)
                yield _out("delta", {"text": event.text})
            elif event.kind == "done":
                text = "".join(parts).strip()
                await self.on_done(text)
                yield _out("done", _response(text, event, self.conversation_id).model_dump(mode="json"))
            elif event.kind == "error":
                for out in self.error(event.error or "generation failed", "generator_error"):
                    yield out

    def error(self, message: str, code: str) -> Sequence[Out]:
        type_ = "server_error" if code == "internal_error" else "service_unavailable_error"
        return [_out("error", error_body(message, type_, None, code))]


@router.post("/v1/ask", response_model=AskResponse,
             responses={**RESUME_ERRORS,
                        200: {"description": "The answer, or with `stream: true` an SSE stream.", "content": _SSE}},
             summary="Answer a question from the indexed documents, with citations and timings")
async def ask(body: AskRequest, request: Request, state: State, caller: QueryCaller, ab: Ab,
              last_event_id: _LastEventId = None) -> Any:
    if body.stream and last_event_id:
        return await resume(state, last_event_id, "ask", caller)
    check_question(body.question, state.settings.serve, "question")
    filters = body.filters.parse("filters") if body.filters else Filters()
    conversation_id = body.conversation_id or state.conversations.new_id()
    arm = await ab.assign(request, caller, conversation_id)  # an experiment's arm, or pinned by an admin
    answer = observed("ask", state, ab.recorded("ask", state.answerer.stream(
        body.question, history=await state.conversations.history(conversation_id, caller.key_id),
        filters=caller.restrict(filters), top_k=body.top_k, no_cache=body.no_cache, profile=arm.profile,
        arm=arm.arm), arm),
        question=body.question, caller=caller.key_id, conversation_id=conversation_id, stream=body.stream,
        experiment=arm.experiment)
    if not body.stream:
        result = await until_disconnected(request, collect(answer))
        await state.conversations.add(conversation_id, body.question, result.text, caller.key_id)
        return _response(result.text, result.done, conversation_id)
    renderer = AskRenderer(conversation_id, lambda text: state.conversations.add(
        conversation_id, body.question, text, caller.key_id))
    stream_id = await state.streams.start(counted(renderer.events(answer)), renderer.error, kind="ask",
                                          owner=caller.key_id)
    return sse_response(state, stream_id, 0)


@router.get("/v1/streams/{stream_id}",
            responses={200: {"description": "The stream's events after the given one.", "content": _SSE},
                       404: {"model": ErrorResponse, "description": "Unknown or expired stream."},
                       422: {"model": ErrorResponse, "description": "A malformed Last-Event-ID."}},
            summary="Resume a stream (chat or ask) after a dropped connection")
async def stream_events(stream_id: str, state: State, caller: QueryCaller, last_event_id: _LastEventId = None,
                        after: Annotated[int | None, Query(ge=0, description="Resume after this seq.")] = None) -> Any:
    if last_event_id:
        if not last_event_id.startswith(f"{stream_id}:"):
            raise RequestError("Last-Event-ID", f"{last_event_id!r} is not an event of stream {stream_id!r}")
        return await resume(state, last_event_id, None, caller)
    return await resume(state, f"{stream_id}:{after or 0}", None, caller)
