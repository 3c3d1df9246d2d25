"""Per-caller rate limits: a moving one-minute window, counted by the ``limits`` library.

Each API key has its own window (``serve.rate_limit_per_minute``, or the key's own
``rate_limit_per_minute``); with auth off each client address has one. The request past the
limit within any 60 s is refused with a 429 that has OpenAI's error shape (``type`` and
``code`` ``rate_limit_exceeded``) and ``Retry-After``: whole seconds until a slot frees.
A moving window rather than a fixed one, so a client cannot send twice its limit across a
minute boundary.

The counts live in ``serve.rate_limit_storage`` (default: ``serve.redis_url`` when set, else
memory): ``memory://`` keeps them in this process (so with several workers each counts on
its own), ``redis://host:6379/0`` (or ``rediss://``) shares them between workers and hosts
(the ``redis`` extra). When that Redis cannot be reached (0.5 s timeouts), each process
falls back to counting in its own memory, with the same limits, until Redis answers again
(tried again every second): requests are still limited, per worker rather than shared, and
``rate_limit_fallbacks_total`` counts the requests counted that way.

Example::

    limiter = RateLimiter("memory://")
    await limiter.check("key:alice", per_minute=60)   # the 61st call in a minute raises RateLimited
"""

from __future__ import annotations

import logging
import math
import time

from limits import RateLimitItemPerMinute
from limits.aio.strategies import MovingWindowRateLimiter
from limits.errors import ConfigurationError, StorageError
from limits.storage import storage_from_string
from limits.util import WindowStats
from prometheus_client import Counter

from rag.errors import BackendUnavailable, ConfigError
from rag.metrics import REGISTRY
from serve.errors import RateLimited

__all__ = ["RateLimiter"]

_NAMESPACE = "ragqa"
log = logging.getLogger("ragqa.serve")
RATE_LIMIT_FALLBACKS = Counter(
    "rate_limit_fallbacks", "Requests counted in this process's memory because the shared rate limit "
    "storage (Redis) was unreachable.", registry=REGISTRY)


class RateLimiter:
    """Counts requests per identity (``key:<id>`` or ``ip:<address>``) in a moving minute."""

    def __init__(self, storage_uri: str = "memory://") -> None:
        self.where = storage_uri.split("@")[-1]  # no password in messages
        self._pool = None
        options: dict[str, object] = {}
        if storage_uri.startswith("memory://"):
            uri = "async+memory://"
        elif storage_uri.startswith(("redis://", "rediss://")):
            try:
                import redis.asyncio
            except ImportError as exc:
                raise ConfigError(f"serve.rate_limit_storage {self.where}: needs the redis extra "
                                  "(pip install 'ragqa[redis]')") from exc
            # our own pool, so that shutdown can close its connections (limits has no close)
            self._pool = redis.asyncio.ConnectionPool.from_url(storage_uri, socket_timeout=0.5,
                                                               socket_connect_timeout=0.5)
            uri, options = f"async+{storage_uri}", {"implementation": "redispy", "connection_pool": self._pool}
        else:
            raise ConfigError(f"serve.rate_limit_storage: {self.where!r} is neither memory:// nor "
                              "redis://host:port/db")
        try:  # connects lazily: a Redis that is down shows on the first request, as a 503
            storage = storage_from_string(uri, wrap_exceptions=True, **options)  # type: ignore[arg-type]
        except ConfigurationError as exc:
            raise ConfigError(f"serve.rate_limit_storage {self.where}: {exc}") from exc
        self._limiter = MovingWindowRateLimiter(storage)
        self._local = self._limiter if self._pool is None else MovingWindowRateLimiter(
            storage_from_string("async+memory://"))
        self._retry_at = 0.0  # while Redis is down: when to try it again

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.disconnect()

    async def check(self, identity: str, per_minute: int) -> None:
        """Count one request of ``identity``; raise ``RateLimited`` past ``per_minute`` (0: no limit)."""
        if per_minute <= 0:
            return
        item = RateLimitItemPerMinute(per_minute)
        limiter = self._limiter if time.monotonic() >= self._retry_at else self._local
        try:
            stats = await _over(limiter, item, identity)
            if limiter is self._limiter and self._retry_at:
                log.warning("rate limit storage %s is back", self.where)
                self._retry_at = 0.0
        except StorageError as exc:
            if limiter is self._local:
                raise BackendUnavailable(f"rate limit storage {self.where} unavailable: {exc}") from exc
            if not self._retry_at:
                log.warning("rate limit storage %s unavailable, counting in this process: %s", self.where, exc)
            self._retry_at = time.monotonic() + 1.0
            limiter = self._local
            stats = await _over(limiter, item, identity)
        if limiter is self._local and self._pool is not None:
            RATE_LIMIT_FALLBACKS.inc()
        if stats is None:
            return
        retry_after = max(1, math.ceil(stats.reset_time - time.time()))
        raise RateLimited(
            f"rate limit reached: at most {per_minute} requests per minute; retry in {retry_after} s",
            "rate_limit_exceeded",
            headers={"Retry-After": str(retry_after), "x-ratelimit-limit-requests": str(per_minute),
                     "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": f"{retry_after}s"})


async def _over(limiter: MovingWindowRateLimiter, item: RateLimitItemPerMinute, identity: str) -> WindowStats | None:
    """Count one hit; the window's stats when it is over the limit, else ``None``."""
    if await limiter.hit(item, _NAMESPACE, identity):
        return None
    return await limiter.get_window_stats(item, _NAMESPACE, identity)
