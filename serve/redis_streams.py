"""A :class:`~serve.streams.StreamStore` in Redis, so a stream resumes on any worker or instance.

Each stream is two keys sharing a hash tag (one Redis Cluster slot): a hash of metadata
(``kind``, ``owner``, ``events``, ``finished``, ``last_seen``) and a Redis Stream of events.
Event ``seq`` is also the entry's id (``<seq>-0``), given by ``HINCRBY`` on ``events`` inside
the same script that adds the entry, so ids are dense and ordered whoever appends. Finishing
adds a marker entry ``<last seq>-1`` (it sorts after the last event and before any next one)
and sets ``finished``; a reader that gets the marker knows the stream is over without waiting.

Readers block in ``XREAD BLOCK`` for new entries, so a reader on worker B wakes as soon as
worker A appends. Each read records ``last_seen`` (the heartbeat the stream manager's
disconnect grace reads, from any worker).

Retention: every append and every read of an unfinished stream sets both keys to expire
``retention_s`` later, and finishing does too; so a finished stream is kept ``retention_s``
after its last event, and a stream whose writer died (no events, no readers) goes away by
itself after ``retention_s``. (The memory store keeps an unfinished stream indefinitely.)

One blocked reader holds one pooled connection for up to ``wait_s`` (the manager's poll, at
most 1 s); size Redis' ``maxclients`` for the streams followed at once.

Example::

    store = RedisStreamStore("redis://127.0.0.1:6379/0", retention_s=300)
    streams = StreamManager(store, grace_s=30)
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from rag.config import ServeSettings
from rag.errors import BackendUnavailable
from rag.metrics import STREAM_STORE_FALLBACKS
from rag.redis_loop import LoopClients
from serve.errors import NotFound
from serve.streams import MemoryStreamStore, StreamEvent, StreamInfo, StreamStore

__all__ = ["FallbackStreamStore", "RedisStreamStore", "make_stream_store"]

log = logging.getLogger("ragqa.serve.streams")
T = TypeVar("T")
_TIMEOUT_S = 2.0
_RETRY_S = 1.0  # after a failure, streams start in memory for this long before Redis is tried again

# KEYS: meta, events. ARGV: data, event name ('' for none), retention (ms), now.
_APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.error_reply('NOSTREAM') end
local seq = redis.call('HINCRBY', KEYS[1], 'events', 1)
redis.call('XADD', KEYS[2], seq .. '-0', 'd', ARGV[1], 'e', ARGV[2])
redis.call('HSET', KEYS[1], 'last_event', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return seq
"""

