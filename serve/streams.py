"""Resumable server-sent event streams: generation runs apart from the connection.

A streamed answer runs in a background task that appends each rendered event to a
:class:`StreamStore`. Connections only *read* the store, so a client that drops and comes
back with ``Last-Event-ID: <stream_id>:<seq>`` gets exactly the events after ``seq``: none
missed, none repeated, whether the generation is still running or has finished. Events
are kept for ``stream_retention_s`` after the last one.

A generation with no connection following it for ``disconnect_grace_s`` is cancelled,
which closes the generator (and aborts the request in the engine), and the stream ends with
the route's error events (code ``aborted``). Connections in this process are counted while
they are open; readers also heartbeat the stream in the store each time they poll it, so
with a Redis store a reader on another worker keeps the generation alive too.

Example::

    streams = StreamManager(MemoryStreamStore(retention_s=300), grace_s=30)
    stream_id = await streams.start(events(), on_error=render_error, kind="chat")
    async for event in streams.follow(stream_id, after=0):
        print(event.seq, event.data)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rag.errors import BackendUnavailable
from serve.errors import NotFound

__all__ = ["Out", "StreamEvent", "StreamInfo", "StreamStore", "MemoryStreamStore", "StreamManager",
           "parse_event_id"]

log = logging.getLogger("ragqa.serve.streams")


@dataclass(frozen=True, slots=True)
class Out:
    """One event a route renders: the SSE ``data`` line and optional ``event`` name."""

    data: str
    event: str | None = None


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """A stored event; its SSE id is ``<stream_id>:<seq>`` (``seq`` counts from 1)."""

    seq: int
    data: str
    event: str | None = None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    kind: str
    owner: str | None
    events: int
    finished: bool
    last_seen: float  # the last time a reader polled (time.time())


@runtime_checkable
class StreamStore(Protocol):
    """Where events of running and recent generations live (memory now, Redis later).

    ``read_after`` waits up to ``wait_s`` for events after ``after``, returns them with
    whether the stream has finished, and records that a reader is present. Unknown or
    expired streams raise :class:`~serve.errors.NotFound`.
    """

    async def create(self, stream_id: str, kind: str, owner: str | None = None) -> None: ...

    async def append(self, stream_id: str, data: str, event: str | None = None) -> int: ...

    async def finish(self, stream_id: str) -> None: ...

    async def read_after(self, stream_id: str, after: int, wait_s: float) -> tuple[list[StreamEvent], bool]: ...

    async def info(self, stream_id: str) -> StreamInfo | None: ...


@dataclass
class _Stream:
    kind: str
    owner: str | None
    events: list[StreamEvent] = field(default_factory=list)
    finished: bool = False
    last_event: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.time)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class MemoryStreamStore:
    """The embedded store: one process's streams in a dict, dropped ``retention_s`` after
    their last event. Resume works on the worker that started the stream."""

    def __init__(self, retention_s: float = 300.0) -> None:
        self.retention_s = retention_s
        self._streams: dict[str, _Stream] = {}
        self._swept = 0.0

    def _get(self, stream_id: str) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None or self._expired(stream, time.time()):
            raise NotFound("Last-Event-ID", f"stream {stream_id!r} is unknown or has expired "
                           f"(streams are kept {self.retention_s:g} s after their last event)")
        return stream

    def _expired(self, stream: _Stream, now: float) -> bool:
        return stream.finished and now - stream.last_event > self.retention_s

    def _sweep(self, now: float) -> None:
        if now - self._swept < 1.0:
            return
        self._swept = now
        for sid in [sid for sid, s in self._streams.items() if self._expired(s, now)]:
            del self._streams[sid]

    async def create(self, stream_id: str, kind: str, owner: str | None = None) -> None:
        self._sweep(time.time())
        self._streams[stream_id] = _Stream(kind, owner)

    async def append(self, stream_id: str, data: str, event: str | None = None) -> int:
        stream = self._streams[stream_id]
        seq = len(stream.events) + 1
        stream.events.append(StreamEvent(seq, data, event))
        stream.last_event = time.time()
        self._wake(stream)
        return seq

    async def finish(self, stream_id: str) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.finished = True
            stream.last_event = time.time()
            self._wake(stream)

    @staticmethod
    def _wake(stream: _Stream) -> None:
        stream.changed.set()
        stream.changed = asyncio.Event()

    async def read_after(self, stream_id: str, after: int, wait_s: float) -> tuple[list[StreamEvent], bool]:
        stream = self._get(stream_id)
        stream.last_seen = time.time()
        if len(stream.events) <= after and not stream.finished:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.changed.wait(), wait_s)
            stream.last_seen = time.time()
        return stream.events[after:], stream.finished

    async def info(self, stream_id: str) -> StreamInfo | None:
        try:
            s = self._get(stream_id)
        except NotFound:
            return None
        return StreamInfo(s.kind, s.owner, len(s.events), s.finished, s.last_seen)

    def drop(self, stream_id: str) -> None:
        """Forget a stream now (a copy kept only while it was written)."""
        self._streams.pop(stream_id, None)


def parse_event_id(value: str) -> tuple[str, int]:
    """``"<stream_id>:<seq>"`` -> ``(stream_id, seq)``; a bare stream id means from the start."""
    from rag.errors import RequestError

    sid, _, seq = value.strip().rpartition(":")
    if not sid:
        sid, seq = value.strip(), "0"
    if not sid or not seq.isdigit():
        raise RequestError("Last-Event-ID", f"expected '<stream_id>:<seq>', got {value!r}")
    return sid, int(seq)


class StreamManager:
    """Starts generations as background tasks writing to a store, and follows them.

    ``start`` returns once the first event is stored, so an error before any output (a bad
    filter, a backend that is down) is raised to the route, which answers with a status
    code instead of a stream. Later errors are rendered by ``on_error`` into the stream.
    """

    def __init__(self, store: StreamStore, grace_s: float = 30.0, poll_s: float | None = None) -> None:
        self.store = store
        self.grace_s = grace_s
        self.poll_s = poll_s if poll_s is not None else max(0.05, min(1.0, grace_s / 4))
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._reasons: dict[str, str] = {}
        self._readers: dict[str, int] = {}  # connections following a stream in this process
        self._left: dict[str, float] = {}  # when the last of them went away

    @property
    def running(self) -> int:
        return len(self._tasks)

    @staticmethod
    def new_id() -> str:
        """An unguessable stream id (it is all a reader needs to resume)."""
        return secrets.token_urlsafe(12)

    async def start(self, events: AsyncIterator[Out], on_error: Callable[[str, str], Sequence[Out]], *,
                    kind: str, owner: str | None = None, stream_id: str | None = None) -> str:
        stream_id = stream_id or self.new_id()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(self._run(stream_id, events, on_error, kind, owner, ready),
                                   name=f"stream-{stream_id}")
        self._tasks[stream_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(stream_id, None))
        await ready
        return stream_id

    async def _run(self, stream_id: str, events: AsyncIterator[Out], on_error: Callable[[str, str], Sequence[Out]],
                   kind: str, owner: str | None, ready: asyncio.Future[None]) -> None:
        watchdog: asyncio.Task[None] | None = None
        try:
            try:
                first = await anext(events)
            except StopAsyncIteration:
                first = None
            except asyncio.CancelledError:
                ready.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - the waiting route answers with a status
                ready.set_exception(exc)
                return
            try:
                await self.store.create(stream_id, kind, owner)
                if first is not None:
                    await self.store.append(stream_id, first.data, first.event)
            except Exception as exc:  # noqa: BLE001 - a store that is down (Redis): the route answers 503
                ready.set_exception(exc)
                return
            ready.set_result(None)
            watchdog = asyncio.create_task(self._watch(stream_id, asyncio.current_task()))  # type: ignore[arg-type]
            try:
                async for out in events:
                    await self.store.append(stream_id, out.data, out.event)
            except asyncio.CancelledError:
                reason = self._reasons.pop(stream_id, "the server is shutting down")
                log.info("stream %s aborted: %s", stream_id, reason)
                for out in on_error(f"generation aborted: {reason}", "aborted"):
                    await self.store.append(stream_id, out.data, out.event)
            except Exception as exc:
                log.exception("stream %s failed", stream_id)
                for out in on_error(f"internal error ({type(exc).__name__}); see the server log", "internal_error"):
                    await self.store.append(stream_id, out.data, out.event)
            await self.store.finish(stream_id)
        finally:
            if watchdog is not None:
                watchdog.cancel()
            self._reasons.pop(stream_id, None)
            self._left.pop(stream_id, None)
            with contextlib.suppress(Exception):
                await events.aclose()  # type: ignore[attr-defined]

    async def _watch(self, stream_id: str, task: asyncio.Task[None]) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                info = await self.store.info(stream_id)
            except BackendUnavailable:
                continue  # Redis is down: no heartbeat can be read, so none counts as absence
            if info is None or info.finished:
                return
            if self._readers.get(stream_id):  # connected here: a busy loop is no absence
                continue
            away = time.time() - max(info.last_seen, self._left.get(stream_id, 0.0))
            if away > self.grace_s:
                self._reasons[stream_id] = f"no client has read the stream for {away:.1f} s"
                task.cancel()
                return

    async def follow(self, stream_id: str, after: int = 0) -> AsyncIterator[StreamEvent]:
        """Yield the events after ``after`` as they are stored, until the stream finishes."""
        self._readers[stream_id] = self._readers.get(stream_id, 0) + 1
        try:
            while True:
                events, finished = await self.store.read_after(stream_id, after, self.poll_s)
                for event in events:
                    yield event
                    after = event.seq
                if finished and not events:
                    return
        finally:
            self._readers[stream_id] -= 1
            if not self._readers[stream_id]:
                del self._readers[stream_id]
                if stream_id in self._tasks:
                    self._left[stream_id] = time.time()

    async def close(self, timeout_s: float = 5.0) -> None:
        """Abort every running generation (server shutdown); each stream gets its error event."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
