"""Admission control: a bound on the answers generated at once, and on those waiting for a turn.

A burst of questions larger than the service can answer is not accepted whole (where everyone
would wait for all of it): at most ``max_in_flight`` answers are retrieved and generated at a
time (``serve.max_in_flight``; see :func:`admission_for` for ``auto``), at most
``max_queued`` more wait for a slot, and past that a question is refused at once
with :class:`Overloaded` (the service answers ``503`` with ``Retry-After``). Answers from the
answer cache never take a slot. ``answers_in_flight`` and ``answers_queued`` are gauges and
``answers_rejected_total`` counts the refusals. The bound is per process (per worker).

With ``serve.max_in_flight_global`` (and ``serve.redis_url``), an answer also needs one of
that many :class:`GlobalSlots` shared by every worker and instance: a lease in a Redis sorted
set, taken after the worker's own slot and returned when the answer ends. Past it a question
is refused at once (``answers_rejected_global_total``); there is no global queue, the workers'
queues are it. A lease whose worker died expires after ``serve.admission_lease_s``. With Redis
unreachable (0.5 s timeouts, then tried again each second) the global bound is skipped, each
worker's own still holds, and ``admission_global_skipped_total`` counts it.

Example::

    admission = Admission(max_in_flight=4, max_queued=32)
    async with admission.slot():
        ...  # retrieve and generate
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from rag.errors import Overloaded
from rag.metrics import (
    ADMISSION_GLOBAL_SKIPPED,
    ANSWERS_IN_FLIGHT,
    ANSWERS_QUEUED,
    ANSWERS_REJECTED,
    ANSWERS_REJECTED_GLOBAL,
)
from rag.redis_loop import LoopClients

if TYPE_CHECKING:
    from rag.config import Settings

__all__ = ["Admission", "GlobalSlots", "admission_for"]

log = logging.getLogger("ragqa.admission")

REMOTE_GENERATORS = ("vllm", "openai")
REMOTE_IN_FLIGHT = 32  # a generator server batches: many answers at once cost little more than one


# KEYS: the lease set. ARGV: limit, lease (ms), token. Scores are expiry times in Redis' own
# clock (TIME), so instances with skewed clocks agree.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
if held >= tonumber(ARGV[1]) then return -held end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return held + 1
"""


class GlobalSlots:
    """``limit`` answer slots shared through Redis by every worker and instance (see the module
    docstring). ``acquire`` returns a token to ``release``, ``None`` when Redis is unreachable
    (no global bound then), or raises :class:`Overloaded` when every slot is taken.

    Example::

        slots = GlobalSlots("redis://127.0.0.1:6379/0", limit=64)
        token = await slots.acquire()
        try: ...
        finally: await slots.release(token)
    """

    def __init__(self, url: str, limit: int, *, lease_s: float = 300.0, retry_after_s: float = 2.0,
                 key: str = "ragqa:admission:slots") -> None:
        self.url, self.limit, self.lease_s, self.retry_after_s, self.key = url, limit, lease_s, retry_after_s, key
        self._redis = LoopClients(url, scripts={"acquire": _ACQUIRE}, socket_connect_timeout=0.5, socket_timeout=0.5)
        self._retry_at = 0.0

    async def acquire(self) -> str | None:
        if time.monotonic() < self._retry_at:
            ADMISSION_GLOBAL_SKIPPED.inc()
            return None
        token = secrets.token_hex(8)
        try:
            held = int(await self._redis.script("acquire")(keys=[self.key], args=[self.limit, int(self.lease_s * 1000), token]))
        except Exception as exc:  # noqa: BLE001 - Redis down or hung: the workers' own bounds hold
            self._retry_at = time.monotonic() + 1.0
            ADMISSION_GLOBAL_SKIPPED.inc()
            log.warning("global admission bound skipped, Redis unavailable: %s", exc)
            return None
        if held < 0:
            ANSWERS_REJECTED_GLOBAL.inc()
            raise Overloaded(
                f"the service is answering {-held} questions across all its workers and instances, its limit "
                f"(serve.max_in_flight_global {self.limit}); try again in {self.retry_after_s:g} s",
                retry_after_s=self.retry_after_s)
        return token

    async def release(self, token: str | None) -> None:
        if token is None:
            return
        with contextlib.suppress(Exception):  # unreachable: the lease expires by itself
            await self._redis.client().zrem(self.key, token)

    async def aclose(self) -> None:
        """Close this event loop's connection (at shutdown)."""
        await self._redis.aclose()

    async def held(self) -> int:
        """Leases held now (expired ones included until the next acquire sweeps them)."""
        return int(await self._redis.client().zcard(self.key))


class Admission:
    """Per-process slots for answers (create and use it on one event loop), and the
    :class:`GlobalSlots` when there is a global bound."""

    def __init__(self, max_in_flight: int, max_queued: int, retry_after_s: float = 2.0,
                 global_slots: GlobalSlots | None = None) -> None:
        if max_in_flight < 1 or max_queued < 0:
            raise ValueError("max_in_flight must be >= 1 and max_queued >= 0")
        self.max_in_flight, self.max_queued, self.retry_after_s = max_in_flight, max_queued, retry_after_s
        self.global_slots = global_slots
        self._slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.queued = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """A slot for one answer; raises :class:`Overloaded` when every slot is taken and the
        queue is full."""
        if self._slots.locked() and self.queued >= self.max_queued:
            ANSWERS_REJECTED.inc()
            raise Overloaded(
                f"the service is answering {self.in_flight} questions with {self.queued} waiting, its limit "
                f"(serve.max_in_flight {self.max_in_flight}, serve.max_queued {self.max_queued}); "
                f"try again in {self.retry_after_s:g} s", retry_after_s=self.retry_after_s)
        self.queued += 1
        ANSWERS_QUEUED.set(self.queued)
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1
            ANSWERS_QUEUED.set(self.queued)
        try:
            token = await self.global_slots.acquire() if self.global_slots is not None else None
        except BaseException:
            self._slots.release()
            raise
        self.in_flight += 1
        ANSWERS_IN_FLIGHT.set(self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1
            ANSWERS_IN_FLIGHT.set(self.in_flight)
            self._slots.release()
            if self.global_slots is not None:
                await self.global_slots.release(token)


def admission_for(settings: Settings) -> Admission | None:
    """The bound ``serve.max_in_flight`` and ``serve.max_queued`` ask for; ``None`` for no bound.

    ``auto``: as many answers at once as CPU cores when the generator runs in this process
    (the llamacpp model, the extractive answerer: more would only slow each down), 32 with a
    generator server; and a queue as deep as that. On 2 cores with the extractive generator
    this keeps the accepted answers' p99 within the unloaded p99 at 2x and 5x the sustainable
    rate, where 8 at once and 64 waiting made it 60x (``bench/RESULTS-overload.md``).
    """
    serve = settings.serve
    if serve.max_in_flight is None or serve.max_in_flight == 0:
        return None
    if serve.max_in_flight == "auto":
        remote = settings.generator.backend in REMOTE_GENERATORS
        in_flight = REMOTE_IN_FLIGHT if remote else max(1, os.cpu_count() or 1)
    else:
        in_flight = int(serve.max_in_flight)
    queued = in_flight if serve.max_queued == "auto" else int(serve.max_queued)
    shared = None
    if serve.max_in_flight_global is not None and serve.redis_url:
        shared = GlobalSlots(serve.redis_url, serve.max_in_flight_global, lease_s=serve.admission_lease_s,
                             retry_after_s=serve.retry_after_s)
    return Admission(in_flight, queued, serve.retry_after_s, shared)
