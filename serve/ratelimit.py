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
(the ``redis`` extra). A storage that cannot be reached answers 503 rather than letting
every request through.

Example::

    limiter = RateLimiter("memory://")
    await limiter.check("key:alice", per_minute=60)   # the 61st call in a minute raises RateLimited
"""

from __future__ import annotations

import math
import time

from limits import RateLimitItemPerMinute
from limits.aio.strategies import MovingWindowRateLimiter
from limits.errors import ConfigurationError, StorageError
from limits.storage import storage_from_string

from rag.errors import BackendUnavailable, ConfigError
from serve.errors import RateLimited

__all__ = ["RateLimiter"]

_NAMESPACE = "ragqa"


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
            self._pool = redis.asyncio.ConnectionPool.from_url(storage_uri)
            uri, options = f"async+{storage_uri}", {"implementation": "redispy", "connection_pool": self._pool}
        else:
            raise ConfigError(f"serve.rate_limit_storage: {self.where!r} is neither memory:// nor "
                              "redis://host:port/db")
        try:  # connects lazily: a Redis that is down shows on the first request, as a 503
            storage = storage_from_string(uri, wrap_exceptions=True, **options)
        except ConfigurationError as exc:
            raise ConfigError(f"serve.rate_limit_storage {self.where}: {exc}") from exc
        self._limiter = MovingWindowRateLimiter(storage)

    async def aclose(self) -> None:
        if self._pool is not None:
            await self._pool.disconnect()

    async def check(self, identity: str, per_minute: int) -> None:
        """Count one request of ``identity``; raise ``RateLimited`` past ``per_minute`` (0: no limit)."""
        if per_minute <= 0:
            return
        item = RateLimitItemPerMinute(per_minute)
        try:
            if await self._limiter.hit(item, _NAMESPACE, identity):
                return
            stats = await self._limiter.get_window_stats(item, _NAMESPACE, identity)
        except StorageError as exc:
            raise BackendUnavailable(f"rate limit storage {self.where} unavailable: {exc}") from exc
        retry_after = max(1, math.ceil(stats.reset_time - time.time()))
        raise RateLimited(
            f"rate limit reached: at most {per_minute} requests per minute; retry in {retry_after} s",
            "rate_limit_exceeded",
            headers={"Retry-After": str(retry_after), "x-ratelimit-limit-requests": str(per_minute),
                     "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": f"{retry_after}s"})
