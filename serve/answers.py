"""What the chat and ask routes share: running the answerer, metrics, SSE responses and resume.

Example::

    events = observed("ask", state, state.answerer.stream(question, filters=filters), question=question)
    result = await collect(events)                 # a whole answer
    return sse_response(state, stream_id, after=0)  # or a stream the client can resume
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent

from rag.answer import AnswerEvent
from rag.errors import GeneratorError, RequestError
from serve.deps import AppState, Caller
from serve.errors import ClientGone, NotFound
from serve.metrics import STREAMS_RUNNING, observe_answer
from serve.qa_log import entry
from serve.streams import parse_event_id

__all__ = ["observed", "collect", "Collected", "sse_response", "resume", "until_disconnected", "counted"]

T = TypeVar("T")
log = logging.getLogger("ragqa.serve")


async def observed(route: str, state: AppState, events: AsyncIterator[AnswerEvent], *,
                   question: str | None = None, **log_fields: Any) -> AsyncIterator[AnswerEvent]:
    """Pass the answerer's events through, recording metrics and the generator's health, and
    with ``question`` a line in the QA log when the answer ends (``log_fields`` go into it)."""
    parts: list[str] = []
    last: AnswerEvent | None = None
    try:
        async for event in events:
            if event.kind == "delta":
                parts.append(event.text)
            elif event.kind in ("done", "error"):
                last = event
            if event.kind == "done":
                observe_answer(route, event)
                if event.cache in (None, "miss"):  # a cached answer says nothing of the generator now
                    state.generator.state, state.generator.detail = (
                        ("down", "the last answer fell back to extractive") if event.fallback else ("ready", None))
            elif event.kind == "error":
                observe_answer(route, event)
            yield event
    finally:
        await events.aclose()  # type: ignore[attr-defined]
        if question is not None and state.qa_log is not None:
            outcome = "cancelled" if last is None else "error" if last.kind == "error" else "ok"
            try:
                state.qa_log.write(entry(route, question, "".join(parts).strip(), last, outcome=outcome,
                                         **log_fields))
            except Exception as exc:  # noqa: BLE001 - a log that cannot be written must not fail the answer
                log.warning("cannot write the QA log: %s", exc)


@dataclass
class Collected:
    text: str
    done: AnswerEvent


async def collect(events: AsyncIterator[AnswerEvent]) -> Collected:
    parts: list[str] = []
    try:
        async for event in events:
            if event.kind == "delta":
                parts.append(event.text)
            elif event.kind == "error":
                raise GeneratorError(event.error or "generation failed")
            elif event.kind == "done":
                return Collected("".join(parts).strip(), event)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    raise GeneratorError("the answer stream ended without a result")


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client disconnects first (no one would read it)."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise ClientGone("the client disconnected; its answer was cancelled")
    return task.result()


def sse_response(state: AppState, stream_id: str, after: int = 0, *, ping: bool = True) -> EventSourceResponse:
    """The stored events of ``stream_id`` after ``after``, each with ``id: <stream_id>:<seq>``.

    ``ping=False`` for the chat route: after an event with an id, OpenAI's Python client
    parses a keep-alive comment as an event with empty data and fails on it. (A day-long
    interval rather than ``ping=0``, which busy-loops in sse-starlette before its fix of #206.)
    """

    async def events() -> AsyncIterator[ServerSentEvent]:
        async for event in state.streams.follow(stream_id, after):
            yield ServerSentEvent(data=event.data, event=event.event, id=f"{stream_id}:{event.seq}")

    # X-Stream-Store: redis (resumable on any worker or instance), or local (on this worker only:
    # no Redis configured, or Redis was unavailable when the stream started).
    is_local = getattr(state.streams.store, "is_local", None)
    where = "redis" if is_local is not None and not is_local(stream_id) else "local"
    return EventSourceResponse(events(), ping=None if ping else 86_400, sep="\n",
                               headers={"X-Stream-Id": stream_id, "X-Stream-Store": where, "Cache-Control": "no-store"})


async def resume(state: AppState, last_event_id: str, kind: str | None, caller: Caller) -> EventSourceResponse:
    """Answer a reconnect: the events after ``Last-Event-ID`` of a stream the caller owns."""
    stream_id, after = parse_event_id(last_event_id)
    info = await state.streams.store.info(stream_id)
    if info is None or info.owner != caller.key_id:
        raise NotFound("Last-Event-ID", f"stream {stream_id!r} is unknown or has expired (streams are kept "
                       f"{state.settings.serve.stream_retention_s:g} s after their last event)")
    if kind is not None and info.kind != kind:
        raise RequestError("Last-Event-ID", f"stream {stream_id!r} belongs to the {info.kind} route")
    if after > info.events and info.finished:
        raise RequestError("Last-Event-ID", f"stream {stream_id!r} has only {info.events} events, not {after}")
    return sse_response(state, stream_id, after, ping=info.kind != "chat")


async def counted(events: AsyncIterator[T]) -> AsyncIterator[T]:
    STREAMS_RUNNING.inc()
    try:
        async for item in events:
            yield item
    finally:
        STREAMS_RUNNING.dec()
        await events.aclose()  # type: ignore[attr-defined]