# KEYS: meta, events. ARGV: retention (ms), now.
_FINISH = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], 'finished') == '1' then return 1 end
local seq = tonumber(redis.call('HGET', KEYS[1], 'events') or '0')
redis.call('XADD', KEYS[2], seq .. '-1', 'f', '1')
redis.call('HSET', KEYS[1], 'finished', '1', 'last_event', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return 1
"""

# KEYS: meta, events. ARGV: first id (exclusive, "(<seq>-0"), retention (ms), now.
# Returns false for an unknown stream, else the entries after the id.
_READ = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'last_seen', ARGV[3])
if redis.call('HGET', KEYS[1], 'finished') ~= '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return redis.call('XRANGE', KEYS[2], ARGV[1], '+')
"""


class RedisStreamStore:
    """Streams in Redis (see the module docstring). ``url`` is ``redis://host:port/db``.

    The asyncio client is made on first use in the running event loop (one per loop, as
    asyncio connections belong to one), so the store can be built before the server starts.
    """

    def __init__(self, url: str, retention_s: float = 300.0, *, prefix: str = "ragqa:stream") -> None:
        self.url = url
        self.retention_s = retention_s
        self.prefix = prefix
        # A hung Redis must not hang a stream: every call but a blocking read (at most
        # wait_s, 1 s) answers within a few seconds or fails over (FallbackStreamStore).
        self._clients = LoopClients(url, scripts={"append": _APPEND, "finish": _FINISH, "read": _READ},
                                    decode_responses=True, socket_connect_timeout=_TIMEOUT_S,
                                    socket_timeout=_TIMEOUT_S + 1.0)

    # -- plumbing ---------------------------------------------------------------------------
    def _redis(self) -> Any:
        return self._clients.client()

    def _script(self, name: str) -> Any:
        return self._clients.script(name)

    def _keys(self, stream_id: str) -> list[str]:
        tag = f"{self.prefix}:{{{stream_id}}}"
        return [f"{tag}:meta", f"{tag}:events"]

    @property
    def _ttl(self) -> int:
        return max(1, int(self.retention_s * 1000))  # milliseconds (PEXPIRE)

    def _gone(self, stream_id: str) -> NotFound:
        return NotFound("Last-Event-ID", f"stream {stream_id!r} is unknown or has expired "
                        f"(streams are kept {self.retention_s:g} s after their last event)")

    @staticmethod
    def _events(entries: list[Any]) -> tuple[list[StreamEvent], bool]:
        events, finished = [], False
        for entry_id, fields in entries:
            if isinstance(fields, list):  # a script's reply: a flat [field, value, ...] list
                fields = dict(zip(fields[::2], fields[1::2], strict=True))
            if "f" in fields:
                finished = True
                continue
            events.append(StreamEvent(int(entry_id.split("-")[0]), fields["d"], fields.get("e") or None))
        return events, finished

    def _down(self, exc: Exception) -> BackendUnavailable:
        return BackendUnavailable(f"the stream store (Redis at {_safe(self.url)}) is unavailable: {exc}")

    # -- the StreamStore protocol -----------------------------------------------------------------
    async def create(self, stream_id: str, kind: str, owner: str | None = None) -> None:
        meta, events = self._keys(stream_id)
        now = repr(time.time())
        async with self._redis().pipeline(transaction=True) as pipe:
            pipe.delete(meta, events)
            pipe.hset(meta, mapping={"kind": kind, "owner": owner or "", "has_owner": int(owner is not None),
                                     "events": 0, "finished": 0, "last_seen": now, "last_event": now})
            pipe.pexpire(meta, self._ttl)
            await pipe.execute()

    async def append(self, stream_id: str, data: str, event: str | None = None) -> int:
        try:
            return int(await self._script("append")(keys=self._keys(stream_id),
                                                     args=[data, event or "", self._ttl, repr(time.time())]))
        except Exception as exc:
            if "NOSTREAM" in str(exc):
                raise KeyError(stream_id) from None  # as the memory store: appending to no stream is a bug
            raise

    async def finish(self, stream_id: str) -> None:
        await self._script("finish")(keys=self._keys(stream_id), args=[self._ttl, repr(time.time())])

    async def read_after(self, stream_id: str, after: int, wait_s: float) -> tuple[list[StreamEvent], bool]:
        client = self._redis()
        keys = self._keys(stream_id)
        entries = await self._script("read")(keys=keys, args=[f"({after}-0", self._ttl, repr(time.time())])
        if entries is None:
            raise self._gone(stream_id)
        events, finished = self._events(entries)
        if events or finished or wait_s <= 0:
            return events, finished
        # Nothing new yet: block until an entry after <after>-0 arrives (an event or the end).
        reply = await client.xread({keys[1]: f"{after}-0"}, block=max(1, int(wait_s * 1000)))
        if reply:
            return self._events(reply[0][1])
        # Nothing came: read again, which records that the reader is still here.
        entries = await self._script("read")(keys=keys, args=[f"({after}-0", self._ttl, repr(time.time())])
        if entries is None:
            raise self._gone(stream_id)
        return self._events(entries)

    async def info(self, stream_id: str) -> StreamInfo | None:
        meta = await self._redis().hgetall(self._keys(stream_id)[0])
        if not meta:
            return None
        owner = meta.get("owner") if meta.get("has_owner") == "1" else None
        return StreamInfo(meta["kind"], owner, int(meta.get("events", 0)), meta.get("finished") == "1",
                          float(meta.get("last_seen", 0)))

    async def aclose(self) -> None:
        """Close this event loop's connections (at shutdown)."""
        await self._clients.aclose()

    async def ping(self) -> bool:
        return bool(await self._redis().ping())


def _safe(url: str) -> str:
    """The URL without its password."""
    return re.sub(r"//[^@/]*@", "//***@", url)


def _unavailable(method: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Redis connection errors and timeouts as ``BackendUnavailable`` (a 503, not a 500)."""

    @functools.wraps(method)
    async def wrapper(self: RedisStreamStore, *args: Any, **kwargs: Any) -> T:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        try:
            return await method(self, *args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise self._down(exc) from exc

    return wrapper


for _name in ("create", "append", "finish", "read_after", "info"):
    setattr(RedisStreamStore, _name, _unavailable(getattr(RedisStreamStore, _name)))


class FallbackStreamStore:
    """Redis, and this worker's memory for the streams Redis cannot take: an answer still streams
    when Redis is down, and the response says what is lost.

    Each stream written here is also kept in this worker's memory while it is written (events
    are small; the copy is dropped when the stream finishes in Redis). So:

    - Redis unavailable when a stream starts: the stream lives in this worker's memory. It can
      be resumed on this worker only, and its response has ``X-Stream-Store: local``.
    - Redis lost in the middle of a stream: the stream goes on in memory, and readers on this
      worker read on with no gap. A reader on another worker or instance gets a 503 naming the
      stream store, and its stream in Redis is left unfinished (it expires after
      ``stream_retention_s``).
    - After a failure, new streams start in memory for ``_RETRY_S``, then Redis is tried again.
      ``stream_store_fallbacks_total{when}`` counts both cases.
    """

    def __init__(self, redis: RedisStreamStore, local: MemoryStreamStore) -> None:
        self.redis, self.local = redis, local
        self._local: set[str] = set()  # streams that live in this worker's memory
        self._writing: set[str] = set()  # Redis streams written here (with a copy in memory)
        self._retry_at = 0.0

    @property
    def url(self) -> str:
        return self.redis.url

    def is_local(self, stream_id: str) -> bool:
        return stream_id in self._local

    def _failed(self, when: str, exc: Exception) -> None:
        self._retry_at = time.monotonic() + _RETRY_S
        STREAM_STORE_FALLBACKS.labels(when).inc()
        log.warning("stream store unavailable (%s); streams stay in this worker's memory: %s", when, exc)

    async def create(self, stream_id: str, kind: str, owner: str | None = None) -> None:
        await self.local.create(stream_id, kind, owner)
        if time.monotonic() >= self._retry_at:
            try:
                await self.redis.create(stream_id, kind, owner)
                self._writing.add(stream_id)
                return
            except BackendUnavailable as exc:
                self._failed("start", exc)
        else:
            STREAM_STORE_FALLBACKS.labels("start").inc()
        self._local.add(stream_id)

    async def append(self, stream_id: str, data: str, event: str | None = None) -> int:
        seq = await self.local.append(stream_id, data, event)
        if stream_id in self._writing:
            try:
                await self.redis.append(stream_id, data, event)
            except BackendUnavailable as exc:
                self._failed("mid-stream", exc)
                self._writing.discard(stream_id)
                self._local.add(stream_id)
        return seq

    async def finish(self, stream_id: str) -> None:
        await self.local.finish(stream_id)
        if stream_id in self._writing:
            self._writing.discard(stream_id)
            try:
                await self.redis.finish(stream_id)
            except BackendUnavailable as exc:
                self._failed("mid-stream", exc)
                self._local.add(stream_id)
                return
            self.local.drop(stream_id)

    async def read_after(self, stream_id: str, after: int, wait_s: float) -> tuple[list[StreamEvent], bool]:
        if stream_id in self._local:
            return await self.local.read_after(stream_id, after, wait_s)
        try:
            return await self.redis.read_after(stream_id, after, wait_s)
        except BackendUnavailable:
            if stream_id in self._writing or stream_id in self._local:  # written here: the copy has it all
                return await self.local.read_after(stream_id, after, wait_s)
            raise

    async def info(self, stream_id: str) -> StreamInfo | None:
        if stream_id in self._local:
            info = await self.local.info(stream_id)
            if info is None:
                self._local.discard(stream_id)  # expired from memory
            return info
        try:
            return await self.redis.info(stream_id)
        except BackendUnavailable:
            if stream_id in self._writing:
                return await self.local.info(stream_id)
            raise

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def ping(self) -> bool:
        return await self.redis.ping()


def make_stream_store(serve: ServeSettings) -> StreamStore:
    """The store ``serve`` asks for: Redis (with this worker's memory when Redis is down) when
    ``serve.redis_url`` is set, else this process's memory."""
    if serve.redis_url:
        return FallbackStreamStore(RedisStreamStore(serve.redis_url, serve.stream_retention_s),
                                   MemoryStreamStore(serve.stream_retention_s))
    return MemoryStreamStore(serve.stream_retention_s)
